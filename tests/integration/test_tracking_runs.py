"""Experiment trackers on real runs: a short federation in this process with tracker = mlflow, and
one with tensorboard, read back with MLflow's client and TensorBoard's event reader, must hold
exactly the rounds of the run's metrics.jsonl; a failed run ends its MLflow run as FAILED; a run
without a tracker never imports one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import fedapp.inprocess
from fedapp.inprocess import run_in_process
from fedapp.metrics import read_metrics
from fedapp.tracking.mlflow import EXPERIMENT_NAME
from tests.paths import ROOT


def overrides(results_dir: Path, tracker: str) -> dict:
    return {
        "method": "fedavg",
        "dataset": "digits",
        "model": "cnn-5",
        "device": "cpu",
        "num-partitions": 3,
        "num-rounds": 2,
        "results-dir": str(results_dir),
        "run-name": "tracked",
        "tracker": tracker,
    }


def mlflow_runs(results_dir: Path) -> tuple[MlflowClient, list]:
    """The store a run without tracking-uri writes (results-dir/mlflow.db) and the runs in it."""
    client = MlflowClient(tracking_uri=f"sqlite:///{results_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT_NAME)
    return client, client.search_runs([experiment.experiment_id])


def test_an_mlflow_run_holds_the_runs_rounds_config_and_files(tmp_path):
    run_in_process(overrides(tmp_path, "mlflow"), record=True)
    rows = read_metrics(tmp_path / "tracked" / "metrics.jsonl")
    assert [row["round"] for row in rows] == [1, 2]

    client, runs = mlflow_runs(tmp_path)
    (run,) = runs
    assert (run.info.run_name, run.info.status) == ("tracked", "FINISHED")
    assert run.data.params["method"] == "fedavg" and run.data.params["num-partitions"] == "3"
    for name in ("acc_mean", "acc_worst", "global_acc", "train_loss", "mb_cumulative"):
        history = client.get_metric_history(run.info.run_id, name)
        assert [(m.step, m.value) for m in history] == [(row["round"], row[name]) for row in rows], name
    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "metrics.jsonl", "config.yaml", "accuracy_vs_round.png", "accuracy_vs_mb.png"} <= files
    assert "checkpoint.npz" not in files
    copy = Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path / "download")))
    assert copy.read_text() == (tmp_path / "tracked" / "summary.json").read_text()


def test_a_tensorboard_log_holds_the_runs_rounds(tmp_path):
    run_in_process(overrides(tmp_path, "tensorboard"), record=True)
    rows = read_metrics(tmp_path / "tracked" / "metrics.jsonl")
    events = EventAccumulator(str(tmp_path / "tracked" / "tensorboard"))
    events.Reload()
    for tag, name in (("accuracy/mean", "acc_mean"), ("accuracy/global", "global_acc"), ("loss/train", "train_loss")):
        # TensorBoard keeps a scalar in single precision.
        expected = [(row["round"], float(np.float32(row[name]))) for row in rows]
        assert [(e.step, e.value) for e in events.Scalars(tag)] == expected, tag
    assert not (tmp_path / "mlflow.db").exists()


def test_a_failed_run_ends_its_mlflow_run_as_failed(tmp_path, monkeypatch):
    def no_clients(overrides):
        raise RuntimeError("the clients could not be built")

    monkeypatch.setattr(fedapp.inprocess, "InProcessClients", no_clients)
    with pytest.raises(RuntimeError, match="could not be built"):
        run_in_process(overrides(tmp_path, "mlflow"), record=True)
    _, runs = mlflow_runs(tmp_path)
    assert [run.info.status for run in runs] == ["FAILED"]


def test_a_run_without_a_tracker_imports_none(tmp_path):
    script = (
        "import sys\n"
        "from fedapp.config import resolve_run_config\n"
        "from fedapp.server_app import build_strategy\n"
        "resolve_run_config({'tracker': 'mlflow'}); resolve_run_config({'tracker': 'tensorboard'})\n"
        f"strategy = build_strategy(resolve_run_config({{'results-dir': {str(tmp_path)!r}, 'num-partitions': 2}}))\n"
        "strategy.recorder.close()\n"
        "loaded = sorted(m for m in ('mlflow', 'tensorboard', 'torch.utils.tensorboard') if m in sys.modules)\n"
        "print('loaded:', loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("loaded: []")
