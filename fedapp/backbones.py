"""Backbones the project makes itself on first use: ``pretrained = "reserve"``.

An offline machine can download no pretrained weights, and a frozen random tower gives prompts
and heads almost nothing to work with: PEP-FedPT's digits preset stayed at chance on one. So the
CLIP methods' offline presets name ``pretrained = "reserve"``: their backbone is
pretrained contrastively (:func:`fedapp.pretrain.pretrain_clip`) on the run's
``reserve-pretrain`` share of its own source, which no client trains or tests on, made by the
first process that needs it and cached under ``cache-dir/pretrained/`` by its key (model config,
data digest, recipe, carve). Every later run with the same data, model and reserve loads the file.
The processes of one machine that need it at once wait for the first (a file lock), so it is made
once; the launcher and the sweep make it before Flower starts (:mod:`fedapp.launch.data_check`).
"""

from __future__ import annotations

import fcntl
import logging
import time
from pathlib import Path

from fedapp.data.arrays import ArrayDataset
from fedapp.errors import ModelError
from fedapp.pretrain import PretrainResult, PretrainSettings, cache_key_of, default_checkpoint, pretrain_clip

__all__ = ["RESERVE_RECIPE", "reserve_backbone"]

log = logging.getLogger("flwr.fedapp")

RESERVE_RECIPE = PretrainSettings(model_name="", epochs=40, batch_size=64, lr=5e-4, warmup_epochs=1.0)
"""The schedule of a reserve backbone (the model and the carve are the run's), chosen on the zero-shot
accuracy of the pretraining images held back for the training curve (measured 2026-12-07 on digits,
reserve-test 0.1, batch 64, 2 loaded CPUs): at reserve-pretrain 0.5, ``fedapp-tiny-clip`` 0.73 at lr
1e-3 for 30 epochs and 0.84 at 5e-4 for 40, ``fedapp-tiny-vit`` 0.93 at 5e-4 for 40; at 0.3, the tiny
ViT collapsed to chance at 1e-3 for 30 epochs (loss at ln 64 from epoch 2) and reached 0.20 at 3e-4
for 20. The chosen recipe then scored 0.84 (tiny CLIP) and 0.88 (tiny ViT) zero-shot on the reserve's
test part; it took 150 and 560 s there, beside other runs."""


def reserve_backbone(
    source: ArrayDataset,
    model_name: str,
    *,
    reserve_pretrain: float,
    reserve_test: float,
    reserve_seed: int,
    cache_dir: Path,
) -> PretrainResult:
    """The checkpoint of ``model_name`` pretrained on ``source``'s reserve (:data:`RESERVE_RECIPE`),
    made now when no process has made it yet, with the time it took logged.

    Raises
    ------
    ModelError
        If the reserve has no pretraining or no test share.
    """
    if reserve_pretrain <= 0 or reserve_test <= 0:
        raise ModelError(
            "a backbone pretrained on the reserve pretrains on the reserve-pretrain share of the data and scores on "
            "the reserve-test share: set both (e.g. reserve-pretrain=0.3 reserve-test=0.1)"
        )
    settings = PretrainSettings(
        **{
            **RESERVE_RECIPE.__dict__,
            "model_name": model_name,
            "reserve_pretrain": reserve_pretrain,
            "reserve_test": reserve_test,
            "reserve_seed": reserve_seed,
        }
    )
    out = default_checkpoint(cache_dir, model_name, cache_key_of(source, settings))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_name(out.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process making it: wait, then read its file
        started = time.monotonic()
        made = not out.exists()
        if made:
            log.info("pretraining %s on the reserve (first use; cached in %s) ...", model_name, out.parent)
        result = pretrain_clip(source, settings, out)
    if made:
        log.info(
            "pretrained %s in %.0f s: zero-shot accuracy %.3f on the reserve's test part",
            model_name,
            time.monotonic() - started,
            result.zero_shot_accuracy,
        )
    return result
