"""Checkpoints on their own: the round trip, every RNG restored, and each damaged or foreign
checkpoint refused (runs that stop and resume are in ``tests/integration/test_resume.py``)."""

from __future__ import annotations

import dataclasses
import json
import random
import zipfile

import numpy as np
import pytest
import torch

from fedapp.checkpoint import (
    ServerCheckpoint,
    check_resumable,
    check_state_shapes,
    load_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from fedapp.config import resolve_run_config
from fedapp.errors import StateError


def checkpoint(round_: int = 2, method: str = "fedavg") -> ServerCheckpoint:
    return ServerCheckpoint(
        round=round_,
        config=resolve_run_config({"method": method}).as_dict(),
        global_arrays=[np.arange(6, dtype=np.float32).reshape(2, 3), np.array([3], dtype=np.int64)],
        strategy_state={"generator.weight": np.ones((2, 2), np.float32)},
        totals={"mb_cumulative": 1.5, "params_cumulative": 12.0, "flops_cumulative": 7.0},
        records=[{"round": 1, "acc_mean": float("nan")}],
        rng=rng_state(),
    )


def test_checkpoint_round_trip(tmp_path):
    saved = checkpoint()
    loaded = load_checkpoint(save_checkpoint(tmp_path / "checkpoint.npz", saved))
    assert loaded.round == 2 and loaded.method == "fedavg" and loaded.config == saved.config
    for got, want in zip(loaded.global_arrays, saved.global_arrays, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(loaded.strategy_state["generator.weight"], saved.strategy_state["generator.weight"])
    assert loaded.totals == saved.totals
    assert np.isnan(loaded.records[0]["acc_mean"])
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.npz"]  # no temporary file left behind


def test_rng_state_restores_every_generator():
    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_bytes(b"not a zip file"), "corrupt or not a fedapp checkpoint"),
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "corrupt or not a fedapp checkpoint"),
        (lambda p: p.unlink(), "no checkpoint at"),
    ],
    ids=["garbage", "truncated", "missing"],
)
def test_damaged_checkpoint_is_refused(tmp_path, damage, message):
    path = save_checkpoint(tmp_path / "checkpoint.npz", checkpoint())
    damage(path)
    with pytest.raises(StateError, match=message):
        load_checkpoint(path)


def test_checkpoint_without_its_arrays_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.npz", checkpoint())
    with zipfile.ZipFile(path) as original, zipfile.ZipFile(tmp_path / "cut.npz", "w") as cut:
        for item in original.namelist():
            if item != "global/1.npy":
                cut.writestr(item, original.read(item))
    with pytest.raises(StateError, match="incomplete"):
        load_checkpoint(tmp_path / "cut.npz")


def test_checkpoint_of_another_method_or_other_settings_is_refused(tmp_path):
    path = tmp_path / "checkpoint.npz"
    with pytest.raises(StateError, match="belongs to method 'fedavg', not 'standalone'"):
        check_resumable(checkpoint(), resolve_run_config({"method": "standalone"}).as_dict(), path)
    with pytest.raises(StateError, match=r"lr: 0\.05 -> 0\.5"):
        check_resumable(checkpoint(), resolve_run_config({"method": "fedavg", "lr": 0.5}).as_dict(), path)
    # More rounds, another device or results folder: the same computation, carried on.
    check_resumable(checkpoint(), resolve_run_config({"num-rounds": 30, "resume": True}).as_dict(), path)


def with_meta(path, **changes):
    """Rewrite the checkpoint's JSON metadata (what a hand-edited or foreign file holds)."""
    with np.load(path, allow_pickle=False) as data:
        stored = {name: data[name] for name in data.files}
    meta = {**json.loads(bytes(stored.pop("meta")).decode()), **changes}
    stored["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **stored)


def with_array(path, name, value):
    with np.load(path, allow_pickle=False) as data:
        stored = {key: data[key] for key in data.files}
    np.savez(path, **{**stored, name: value})


FIELD_DAMAGE = {
    "NaN in a global array": (
        lambda p: with_array(p, "global/0", np.full((2, 3), np.nan, np.float32)),
        "array global/0 holds NaN or infinite values",
    ),
    "infinity in strategy state": (
        lambda p: with_array(p, "state/generator.weight", np.full((2, 2), np.inf, np.float32)),
        "array state/generator.weight holds NaN or infinite values",
    ),
    "text where numbers belong": (lambda p: with_array(p, "global/1", np.array(["x"])), "model arrays are numbers"),
    "negative round": (lambda p: with_meta(p, round=-1), "says -1 rounds completed"),
    "records past the round": (
        lambda p: with_meta(p, records=[{"round": 1}, {"round": 7}]),
        r"records rounds \[1, 7\]; expected increasing rounds in 1..2",
    ),
    "records out of order": (
        lambda p: with_meta(p, records=[{"round": 2}, {"round": 1}]),
        "expected increasing rounds",
    ),
    "negative total": (lambda p: with_meta(p, totals={"mb_cumulative": -1.0}), "negative or non-finite totals"),
    "unknown total": (lambda p: with_meta(p, totals={"bonus": 1.0}), "totals this version does not know: bonus"),
    "unknown field": (lambda p: with_meta(p, extra=1), "fields this version does not know: extra"),
    "unlisted array": (lambda p: with_array(p, "global/9", np.zeros(2)), "holds arrays it does not list: global/9"),
}


@pytest.mark.parametrize("damage", FIELD_DAMAGE)
def test_every_checkpoint_field_is_validated(tmp_path, damage):
    tamper, message = FIELD_DAMAGE[damage]
    path = save_checkpoint(tmp_path / "checkpoint.npz", checkpoint())
    tamper(path)
    with pytest.raises(StateError, match=message):
        load_checkpoint(path)


def test_a_checkpoint_past_the_runs_end_or_with_foreign_state_is_refused(tmp_path):
    path = tmp_path / "checkpoint.npz"
    with pytest.raises(StateError, match="completed 2 rounds, more than num-rounds = 1"):
        check_resumable(checkpoint(), resolve_run_config({"num-rounds": 1}).as_dict(), path)
    fresh = {"generator.weight": np.zeros((2, 2), np.float32)}
    check_state_shapes(checkpoint().strategy_state, fresh, path)
    wrong = dataclasses.replace(checkpoint(), strategy_state={"generator.weight": np.zeros((3, 2), np.float32)})
    with pytest.raises(StateError, match=r"generator\.weight has other shapes"):
        check_state_shapes(wrong.strategy_state, fresh, path)
    with pytest.raises(StateError, match=r"unknown \['other'\], missing \['generator.weight'\]"):
        check_state_shapes({"other": np.zeros(1)}, fresh, path)
