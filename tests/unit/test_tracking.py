"""Experiment trackers (fedapp.tracking): an MLflow run in a real SQLite store and TensorBoard event
files, each read back with the tracker's own reader; the missing-package error; tracker = none."""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError, StateError
from fedapp.extras import check_server_extras
from fedapp.flower.recording import open_recorder
from fedapp.launch.settings import prepare_run
from fedapp.metrics import RoundRecord
from fedapp.server_app import build_strategy
from fedapp.tracking import open_tracker
from fedapp.tracking.mlflow import RESUMED_WITH_TAG, RUN_FOLDER_TAG, MlflowTracker
from fedapp.tracking.scalars import round_scalars
from fedapp.tracking.tensorboard import TensorBoardTracker
from tests.unit.records import round_record


def record(round_: int, acc: float, *, global_acc: float | None = 0.5) -> RoundRecord:
    """A round's record with every kind of field the trackers meet: numbers, None, a list, a flag,
    per-domain and per-client mappings."""
    return round_record(
        round_,
        acc_mean=acc,
        acc_worst=acc - 0.1,
        acc_std=0.05,
        clients_evaluated=3,
        global_acc=global_acc,
        train_loss=2.0 / round_,
        clients_fit=3,
        bytes_up_per_client=100.0,
        bytes_down_per_client=100.0,
        bytes_round_total=600,
        mb_cumulative=0.25 * round_,
        round_seconds=1.5,
        extra={
            "left_out_reasons": ["client 2: too slow"],
            "round_skipped": False,
            "eval_loss": 0.7,
            "domain_acc": {"photo": 0.6, "art painting": 0.4},
            "client_acc": {"0": 0.3, "1": 0.5, "2": 0.7},
        },
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """One results-dir, hence one MLflow database, for the module (creating one takes seconds);
    each test writes runs of its own names."""
    return tmp_path_factory.mktemp("results")


def float32(value: float) -> float:
    """``value`` as TensorBoard stores a scalar (single precision)."""
    return float(np.float32(value))


def config(results_dir: Path, name: str = "run", **keys):
    return resolve_run_config({"results-dir": str(results_dir), "run-name": name, **keys})


def run_folder(results_dir: Path, name: str = "run") -> Path:
    folder = results_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def result_files(folder: Path) -> list[Path]:
    """A finished run's files, as RunRecorder.finish hands them over (models/ in a subfolder)."""
    (folder / "models").mkdir(exist_ok=True)
    for name in ("summary.json", "metrics.jsonl", "accuracy_vs_round.png", "checkpoint.npz", "models/global.bin"):
        (folder / name).write_text(name)
    return sorted(p for p in folder.rglob("*") if p.is_file())


def store(results_dir: Path) -> MlflowClient:
    """A reader of the store a run with no tracking-uri writes: results-dir/mlflow.db."""
    return MlflowClient(tracking_uri=f"sqlite:///{results_dir / 'mlflow.db'}")


def test_round_scalars_are_the_records_numbers_with_mappings_flattened():
    scalars = round_scalars(record(2, 0.8))
    assert scalars["acc_mean"] == 0.8
    assert scalars["global_acc"] == 0.5
    assert scalars["train_loss"] == 1.0
    assert scalars["mb_cumulative"] == 0.5
    assert scalars["clients_fit"] == 3.0
    assert scalars["eval_loss"] == 0.7
    assert scalars["domain_acc/photo"] == 0.6
    assert scalars["domain_acc/art painting"] == 0.4
    assert "round" not in scalars  # it is the step
    assert not {"left_out_reasons", "round_skipped", "client_acc"} & set(scalars)
    assert not any(name.startswith("client_acc") for name in scalars)
    assert "global_acc" not in round_scalars(record(2, 0.8, global_acc=None))


def test_mlflow_logs_the_config_every_round_and_the_files_into_results_dir(results, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root would be ./mlruns here
    run_config = config(results, "logged", tracker="mlflow", **{"num-rounds": 2, "lr": 0.05})
    folder = run_folder(results, "logged")
    tracker = open_tracker(run_config, folder)
    assert isinstance(tracker, MlflowTracker)
    tracker.log_round(record(1, 0.6))
    tracker.log_round(record(2, float("nan"), global_acc=None))
    tracker.log_files(result_files(folder))

    client = store(results)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "logged"
    assert run.data.tags[RUN_FOLDER_TAG] == str(folder.resolve())
    assert run.data.params == {
        key: ("true" if value is True else "false" if value is False else str(value))
        for key, value in run_config.as_dict().items()
    }
    assert run.data.params["num-rounds"] == "2" and run.data.params["lr"] == "0.05"
    acc = client.get_metric_history(tracker.run_id, "acc_mean")
    assert [m.step for m in acc] == [1, 2]
    assert acc[0].value == 0.6 and math.isnan(acc[1].value)
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "global_acc")] == [(1, 0.5)]
    assert [m.value for m in client.get_metric_history(tracker.run_id, "train_loss")] == [2.0, 1.0]
    assert [m.value for m in client.get_metric_history(tracker.run_id, "domain_acc/photo")] == [0.6, 0.6]
    top = {f.path for f in client.list_artifacts(tracker.run_id)}
    assert top == {"summary.json", "metrics.jsonl", "accuracy_vs_round.png", "models"}  # no checkpoint.npz
    assert [f.path for f in client.list_artifacts(tracker.run_id, "models")] == ["models/global.bin"]
    summary = Path(client.download_artifacts(tracker.run_id, "summary.json", str(tmp_path)))
    assert summary.read_text() == "summary.json"
    assert run.info.artifact_uri.startswith((results / "mlartifacts").as_uri())
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # nothing but the download here
    assert {"mlflow.db", "mlartifacts", "logged"} <= {p.name for p in results.iterdir()}


