"""flwr-datasets' partitioners behind :func:`fedapp.data.partition.partition_indices`.

The label-based schemes (``iid``, ``dirichlet``, ``pathological``, ``shard``)
are computed here on a shuffled table of ``label`` and ``idx`` columns; the
``idx`` column maps rows back to the caller's sample indices. flwr-datasets
(with HF datasets, scipy and seaborn) takes seconds to import, so it is
imported only when a partition is actually computed.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from fedapp.errors import DataError

if TYPE_CHECKING:  # flwr-datasets (and HF datasets, scipy, seaborn with it) take seconds to import
    from flwr_datasets.partitioner import Partitioner

__all__ = ["CLASS_ASSIGNMENTS", "compute_parts", "make_partitioner"]

log = logging.getLogger("flwr.fedapp")

# flwr-datasets' class_assignment_mode of the pathological scheme. "first-deterministic"
# gives partition i the class i (mod C) and draws its other classes with the seed, so
# every class has a client once num_partitions >= C and the seed varies the class sets
# (as the usual protocol draws them per run); "random" draws all of them (a class may go
# unused, its samples dropped); "deterministic" gives partition i the classes
# i, i+1, ..., i+k-1 (mod C) under every seed.
CLASS_ASSIGNMENTS = ("first-deterministic", "random", "deterministic")


def compute_parts(labels: np.ndarray, num_partitions: int, scheme: str, **arguments: Any) -> tuple[np.ndarray, ...]:
    """Partition sample indices with flwr-datasets.

    Parameters
    ----------
    labels : np.ndarray
        Checked ``int64`` labels, shape ``(N,)``.
    num_partitions : int
        Number of clients.
    scheme : str
        ``iid``, ``dirichlet``, ``pathological`` or ``shard``.
    **arguments
        :func:`make_partitioner`'s keywords (``alpha``, ``classes_per_client``,
        ``shards_per_client``, ``seed``, ``min_partition_size``, ``class_assignment``).

    Returns
    -------
    tuple[np.ndarray, ...]
        Per client, its sorted read-only ``int64`` sample indices.

    Raises
    ------
    DataError
        If the partitioner fails or a client gets no samples.
    """
    from datasets import Dataset  # noqa: PLC0415 - see the TYPE_CHECKING import above

    # IidPartitioner cuts contiguous blocks, so shuffle first (as FederatedDataset
    # does); the "idx" column maps rows back to the caller's indices.
    table = Dataset.from_dict({"label": labels, "idx": np.arange(len(labels))})
    table = table.shuffle(seed=arguments["seed"])
    partitioner = make_partitioner(scheme, num_partitions, **arguments)
    partitioner.dataset = table
    parts = _run_partitioner(partitioner, num_partitions, scheme, arguments["alpha"])
    _check_non_empty(parts, scheme)
    if scheme == "pathological":
        _warn_unused_classes(labels, parts, arguments.get("class_assignment", CLASS_ASSIGNMENTS[0]))
    for part in parts:
        part.setflags(write=False)
    return tuple(parts)


def make_partitioner(
    scheme: str,
    num_partitions: int,
    *,
    alpha: float,
    classes_per_client: int,
    shards_per_client: int,
    seed: int,
    min_partition_size: int,
    class_assignment: str = CLASS_ASSIGNMENTS[0],
) -> Partitioner:
    """The flwr-datasets partitioner of ``scheme``, seeded; its dataset is set by the caller.

    Parameters
    ----------
    scheme : str
        ``iid``, ``dirichlet``, ``pathological`` or ``shard``.
    num_partitions : int
        Number of clients.
    alpha, classes_per_client, shards_per_client, seed, min_partition_size, class_assignment
        As in :func:`fedapp.data.partition.partition_indices`.

    Returns
    -------
    Partitioner
        An unloaded partitioner over a ``label`` column.
    """
    from flwr_datasets.partitioner import (  # noqa: PLC0415 - see the TYPE_CHECKING import above
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
    )

    if scheme == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if scheme == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=alpha,
            min_partition_size=min_partition_size,
            self_balancing=False,
            seed=seed,
        )
    if scheme == "pathological":
        return PathologicalPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            num_classes_per_partition=classes_per_client,
            class_assignment_mode=class_assignment,
            seed=seed,
        )
    return ShardPartitioner(
        num_partitions=num_partitions, partition_by="label", num_shards_per_partition=shards_per_client, seed=seed
    )


def _run_partitioner(partitioner: Partitioner, num_partitions: int, scheme: str, alpha: float) -> list[np.ndarray]:
    try:
        with warnings.catch_warnings():
            # Dirichlet resampling is the intended way to reach min_partition_size;
            # its per-attempt warning is noise. Failure still raises below.
            warnings.filterwarnings("ignore", message="The specified min_partition_size")
            # datasets' sort (shard) trips a pyarrow deprecation we cannot act on.
            warnings.filterwarnings("ignore", message="Specifying null_placement", category=FutureWarning)
            # Its advice names an argument of its own; _warn_unused_classes says it in our keys.
            warnings.filterwarnings("ignore", message="Classes: .* will NOT be used", category=UserWarning)
            return [
                np.sort(np.asarray(partitioner.load_partition(pid)["idx"], dtype=np.int64))
                for pid in range(num_partitions)
            ]
    except ValueError as exc:
        hint = (
            f" (alpha={alpha}): use fewer clients or a larger alpha" if scheme == "dirichlet" else ": use fewer clients"
        )
        raise DataError(
            f"{scheme} partitioning into {num_partitions} clients failed{hint}. flwr-datasets said: {exc}"
        ) from exc


def _warn_unused_classes(labels: np.ndarray, parts: list[np.ndarray], class_assignment: str) -> None:
    unused = sorted(set(np.unique(labels).tolist()) - set(np.unique(labels[np.concatenate(parts)]).tolist()))
    if unused:
        log.warning(
            "class-assignment = %s gave no client the classes %s: their samples are not used "
            "(first-deterministic gives every class a client when there are at least as many clients as classes)",
            class_assignment,
            unused,
        )


def _check_non_empty(parts: list[np.ndarray], scheme: str) -> None:
    for pid, part in enumerate(parts):
        if len(part) == 0:
            raise DataError(
                f"partition {pid} of {len(parts)} got zero samples under "
                f"scheme {scheme!r}; use fewer clients (num_partitions) or "
                f"a larger alpha"
            )
