"""A recorded run shows what each client holds (partition.json, partition.png) and keeps every
client's accuracy per round (client_acc), end to end in this process (fedapp.inprocess)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from fedapp.clientdata import load_client_data, load_dataset
from fedapp.config import resolve_run_config
from fedapp.errors import StateError
from fedapp.inprocess import run_in_process
from fedapp.metrics import read_metrics
from fedapp.strategies import FedAvgStrategy
from tests.paths import ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_a_recorded_run_writes_what_each_client_holds_and_a_resume_keeps_it(tmp_path):
    overrides = {
        "method": "fedavg",
        "model": "cnn-5",
        "num-partitions": 3,
        "num-rounds": 1,
        "partition": "dirichlet",
        "alpha": 0.5,
        "results-dir": str(tmp_path),
        "run-name": "run",
    }
    run_in_process(overrides, record=True)
    folder = tmp_path / "run"
    summary = json.loads((folder / "partition.json").read_text())
    config = resolve_run_config(overrides)
    clients = [load_client_data(config, pid, 3) for pid in range(3)]

    # Per split, the counts add up to what the clients load, and together to the whole data set.
    for split in ("train", "val", "test"):
        assert summary["samples"][split] == sum(len(client.splits[split]) for client in clients)
    assert sum(summary["samples"].values()) == len(load_dataset(config))
    assert summary["settings"]["partition"] == "dirichlet" and summary["settings"]["alpha"] == 0.5
    for pid, client in enumerate(clients):
        for split, part in client.splits.items():
            counts = np.bincount(part.labels, minlength=client.num_classes)
            named = {client.class_names[c]: int(n) for c, n in enumerate(counts) if n}
            assert summary["clients"][str(pid)][split] == {"samples": len(part), "labels": named}
    assert (folder / "partition.png").read_bytes().startswith(PNG_MAGIC)

    # Every evaluated client's own accuracy, keyed by its partition id.
    (row,) = read_metrics(folder / "metrics.jsonl")
    assert list(row["client_acc"]) == ["0", "1", "2"]
    assert min(row["client_acc"].values()) == row["acc_worst"]

    # A resume of the run leaves partition.json as its first start wrote it.
    written = (folder / "partition.json").read_bytes()
    resumed = FedAvgStrategy.from_config(
        resolve_run_config({**overrides, "num-rounds": 2, "resume": True}), record=True
    )
    try:
        assert resumed.resume() == 1
    finally:
        resumed.recorder.close()
    assert (folder / "partition.json").read_bytes() == written

    # The results page names every file and folder the run left.
    page = (ROOT / "docs" / "results.md").read_text().split("## The run folder", 1)[1].split("\n## ", 1)[0]
    for entry in folder.iterdir():
        assert f"`{entry.name}{'/' if entry.is_dir() else ''}`" in page, entry.name


def _tiny_image_folder(root, per_class: int = 12):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def _small_run(tmp_path, partitions: int, name: str) -> dict:
    return {
        "dataset": "imagefolder",
        "data-dir": str(tmp_path / "images"),
        "model": "cnn-5",
        "image-size": 16,
        "partition": "dirichlet",
        "alpha": 1.0,
        "num-partitions": partitions,
        "min-clients": 1,
        "num-rounds": 1,
        "results-dir": str(tmp_path / "results"),
        "run-name": name,
    }


def test_a_split_too_small_for_its_test_share_is_named_before_round_1(tmp_path, caplog):
    """Issue 42: with 12 images a class a client got an empty test split; global_acc became NaN
    without a warning and summary.json held a bare NaN. Now the clients without test data are
    named before round 1 and count in no mean; a run in which no client could be tested ends
    with that error (a node's own data-dir may split differently, so it is not refused up front)."""
    _tiny_image_folder(tmp_path / "images")
    # Seed 0 splits the 24 images so that partition 0 of 3 gets no test image, 1 and 2 one each.
    strategy = run_in_process(_small_run(tmp_path, 3, "some"), record=True)
    untested = [r.getMessage() for r in caplog.records if "get no test data from this split" in r.getMessage()]
    assert len(untested) == 1 and untested[0].startswith("partition(s) 0 get no test data from this split: too few")
    record = strategy.history[-1]
    assert record.clients_evaluated == 2 and np.isfinite(record.acc_mean) and np.isfinite(record.global_acc)
    summary = (tmp_path / "results" / "some" / "summary.json").read_text()
    json.loads(summary, parse_constant=lambda constant: pytest.fail(f"{constant} in summary.json"))
    caplog.clear()
    with pytest.raises(StateError, match=r"no client was tested in any of the 1 rounds of none: every evaluated"):
        run_in_process(_small_run(tmp_path, 4, "none"), record=True)
    assert "(every client: the run will have no accuracy)" in caplog.text
    rows = (tmp_path / "results" / "none" / "metrics.jsonl").read_text()
    assert json.loads(rows, parse_constant=pytest.fail)["acc_mean"] is None
