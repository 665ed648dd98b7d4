"""``pretrained = "reserve"``: a CLIP pretrained on the run's own reserve share, made by the first
process that needs it, cached by its key and loaded by every later one (issue 67). The recipe is
cut to one epoch here (its schedule is data; what is tested is who makes it, where, and once)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from fedapp import backbones
from fedapp.clientdata import clip_weights
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError
from fedapp.models import load_open_clip

RESERVE_RUN = {"pretrained": "reserve", "reserve-pretrain": 0.3, "reserve-test": 0.1, "method": "promptfl"}


@pytest.fixture
def one_epoch(monkeypatch):
    monkeypatch.setattr(backbones, "RESERVE_RECIPE", replace(backbones.RESERVE_RECIPE, epochs=1, batch_size=64))
    calls = []
    made = backbones.pretrain_clip

    def counted(*args, **kwargs):
        result = made(*args, **kwargs)
        calls.append(result.cached)
        return result

    monkeypatch.setattr(backbones, "pretrain_clip", counted)
    return calls


def test_the_backbone_is_made_once_cached_by_its_key_and_loads(one_epoch, tmp_path):
    config = resolve_run_config({**RESERVE_RUN, "cache-dir": str(tmp_path / "cache")})
    results = []
    threads = [threading.Thread(target=lambda: results.append(clip_weights(config, "fedapp-tiny-clip"))) for _ in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (path,) = set(results)  # both got the same file; the second waited for the first and read it
    assert one_epoch == [False, True]
    assert path.startswith(str(tmp_path / "cache" / "pretrained" / "fedapp-tiny-clip-"))
    assert clip_weights(config, "fedapp-tiny-clip") == path
    clip = load_open_clip("fedapp-tiny-clip", path)
    assert clip.pretrained == path
    # Another reserve is another backbone; a run that does not ask for one loads what it names.
    other = resolve_run_config({**RESERVE_RUN, "reserve-pretrain": 0.4, "cache-dir": str(tmp_path / "cache")})
    assert clip_weights(other, "fedapp-tiny-clip") != path
    assert clip_weights(resolve_run_config({"method": "promptfl"}), "fedapp-tiny-clip") == ""


def test_a_reserve_backbone_needs_both_reserve_shares():
    for missing in ({"reserve-pretrain": 0.0}, {"reserve-test": 0.0}):
        with pytest.raises(ConfigError, match=r"'pretrained' = 'reserve' pretrains the backbone .* set both"):
            resolve_run_config({**RESERVE_RUN, **missing})
