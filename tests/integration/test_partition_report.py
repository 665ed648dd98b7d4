"""A recorded run shows what each client holds (partition.json, partition.png) and keeps every
client's accuracy per round (client_acc), end to end in this process (fedapp.inprocess)."""

from __future__ import annotations

import json

import numpy as np

from fedapp.clientdata import load_client_data, load_dataset
from fedapp.config import resolve_run_config
from fedapp.inprocess import run_in_process
from fedapp.metrics import read_metrics
from strategies import FedAvgStrategy
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