def test_a_run_closed_before_its_end_is_failed_and_closing_twice_is_harmless(results):
    tracker = open_tracker(config(results, "stopped", tracker="mlflow"), run_folder(results, "stopped"))
    tracker.log_round(record(1, 0.6))
    tracker.close()
    tracker.close()
    assert store(results).get_run(tracker.run_id).info.status == "FAILED"


@pytest.mark.parametrize("name", ["resumed", "it's resumed"])
def test_a_resumed_run_continues_its_mlflow_run(results, name):
    folder = run_folder(results, name)
    first = open_tracker(config(results, name, tracker="mlflow", **{"num-rounds": 3}), folder)
    first.log_round(record(1, 0.6))
    first.close()  # the run stopped after round 1

    other = open_tracker(config(results, f"not {name}", tracker="mlflow"), run_folder(results, f"not {name}"))
    resumed = open_tracker(config(results, name, tracker="mlflow", resume=True, **{"num-rounds": 4}), folder)
    assert resumed.run_id == first.run_id != other.run_id
    client = store(results)
    assert client.get_run(first.run_id).info.status == "FAILED"  # until a round runs again
    resumed.log_round(record(2, 0.7))
    assert client.get_run(first.run_id).info.status == "RUNNING"
    resumed.log_files(result_files(folder))
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, "acc_mean")] == [(1, 0.6), (2, 0.7)]
    assert run.data.params["num-rounds"] == "3"  # MLflow params never change: the change is a tag
    assert run.data.tags[RESUMED_WITH_TAG] == "num-rounds=4, resume=true"


def test_a_resume_with_nothing_left_to_run_leaves_the_finished_run_as_it_was(results):
    folder = run_folder(results, "complete")
    first = open_tracker(config(results, "complete", tracker="mlflow"), folder)
    first.log_round(record(1, 0.6))
    first.log_files(result_files(folder))
    again = open_tracker(config(results, "complete", tracker="mlflow", resume=True), folder)
    assert again.run_id == first.run_id
    again.close()
    assert store(results).get_run(first.run_id).info.status == "FINISHED"


def test_a_store_failing_mid_run_costs_a_warning_not_the_run(results, monkeypatch, caplog):
    tracker = open_tracker(config(results, "unreachable", tracker="mlflow"), run_folder(results, "unreachable"))

    def unreachable(*args, **kwargs):
        raise MlflowException("API request failed: connection refused")

    monkeypatch.setattr(tracker.client, "log_batch", unreachable)
    with caplog.at_level(logging.WARNING, logger="flwr.fedapp"):
        tracker.log_round(record(1, 0.6))
    assert "mlflow: could not log round 1 (API request failed: connection refused)" in caplog.text


