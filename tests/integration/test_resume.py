"""Exact resume and determinism, end to end in Ray simulations.

A run "stopped after round 2 of 4" is the real ServerApp whose Flower loop
ends after 3 rounds while its configuration still says 6: the state on disk
is then what a killed server leaves (the checkpoint is rewritten after every
round), and ``resume=true`` must finish it with the metrics of a run that was
never interrupted.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from flwr.server import ServerApp, ServerConfig

from fedapp.checkpoint import load_checkpoint
from fedapp.client_app import make_client_app
from fedapp.config import resolve_run_config
from fedapp.errors import StateError
from fedapp.inprocess import run_in_process
from fedapp.metrics import read_metrics
from fedapp.server_app import server_components
from tests import simulation
from tests.simulation import BACKEND

TIMINGS = {"round_seconds"}


def run_config(tmp_path, name: str, **overrides) -> dict:
    return {
        "results-dir": str(tmp_path / name),
        "state-dir": str(tmp_path / name / "client-state"),
        "run-name": "run",
        "num-partitions": 4,
        "batch-size": 32,
        **overrides,
    }


def simulate(tmp_path, name: str, stop_after: int | None = None, **overrides) -> list[dict]:
    """Run the project's ServerApp (Flower's loop cut at ``stop_after`` rounds, if given); return metrics."""
    overrides = run_config(tmp_path, name, **overrides)

    def server_fn(context):
        components = server_components(resolve_run_config({**context.run_config, **overrides}))
        if stop_after is not None:
            components.config = ServerConfig(num_rounds=stop_after)
        return components

    simulation.simulate(
        ServerApp(server_fn=server_fn), make_client_app(overrides), num_supernodes=4, backend_config=BACKEND
    )
    return read_metrics(tmp_path / name / overrides["run-name"] / "metrics.jsonl")


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in rows]


FEDAVG = {
    "method": "fedavg",
    "model": "cnn-5",
    "num-rounds": 4,
    "fraction-fit": 0.5,
    "min-clients": 2,
    "shots-per-class": 10,
}


@pytest.fixture(scope="module")
def fedavg_uninterrupted(tmp_path_factory):
    return simulate(tmp_path_factory.mktemp("fedavg"), "whole", **FEDAVG)


def test_same_seed_gives_identical_metrics(tmp_path, fedavg_uninterrupted):
    again = simulate(tmp_path, "again", **FEDAVG)
    assert [r["round"] for r in again] == list(range(1, 5))
    assert without_timings(again) == without_timings(fedavg_uninterrupted)
    # Half the clients train each round: which half depends on (seed, round) only.
    assert {r["clients_fit"] for r in again} == {2}
    other_seed = simulate(tmp_path, "seed-1", **{**FEDAVG, "num-rounds": 1, "seed": 1})
    assert without_timings(other_seed) != without_timings(fedavg_uninterrupted[:1])


def test_fedavg_stopped_after_round_2_resumes_to_the_same_metrics(tmp_path, fedavg_uninterrupted):
    first = simulate(tmp_path, "stopped", stop_after=2, **FEDAVG)
    assert [r["round"] for r in first] == [1, 2]
    assert load_checkpoint(tmp_path / "stopped" / "run" / "checkpoint.npz").round == 2
    resumed = simulate(tmp_path, "stopped", resume=True, **FEDAVG)
    assert without_timings(resumed) == without_timings(fedavg_uninterrupted)
    summary = json.loads((tmp_path / "stopped" / "run" / "summary.json").read_text())
    assert summary["rounds"] == 4 and summary["final_acc_mean"] == fedavg_uninterrupted[-1]["acc_mean"]


def test_fedd2p_resume_restores_the_generator_and_client_state(tmp_path):
    """FedD2P's server trains a prompt generator (strategy state) and its clients keep
    personal CNNs (on disk): both must carry over for the metrics to match."""
    config = {
        "method": "fedd2p",
        "num-rounds": 3,
        "client-models": "vgg-2,vgg-3",
        "d2p-steps": 5,
        "shots-per-class": 5,
        "state": "disk",
    }
    whole = simulate(tmp_path, "whole", **config)
    simulate(tmp_path, "stopped", stop_after=2, **config)
    saved = load_checkpoint(tmp_path / "stopped" / "run" / "checkpoint.npz")
    assert saved.round == 2 and any(name.startswith("generator.") for name in saved.strategy_state)
    resumed = simulate(tmp_path, "stopped", resume=True, **config)
    assert without_timings(resumed) == without_timings(whole)


def test_resume_with_other_settings_stops_before_any_round(tmp_path):
    simulate(tmp_path, "run", stop_after=1, **{**FEDAVG, "num-rounds": 3})
    before = (tmp_path / "run" / "run" / "metrics.jsonl").read_text()
    overrides = run_config(tmp_path, "run", **{**FEDAVG, "num-rounds": 3, "resume": True})
    with pytest.raises(StateError, match=r"other settings \(lr: 0\.05 -> 0\.5\)"):
        server_components(resolve_run_config({**overrides, "lr": 0.5}))
    with pytest.raises(StateError, match="belongs to method 'fedavg', not 'standalone'"):
        server_components(resolve_run_config({**overrides, "method": "standalone", "state": "disk"}))
    # Nothing was lost: the stopped run's metrics are untouched.
    assert (tmp_path / "run" / "run" / "metrics.jsonl").read_text() == before


def test_personal_state_is_its_runs_a_rerun_starts_afresh_and_continuing_an_earlier_run_is_explicit(tmp_path):
    """The nodes' state-dir outlives runs: a new run under the same name (here with another
    results folder) must not train on from the personal models the earlier run left."""
    nodes = tmp_path / "node-state"
    standalone = {"method": "standalone", "model": "cnn-5", "num-rounds": 1, "state": "disk", "state-dir": str(nodes)}
    first = simulate(tmp_path, "first", **standalone)
    rerun = simulate(tmp_path, "rerun", **standalone)
    assert without_timings(rerun) == without_timings(first)  # afresh, exactly as the first run began
    first_summary = json.loads((tmp_path / "first" / "run" / "summary.json").read_text())
    assert first_summary["global_state_from"] == "initialisation (seed 0)"
    assert first_summary["personal_state_from"] == "this run's own"
    aside = sorted(path.name for path in (nodes / "run").iterdir() if ".run-" in path.name)
    # Nothing lost: every client's state from the first run is kept beside the folder, named by its token.
    assert aside == [f"partition-{i}.run-{first_summary['run_token']}" for i in range(4)]

    continued = simulate(tmp_path, "continued", **standalone, **{"run-name": "next", "personal-state-from": "run"})
    assert continued[0]["acc_mean"] > first[0]["acc_mean"]  # round 1 trains on from the first run's round
    summary = json.loads((tmp_path / "continued" / "next" / "summary.json").read_text())
    assert summary["personal_state_from"] == "run 'run', copied on each node"
    record = json.loads((nodes / "next" / "partition-0" / "run.json").read_text())
    assert record == {"run-token": summary["run_token"], "continued-from": "run"}


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs (root only): one cnn-5 checkpoint (about 2.5 MB) fits, a second beside it does not."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def disk_run(disk, name: str, rounds: int) -> dict:
    """A small run whose results go on ``disk``."""
    return {
        "num-partitions": 2, "num-rounds": rounds, "model": "cnn-5", "min-clients": 1, "export-models": False,
        "results-dir": str(disk / "results"), "run-name": name,
    }  # fmt: skip


def test_a_full_disk_ends_the_run_naming_the_folder_and_resume_continues_it(small_disk):
    """Issue 42: a full disk ended the run with ``OSError: [Errno 28]`` and no path; now the error
    names the run folder, the last checkpoint is intact, and ``resume=true`` finishes the run."""
    base = disk_run(small_disk, "full", rounds=4)
    folder = small_disk / "results" / "full"
    with pytest.raises(StateError) as error:
        run_in_process(base, record=True)
    assert str(error.value).startswith(f"cannot write run folder {folder} after round 2: No space left on device")
    assert f"its checkpoint of round 1 ({folder / 'checkpoint.npz'}) is intact" in str(error.value)
    assert "resume=true" in str(error.value)
    assert load_checkpoint(folder / "checkpoint.npz").round == 1  # the last one written, whole
    subprocess.run(["mount", "-o", "remount,size=40m", str(small_disk)], check=True)
    resumed = run_in_process({**base, "resume": True}, record=True)
    assert [record.round for record in resumed.history] == [1, 2, 3, 4]
    assert [row["round"] for row in read_metrics(folder / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_disk_too_full_for_the_first_checkpoint_says_there_is_nothing_to_resume(small_disk):
    """Issue 63: the message said the last round's checkpoint was intact and to resume, but no
    checkpoint.npz existed (resume then said "no checkpoint"); it now says what the disk holds."""
    subprocess.run(["mount", "-o", "remount,size=1m", str(small_disk)], check=True)
    base = disk_run(small_disk, "tiny", rounds=2)
    folder = small_disk / "results" / "tiny"
    with pytest.raises(StateError) as error:
        run_in_process(base, record=True)
    message = str(error.value)
    assert message.startswith(f"cannot write run folder {folder} after round 1")
    assert f"it has no readable checkpoint ({folder / 'checkpoint.npz'})" in message and "resume=true" not in message
    assert not (folder / "checkpoint.npz").exists()
