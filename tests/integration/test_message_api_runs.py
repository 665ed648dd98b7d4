"""Every method on Flower's Message API: the same run as on the legacy API, metric for metric.

Every method runs with a held-out client (the sampler asks each node its partition with a
``query`` message) on a grid in this process whose nodes are our ClientApp, against the legacy
path's in-process driver: every figure of every round's record is the same. One method of each family runs in a Ray
simulation through our own ServerApp and ClientApp with ``api = message`` against the same driver
(the ClientApp's message path is the same for every method but for the client it builds), a Ray
simulation with ``api = legacy`` against it once, and client-side DP runs on the Message API.
(Loopback SuperNodes: tests/system/test_deployment.py.)
"""

from __future__ import annotations

import pytest

from fedapp.client_app import make_client_app
from fedapp.config import METHODS, resolve_run_config
from fedapp.dp import epsilon
from fedapp.flower.message_api import MessageStrategy
from fedapp.inprocess import run_in_process
from fedapp.metrics import read_metrics
from fedapp.server_app import make_server_app
from tests.message_grid import InProcessGrid, run_on_message_api
from tests.simulation import simulate
from tests.unit.test_protocols import METHOD_SETTINGS

pytestmark = pytest.mark.usefixtures("task_identity")

# Four clients, one held out (evaluated where the method serves a new client), a few images each.
HELD_OUT = {
    "num-partitions": 4,
    "held-out-fraction": 0.25,
    "num-rounds": 2,
    "shots-per-class": 3,
    "batch-size": 16,
    "min-clients": 2,
}

# What a round's record says about what was computed and sent (not its timing).
COMPARED = (
    "acc_mean",
    "acc_worst",
    "acc_std",
    "clients_evaluated",
    "global_acc",
    "train_loss",
    "clients_fit",
    "clients_failed",
    "bytes_round_total",
    "params_round_total",
    "train_flops_round",
)
# Per-round extras that are timings or that depend on the process, not on the run.
UNCOMPARED_EXTRAS = {"server_seconds"}


def assert_same_rounds(ours, theirs) -> None:
    assert [r.round for r in ours] == [r.round for r in theirs]
    for mine, legacy in zip(ours, theirs, strict=True):
        for name in COMPARED:
            assert getattr(mine, name) == getattr(legacy, name), (mine.round, name)
        extras = set(mine.extra) - UNCOMPARED_EXTRAS
        assert extras == set(legacy.extra) - UNCOMPARED_EXTRAS
        assert {k: mine.extra[k] for k in extras} == {k: legacy.extra[k] for k in extras}, mine.round


@pytest.mark.parametrize("method", METHODS)
def test_every_method_through_our_client_app_on_a_grid_equals_its_legacy_run(method):
    """Flower's ``Strategy.start`` over :class:`MessageStrategy`, message by message in this
    process, every node our ClientApp with a context of its own (as a simulation's worker calls
    it), for every method (a held-out client among the four): every figure of every round's
    record, extras included (no client left out), and Flower's ``Result``."""
    overrides = {"method": method, **HELD_OUT, **METHOD_SETTINGS[method]}
    legacy = run_in_process(overrides).history
    grid = InProcessGrid({**overrides, "api": "message"}, client_app=make_client_app({**overrides, "api": "message"}))
    strategy, result = run_on_message_api({**overrides, "api": "message"}, grid)
    assert_same_rounds(strategy.strategy.history, legacy)
    assert [r.extra["left_out_reasons"] for r in legacy] == [[], []]
    rounds = range(1, HELD_OUT["num-rounds"] + 1)
    assert [result.evaluate_metrics_clientapp[r]["acc_mean"] for r in rounds] == [r.acc_mean for r in legacy]


def test_a_resumed_run_numbers_its_rounds_after_the_checkpoint(tmp_path):
    overrides = {
        "method": "fedavg",
        "model": "cnn-1",
        "num-partitions": 2,
        "num-rounds": 1,
        "batch-size": 32,
        "results-dir": str(tmp_path),
        "run-name": "run",
    }
    run_on_message_api(overrides, record=True)
    resumed_config = resolve_run_config({**overrides, "num-rounds": 2, "resume": True})
    resumed = MessageStrategy.from_config(resumed_config, record=True)
    assert resumed.resume() == 1 and resumed.rounds_left() == 1
    grid = InProcessGrid(overrides)
    resumed.start(grid=grid, initial_arrays=resumed.initial_arrays(), num_rounds=resumed.rounds_left())
    resumed.strategy.recorder.close()
    assert {m.metadata.group_id for m in grid.sent} == {"2"}
    assert [row["round"] for row in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2]


SIMULATED = {"num-partitions": 3, "num-rounds": 2, "batch-size": 32, "shots-per-class": 4}


def simulated(tmp_path, api: str, **overrides):
    overrides = {"results-dir": str(tmp_path / api), "run-name": "run", **SIMULATED, "api": api, **overrides}
    simulate(make_server_app(overrides), make_client_app(overrides), num_supernodes=overrides["num-partitions"])
    return read_metrics(tmp_path / api / "run" / "metrics.jsonl")


SIMULATION_COMPARED = ("acc_mean", "acc_worst", "train_loss", "clients_fit", "bytes_round_total", "params_round_total")


def assert_same_as_in_process(rows: list[dict], settings: dict) -> None:
    legacy = run_in_process({**SIMULATED, **settings, "api": "legacy"}).history
    assert [row["round"] for row in rows] == [1, 2]
    for ours, theirs in zip(rows, legacy, strict=True):
        assert {k: ours[k] for k in SIMULATION_COMPARED} == {k: getattr(theirs, k) for k in SIMULATION_COMPARED}


@pytest.mark.parametrize("method", ["pfedlora", "sdfed", "fedd2p", "pep-fedpt"])
def test_one_method_per_family_on_the_message_api_in_simulation_equals_its_legacy_run(tmp_path, method):
    """Our ServerApp and ClientApp on the Message API in a Ray simulation give the legacy path's
    figures: the in-process driver's, which a Ray simulation on the legacy API equals (below)."""
    settings = {"method": method, **METHOD_SETTINGS[method], "seed": 4}
    assert_same_as_in_process(simulated(tmp_path, "message", **settings), settings)


def test_a_ray_simulation_on_the_legacy_api_equals_the_in_process_driver(tmp_path):
    settings = {"method": "pfedlora", **METHOD_SETTINGS["pfedlora"], "seed": 4}
    assert_same_as_in_process(simulated(tmp_path, "legacy", **settings), settings)


def test_client_side_dp_clips_on_the_message_api(tmp_path):
    rows = simulated(
        tmp_path,
        "message",
        method="fedavg",
        model="cnn-1",
        **{"num-partitions": 2, "dp": "client", "dp-noise-multiplier": 0.3, "dp-clipping-norm": 0.05},
    )
    # An unclipped update (far longer than 0.05 after a round of training) would have been left out.
    assert rows[0]["clients_fit"] == 2
    assert not any("exceeds the clipping norm" in reason for r in rows for reason in r["left_out_reasons"])
    assert [r["dp_epsilon"] for r in rows] == pytest.approx([epsilon(1.0, 0.3, t, 1e-5) for t in (1, 2)])