def test_an_unusable_tracking_uri_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'tracking-uri' = 'foo://bar': MLflow cannot open a run at foo"):
        open_tracker(config(tmp_path, tracker="mlflow", **{"tracking-uri": "foo://bar"}), run_folder(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_a_given_tracking_uri_is_used_and_results_dir_is_not(results, tmp_path):
    uri = f"sqlite:///{results / 'mlflow.db'}"
    given = config(tmp_path / "elsewhere", "given", tracker="mlflow", **{"tracking-uri": uri})
    tracker = open_tracker(given, run_folder(tmp_path, "given"))
    tracker.close()
    assert MlflowClient(tracking_uri=uri).get_run(tracker.run_id).info.run_name == "given"
    assert [p.name for p in tmp_path.iterdir()] == ["given"]


def test_tensorboard_writes_each_round_and_the_config(tmp_path):
    run_config = config(tmp_path, tracker="tensorboard", **{"num-rounds": 2})
    folder = run_folder(tmp_path)
    tracker = open_tracker(run_config, folder)
    assert isinstance(tracker, TensorBoardTracker)
    tracker.log_round(record(1, 0.6))
    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()  # flushed with the round, before the run ends
    assert [(e.step, e.value) for e in events.Scalars("accuracy/mean")] == [(1, float32(0.6))]
    tracker.log_round(record(2, 0.8, global_acc=None))
    tracker.log_files(result_files(folder))
    tracker.close()

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"accuracy/mean", "accuracy/worst", "loss/train", "communication/mb_cumulative"} <= scalars
    assert {"accuracy/domain/photo", "metrics/eval_loss"} <= scalars
    assert not any("client_acc" in tag for tag in scalars)
    assert [(e.step, e.value) for e in events.Scalars("accuracy/mean")] == [(1, float32(0.6)), (2, float32(0.8))]
    assert [e.step for e in events.Scalars("accuracy/global")] == [1]  # None in round 2
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| num-rounds | 2 |" in text and "| tracker | tensorboard |" in text


def test_tracker_none_opens_nothing(tmp_path):
    assert open_tracker(config(tmp_path), run_folder(tmp_path)) is None
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert list((tmp_path / "run").iterdir()) == []


@pytest.mark.parametrize("tracker", ["mlflow", "tensorboard"])
def test_a_missing_tracker_package_is_refused_by_the_server_side_only(tracker, monkeypatch, tmp_path):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == tracker else find_spec(name, *a))
    with pytest.raises(
        ConfigError,
        match=rf"^config key 'tracker' = '{tracker}' needs {tracker}, which this install lacks: "
        r"pip install 'fedapp\[tracking\]' \(or -e '\.\[tracking\]' in a checkout\)$",
    ):
        prepare_run({"tracker": tracker})  # the launcher, before anything starts
    with pytest.raises(ConfigError, match=f"needs {tracker}, which this install lacks"):
        build_strategy(resolve_run_config({"tracker": tracker, "results-dir": str(tmp_path)}))
    assert not any(tmp_path.iterdir())  # refused before the run folder or the data
    # Clients run the same config rules: an edge device without the extra accepts the run.
    assert resolve_run_config({"tracker": tracker}).tracker == tracker
    check_server_extras(resolve_run_config({"tracker": "none"}))


def test_the_recorder_feeds_its_tracker_and_a_refused_folder_opens_no_run(results):
    run_config = config(results, "recorded", tracker="mlflow")
    recorder = open_recorder(run_config, [])
    (tracker,) = recorder.observers
    assert isinstance(tracker, MlflowTracker)
    recorder.add(record(1, 0.6))
    recorder.close()
    client = store(results)
    assert [m.value for m in client.get_metric_history(tracker.run_id, "acc_mean")] == [0.6]
    assert client.get_run(tracker.run_id).info.status == "FAILED"  # closed before its last round

    experiment = client.get_run(tracker.run_id).info.experiment_id
    runs = len(client.search_runs([experiment]))
    with pytest.raises(StateError, match="already holds a run"):
        open_recorder(run_config, [])  # a fresh run into a folder with results
    assert len(client.search_runs([experiment])) == runs
