"""partition.json and partition.png: what each client holds, counted from exactly what it loads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
from matplotlib.patches import Rectangle

from fedapp.clientdata import load_client_data, load_dataset
from fedapp.config import PARTITION_KEYS, SCHEMA, held_out_partitions, partition_settings, resolve_run_config
from fedapp.data.partition_report import (
    FIGURE_CLIENTS,
    PARTITION_FIGURE,
    PARTITION_FILE,
    count_matrix,
    partition_figure,
    partition_summary,
    split_counts,
    write_partition_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class Labels:
    labels: np.ndarray


@dataclass
class FakeClient:
    splits: dict[str, Labels]
    class_names: tuple[str, ...] = ("cat", "dog", "eel")
    novel_class_names: tuple[str, ...] = field(default_factory=tuple)


def fake_loader(partition_id: int, num_partitions: int) -> FakeClient:
    """Client p holds p + 1 cats and 2 dogs to train on, 1 eel to test on."""
    assert num_partitions == 2
    return FakeClient(
        {
            "train": Labels(np.array([0] * (partition_id + 1) + [1, 1])),
            "val": Labels(np.array([], dtype=np.int64)),
            "test": Labels(np.array([2])),
        }
    )


def test_split_counts_name_the_classes_and_leave_out_absent_ones():
    counts = split_counts(fake_loader(1, 2))
    assert counts == {
        "train": {"samples": 4, "labels": {"cat": 2, "dog": 2}},
        "val": {"samples": 0, "labels": {}},
        "test": {"samples": 1, "labels": {"eel": 1}},
    }
    # Base-to-novel: the novel test split's labels count among the novel classes.
    novel = FakeClient({"test_novel": Labels(np.array([0, 0, 1]))}, ("a",), ("b", "c"))
    assert split_counts(novel)["test_novel"]["labels"] == {"b": 2, "c": 1}


def test_the_summary_records_settings_held_out_partitions_totals_and_every_client():
    config = resolve_run_config(
        {"num-partitions": 2, "partition": "pathological", "held-out-fraction": 0.5, "min-clients": 1}
    )
    held_out = held_out_partitions(config)
    summary = partition_summary(partition_settings(config.values), fake_loader, held_out)
    assert summary["settings"]["partition"] == "pathological" and summary["settings"]["num-partitions"] == 2
    assert summary["settings"]["classes-per-client"] == config.classes_per_client
    # How the class sets and the held-out clients are drawn decide what each client holds too.
    assert summary["settings"]["class-assignment"] == config.class_assignment
    assert summary["settings"]["held-out-draw"] == config.held_out_draw
    assert set(PARTITION_KEYS) <= set(SCHEMA) and set(summary["settings"]) == set(PARTITION_KEYS)
    assert len(held_out) == 1 and summary["held_out_partitions"] == sorted(held_out)
    assert summary["class_names"] == ["cat", "dog", "eel"]
    assert summary["samples"] == {"train": 3 + 4, "val": 0, "test": 2}
    assert list(summary["clients"]) == ["0", "1"]
    np.testing.assert_array_equal(count_matrix(summary, "train"), [[1, 2, 0], [2, 2, 0]])


def test_the_figure_stacks_each_clients_classes_per_split():
    config = resolve_run_config({"num-partitions": 2})
    figure = partition_figure(partition_summary(partition_settings(config.values), fake_loader))
    train, test = figure.axes
    assert (train.get_title(), test.get_title()) == ("train split", "test split")
    heights = [patch.get_height() for patch in train.patches if isinstance(patch, Rectangle)]
    assert heights == [1, 2, 2, 2, 0, 0]  # class by class: cats, dogs, eels of clients 0 and 1
    assert [text.get_text() for text in train.get_legend().get_texts()] == ["cat", "dog", "eel"]
    assert test.get_xlabel() == "client (partition id)"
    assert "2 clients" in figure.get_suptitle()


def test_the_figure_of_a_large_federation_draws_its_first_clients_and_says_so():
    clients = FIGURE_CLIENTS + 50
    summary = {
        "settings": {"dataset": "digits", "seed": 0},
        "held_out_partitions": [],
        "class_names": ["cat", "dog"],
        "clients": {str(p): {"train": {"samples": 1, "labels": {"cat": 1}}} for p in range(clients)},
    }
    figure = partition_figure(summary, splits=("train",))
    (train,) = figure.axes
    assert len(train.get_xticks()) == FIGURE_CLIENTS
    assert f"{clients} clients" in figure.get_suptitle()
    assert f"first {FIGURE_CLIENTS} shown" in figure.get_suptitle()


def test_counts_are_what_each_client_loads_and_add_up_to_the_data_set(tmp_path):
    config = resolve_run_config({"num-partitions": 3, "partition": "dirichlet", "alpha": 0.5})
    settings = partition_settings(config.values)
    written = write_partition_report(tmp_path, settings, lambda pid, n: load_client_data(config, pid, n))
    assert written == [tmp_path / PARTITION_FILE, tmp_path / PARTITION_FIGURE]
    summary = json.loads((tmp_path / PARTITION_FILE).read_text())
    source = load_dataset(config)
    assert sum(summary["samples"].values()) == len(source)  # every sample is some client's, once
    for pid in range(3):
        data = load_client_data(config, pid, 3)
        for split, part in data.splits.items():
            counted = summary["clients"][str(pid)][split]
            assert counted["samples"] == len(part)
            expected = np.bincount(part.labels, minlength=data.num_classes)
            assert counted["labels"] == {data.class_names[c]: int(n) for c, n in enumerate(expected) if n}
    assert (tmp_path / PARTITION_FIGURE).read_bytes().startswith(PNG_MAGIC)


def test_a_resumed_run_leaves_the_report_its_first_start_wrote(tmp_path):
    (tmp_path / PARTITION_FILE).write_text("first start\n")

    def never(pid: int, n: int):
        pytest.fail("a resumed run must not recount its partition")

    config = resolve_run_config({"num-partitions": 2, "resume": True})
    assert write_partition_report(tmp_path, partition_settings(config.values), never, resume=config.resume) == []
    assert (tmp_path / PARTITION_FILE).read_text() == "first start\n"
