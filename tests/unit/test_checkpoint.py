"""Checkpoints on their own: the round trip, every RNG restored, and each damaged or foreign
checkpoint refused (runs that stop and resume are in ``tests/integration/test_resume.py``)."""

from __future__ import annotations

import random
import zipfile

import numpy as np
import pytest
import torch

from fedapp.checkpoint import (
    ServerCheckpoint,
    check_resumable,
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
