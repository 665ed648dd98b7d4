"""fedapp.flower.resume on its own: where the checkpoint lives, a written checkpoint read back
as the point to resume from, and every reason a checkpoint does not fit this run."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fedapp.checkpoint import load_checkpoint, restore_rng_state, save_checkpoint
from fedapp.config import resolve_run_config
from fedapp.errors import StateError
from fedapp.flower.recording import RunTotals
from fedapp.flower.resume import checkpoint_path_of, read_resume_point, write_checkpoint
from fedapp.metrics import RoundRecord, RunRecorder
from tests.unit.records import round_record

ARRAYS = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([3], dtype=np.int64)]
STATE = {"generator.weight": np.ones((2, 2), np.float32)}


def config(**overrides):
    return resolve_run_config({"method": "fedavg", "num-rounds": 5, **overrides})


def record(server_round: int) -> RoundRecord:
    return round_record(
        server_round,
        acc_mean=0.5 + server_round / 10,
        clients_evaluated=2,
        clients_fit=2,
        bytes_up_per_client=10.0,
        bytes_down_per_client=10.0,
        bytes_round_total=40,
        mb_cumulative=0.1 * server_round,
        extra={"left_out_reasons": []},
    )


def written(tmp_path, cfg=None, arrays=ARRAYS, state=STATE):
    path = tmp_path / "run" / "checkpoint.npz"
    totals = RunTotals(1.5, 0.25, 12, 7)
    return write_checkpoint(path, 2, cfg or config(), arrays, state, totals, [record(1), record(2)])


def fresh(arrays=ARRAYS, state=STATE):
    """The method's hooks: what it builds, with the same shapes and dtypes."""
    return (lambda: [np.zeros_like(a) for a in arrays]), (lambda: {k: np.zeros_like(v) for k, v in state.items()})


def test_the_checkpoint_lives_in_the_results_folder(tmp_path):
    assert checkpoint_path_of(None) is None
    recorder = RunRecorder(tmp_path, "run", {}, 0.8)
    try:
        assert checkpoint_path_of(recorder) == tmp_path / "run" / "checkpoint.npz"
    finally:
        recorder.close()


def test_a_written_checkpoint_is_the_point_to_resume_from(tmp_path):
    random.seed(11)
    path = written(tmp_path)
    expected_draw = random.random()
    random.seed(99)
    point = read_resume_point(path, config(**{"num-rounds": 8}), *fresh())  # more rounds: allowed
    assert point.round == 2
    for got, want in zip(point.global_arrays, ARRAYS, strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
    np.testing.assert_array_equal(point.strategy_state["generator.weight"], STATE["generator.weight"])
    assert point.totals == RunTotals(1.5, 0.25, 12, 7)
    assert point.history == [record(1), record(2)]
    # The generators' states at writing time come back with it (the strategy restores them last).
    restore_rng_state(point.rng)
    assert random.random() == expected_draw


def test_resume_without_a_results_folder_is_refused_before_anything_is_built():
    def never():
        raise AssertionError("built before the checkpoint was read")

    with pytest.raises(StateError, match="resume needs a results folder"):
        read_resume_point(None, config(), never, never)


def test_a_missing_checkpoint_is_refused_before_anything_is_built(tmp_path):
    def never():
        raise AssertionError("built before the checkpoint was read")

    with pytest.raises(StateError, match="no checkpoint at"):
        read_resume_point(tmp_path / "checkpoint.npz", config(), never, never)


def test_a_checkpoint_under_other_settings_is_refused(tmp_path):
    path = written(tmp_path)
    with pytest.raises(StateError, match="other settings"):
        read_resume_point(path, config(lr=0.5), *fresh())
    with pytest.raises(StateError, match="more than num-rounds = 1"):
        read_resume_point(path, config(**{"num-rounds": 1}), *fresh())


def test_global_arrays_of_other_shapes_or_dtypes_are_refused(tmp_path):
    path = written(tmp_path)
    wider = [np.zeros((2, 4), np.float32), ARRAYS[1]]
    with pytest.raises(StateError, match="global arrays of other shapes"):
        read_resume_point(path, config(), *fresh(arrays=wider))
    doubles = [ARRAYS[0].astype(np.float64), ARRAYS[1]]
    with pytest.raises(StateError, match="global arrays of other shapes"):
        read_resume_point(path, config(), *fresh(arrays=doubles))


def test_strategy_state_of_other_names_or_shapes_is_refused(tmp_path):
    path = written(tmp_path)
    with pytest.raises(StateError, match=r"strategy state generator\.weight has other shapes"):
        read_resume_point(path, config(), *fresh(state={"generator.weight": np.ones(3, np.float32)}))
    with pytest.raises(StateError, match="missing"):
        read_resume_point(path, config(), *fresh(state={**STATE, "other": np.ones(1)}))


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda row: {**row, "from_the_future": 1}, "has from_the_future"),
        (lambda row: {k: v for k, v in row.items() if k != "acc_worst"}, "lacks acc_worst"),
    ],
    ids=["an extra field", "a missing field"],
)
def test_a_record_this_version_cannot_read_is_refused_naming_the_checkpoint_and_round(tmp_path, change, said):
    """Issue 63: a checkpoint record with an extra key gave ``TypeError: RoundRecord.__init__() got an
    unexpected keyword argument`` without naming the file."""
    path = written(tmp_path)
    checkpoint = load_checkpoint(path)
    checkpoint.records[1] = change(checkpoint.records[1])
    save_checkpoint(path, checkpoint)
    with pytest.raises(StateError, match=rf"checkpoint {path}: the record of round 2 {said}, which a round record"):
        read_resume_point(path, config(), *fresh())
