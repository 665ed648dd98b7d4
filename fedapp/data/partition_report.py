"""What each client of a run holds: per client (partition id) its train/val/test sample and
label counts, with the settings that made the partition (``partition.json``), and the same
counts as a label-distribution figure (``partition.png``), written into the run folder when a
recorded run starts (:func:`write_partition_report`).

The counts are of exactly what each client loads: the caller hands over a loader of one
client's data (:func:`fedapp.clientdata.load_client_data`, a module above this package),
whose splits' labels are counted. The images were decoded once already by the server's data
check; nothing here decodes more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedapp.data.figures import label_distribution_figure, partition_text, save_figure
from fedapp.jsonfile import dumps_json

log = logging.getLogger("flwr.fedapp")

if TYPE_CHECKING:  # annotations only: matplotlib is imported when a figure is drawn
    from matplotlib.figure import Figure

PARTITION_FILE = "partition.json"
PARTITION_FIGURE = "partition.png"

#: The most clients the figure draws (the first ones by partition id).
FIGURE_CLIENTS = 100

#: The splits the figure shows (validation is in partition.json only).
FIGURE_SPLITS = ("train", "test")


class LabelledSplit(Protocol):
    """One split of a client's data: its labels (:class:`fedapp.clientdata.LabelledImages`)."""

    @property
    def labels(self) -> np.ndarray: ...


class ClientSplits(Protocol):
    """What is counted of one client's data (:class:`fedapp.clientdata.ClientData`)."""

    @property
    def splits(self) -> Mapping[str, LabelledSplit]: ...

    @property
    def class_names(self) -> tuple[str, ...]: ...

    @property
    def novel_class_names(self) -> tuple[str, ...]: ...


def split_counts(client: ClientSplits) -> dict[str, dict[str, Any]]:
    """Per split, its sample count and its label counts by class name (classes it lacks left out).

    The ``test_novel`` split (base-to-novel) counts the novel classes, the others the client's own.
    """
    counts: dict[str, dict[str, Any]] = {}
    for split, part in client.splits.items():
        names = client.novel_class_names if split == "test_novel" else client.class_names
        per_class = np.bincount(np.asarray(part.labels, dtype=np.int64), minlength=len(names))
        labels = {names[index]: int(count) for index, count in enumerate(per_class) if count}
        counts[split] = {"samples": int(per_class.sum()), "labels": labels}
    return counts


def partition_summary(
    settings: Mapping[str, Any], load_client: Callable[[int, int], ClientSplits], held_out: Collection[int] = ()
) -> dict[str, Any]:
    """What ``partition.json`` holds: the partition's ``settings`` (by config name, with
    ``num-partitions``: :func:`fedapp.config.partition_settings` of a run configuration), the class
    names, the held-out partitions (``held_out``: :func:`fedapp.config.held_out_partitions`), per
    split the samples over all clients, and per client (partition id, a string) its :func:`split_counts`.

    ``load_client(partition_id, num_partitions)`` gives that client's data as the client itself
    loads it (:func:`fedapp.clientdata.load_client_data` with the run's configuration bound).
    """
    clients: dict[str, dict[str, dict[str, Any]]] = {}
    class_names: list[str] = []
    num_partitions = int(settings["num-partitions"])
    for partition_id in range(num_partitions):
        client = load_client(partition_id, num_partitions)
        class_names = class_names or [*client.class_names, *client.novel_class_names]
        clients[str(partition_id)] = split_counts(client)
    totals: dict[str, int] = {}
    for splits in clients.values():
        for split, counted in splits.items():
            totals[split] = totals.get(split, 0) + counted["samples"]
    return {
        "settings": dict(settings),
        "class_names": class_names,
        "held_out_partitions": sorted(held_out),
        "samples": totals,
        "clients": clients,
    }


def count_matrix(summary: Mapping[str, Any], split: str) -> np.ndarray:
    """``(clients, classes)`` counts of ``split`` from a :func:`partition_summary`, classes in its order."""
    column = {name: index for index, name in enumerate(summary["class_names"])}
    clients = summary["clients"]
    matrix = np.zeros((len(clients), len(column)), dtype=np.int64)
    for row, splits in enumerate(clients.values()):
        for name, count in splits.get(split, {}).get("labels", {}).items():
            matrix[row, column[name]] = count
    return matrix


def partition_figure(summary: Mapping[str, Any], splits: Sequence[str] = FIGURE_SPLITS) -> Figure:
    """The label distribution of ``splits`` (:func:`fedapp.data.figures.label_distribution_figure`)."""
    settings = summary["settings"]
    held = summary["held_out_partitions"]
    title = ", ".join(
        part
        for part in (
            str(settings.get("dataset", "")),
            partition_text(settings),
            f"{len(summary['clients'])} clients",
            f"seed {settings['seed']}" if "seed" in settings else "",
            f"held out: {', '.join(map(str, held))}" if held else "",
        )
        if part
    )
    counts = {split: count_matrix(summary, split) for split in splits}
    clients = [int(p) for p in summary["clients"]]
    if len(clients) > FIGURE_CLIENTS:
        # Thousands of bars neither draw quickly nor read; partition.json has every client.
        counts = {split: matrix[:FIGURE_CLIENTS] for split, matrix in counts.items()}
        clients = clients[:FIGURE_CLIENTS]
        title += f" (first {FIGURE_CLIENTS} shown)"
    return label_distribution_figure(counts, summary["class_names"], clients, title)


def write_partition_report(
    directory: Path,
    settings: Mapping[str, Any],
    load_client: Callable[[int, int], ClientSplits],
    held_out: Collection[int] = (),
    *,
    resume: bool = False,
) -> list[Path]:
    """Write ``partition.json`` and ``partition.png`` (:func:`partition_summary`) into the run
    folder ``directory``; returns the files written.

    A resumed run (``resume``) writes nothing: its first start wrote them, no partition setting may change
    on resume (:data:`fedapp.checkpoint.RESUMABLE_CHANGES`), so they would be rewritten
    identically, and a resume its checkpoint refuses must leave the folder as it was.
    """
    if resume:
        return []
    return write_partition_files(directory, partition_summary(settings, load_client, held_out))


def write_partition_files(directory: Path, summary: Mapping[str, Any]) -> list[Path]:
    """Write a :func:`partition_summary` as ``partition.json`` and ``partition.png`` in ``directory``."""
    path = directory / PARTITION_FILE
    path.write_text(dumps_json(summary, indent=2) + "\n")
    return [path, save_figure(partition_figure(summary), directory / PARTITION_FIGURE)]


def check_test_splits(summary: Mapping[str, Any]) -> list[int]:
    """Before round 1, warn naming the partitions whose test split is empty: they will count in
    no accuracy mean (if none has test data, the run ends with that error). A node that reads
    its own ``data-dir`` splits its own data, which this summary of the server's copy cannot see.

    Returns
    -------
    list[int]
        The partitions without test data.
    """
    untested = untested_partitions(summary)
    if untested:
        every = " (every client: the run will have no accuracy)" if len(untested) == len(summary["clients"]) else ""
        log.warning(
            "partition(s) %s get no test data from this split%s: too few samples for the test share, so they "
            "count in no accuracy mean; use fewer clients, a larger test share (local-split), a test pool "
            "(reserve-test or test-data-dir) or more data",
            ", ".join(map(str, untested)),
            every,
        )
    return untested


def untested_partitions(summary: Mapping[str, Any]) -> list[int]:
    """The partitions of a :func:`partition_summary` whose test split is empty."""
    clients = summary["clients"]
    return [int(pid) for pid, splits in clients.items() if not splits.get("test", {}).get("samples", 0)]
