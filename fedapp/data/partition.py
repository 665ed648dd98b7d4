"""Split a labelled dataset across clients with flwr-datasets' partitioners."""

from __future__ import annotations

import functools
import hashlib
import math
import warnings

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import (
    DirichletPartitioner,
    IidPartitioner,
    Partitioner,
    PathologicalPartitioner,
    ShardPartitioner,
)

from fedapp.errors import DataError

PARTITIONS = ("iid", "dirichlet", "pathological", "shard")

# "deterministic" gives partition i the classes i, i+1, ..., i+k-1 (mod C): every
# class is used as soon as num_partitions + k - 1 >= C, and class usage is
# balanced. The seed still decides which samples of a class go where.
PATHOLOGICAL_ASSIGNMENT = "deterministic"
# Cap of the automatic Dirichlet minimum partition size.
_DIRICHLET_MIN_SIZE_CAP = 10


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str,
    *,
    alpha: float = 0.3,
    classes_per_client: int = 2,
    shards_per_client: int = 2,
    seed: int = 0,
    min_partition_size: int = 0,
) -> list[np.ndarray]:
    """Assign sample indices to ``num_partitions`` clients.

    A pure function of its arguments, cached in-process because every simulated
    client calls it with the same arguments.

    Parameters
    ----------
    labels : np.ndarray
        Integer class label of every sample, shape ``(N,)``.
    num_partitions : int
        Number of clients, ``1 <= num_partitions <= N``.
    scheme : str
        One of :data:`PARTITIONS`.
    alpha : float
        ``dirichlet``: concentration; smaller is more skewed.
    classes_per_client : int
        ``pathological``: distinct classes per client.
    shards_per_client : int
        ``shard``: label-sorted shards per client.
    seed : int
        Seed of the shuffle and of the partitioner.
    min_partition_size : int
        ``dirichlet``: smallest acceptable client; flwr-datasets resamples until
        every client has it. ``0`` means ``max(1, min(10, N // num_partitions // 2))``.

    Returns
    -------
    list[np.ndarray]
        Per client, its sorted ``int64`` sample indices. Partitions are disjoint;
        ``iid`` and ``dirichlet`` cover every sample, ``pathological`` does when
        ``num_partitions + classes_per_client - 1 >= num_classes``, ``shard``
        drops the remainder of ``N / (num_partitions * shards_per_client)``.

    Raises
    ------
    DataError
        If an argument is out of range, the partitioner cannot satisfy it, or a
        client ends up with no samples.
    """
    label_array = _as_labels(labels)
    _check_arguments(
        label_array,
        num_partitions,
        scheme,
        alpha=alpha,
        classes_per_client=classes_per_client,
        shards_per_client=shards_per_client,
        min_partition_size=min_partition_size,
    )
    if scheme == "dirichlet" and min_partition_size == 0:
        min_partition_size = max(1, min(_DIRICHLET_MIN_SIZE_CAP, len(label_array) // num_partitions // 2))
    parts = _partition_cached(
        _LabelKey(label_array),
        int(num_partitions),
        scheme,
        alpha=float(alpha),
        classes_per_client=int(classes_per_client),
        shards_per_client=int(shards_per_client),
        seed=int(seed),
        min_partition_size=int(min_partition_size),
    )
    # Copies, so a caller that mutates its partition cannot corrupt the cache.
    return [part.copy() for part in parts]


class _LabelKey:
    """Hashable stand-in for a label array: equal when the contents are equal."""

    __slots__ = ("digest", "labels")

    def __init__(self, labels: np.ndarray) -> None:
        self.labels = labels
        self.digest = hashlib.sha256(labels.tobytes()).hexdigest()

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _LabelKey) and self.digest == other.digest


def _as_labels(labels: np.ndarray) -> np.ndarray:
    array = np.asarray(labels)
    if array.ndim != 1:
        raise DataError(f"labels must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"labels must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=True)
    array.setflags(write=False)
    return array


def _check_arguments(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str,
    *,
    alpha: float,
    classes_per_client: int,
    shards_per_client: int,
    min_partition_size: int,
) -> None:
    if scheme not in PARTITIONS:
        raise DataError(f"unknown partition scheme {scheme!r}; valid: {', '.join(PARTITIONS)}")
    if not 1 <= num_partitions <= len(labels):
        raise DataError(
            f"num_partitions must be between 1 and the number of samples ({len(labels)}), got {num_partitions}"
        )
    if min_partition_size < 0:
        raise DataError(f"min_partition_size must be >= 0, got {min_partition_size}")
    if scheme == "dirichlet" and not (math.isfinite(alpha) and alpha > 0):
        raise DataError(f"dirichlet alpha must be a positive number, got {alpha}")
    if scheme == "pathological":
        distinct = len(np.unique(labels))
        if not 1 <= classes_per_client <= distinct:
            raise DataError(
                f"classes_per_client must be between 1 and the number of "
                f"distinct labels ({distinct}), got {classes_per_client}"
            )
    if scheme == "shard":
        if shards_per_client < 1:
            raise DataError(f"shards_per_client must be >= 1, got {shards_per_client}")
        if num_partitions * shards_per_client > len(labels):
            raise DataError(
                f"{num_partitions} clients x {shards_per_client} shards "
                f"exceed the {len(labels)} samples; use fewer clients or "
                f"fewer shards per client"
            )


@functools.lru_cache(maxsize=32)
def _partition_cached(
    key: _LabelKey,
    num_partitions: int,
    scheme: str,
    *,
    alpha: float,
    classes_per_client: int,
    shards_per_client: int,
    seed: int,
    min_partition_size: int,
) -> tuple[np.ndarray, ...]:
    # IidPartitioner cuts contiguous blocks, so shuffle first (as FederatedDataset
    # does); the "idx" column maps rows back to the caller's indices.
    table = Dataset.from_dict({"label": key.labels, "idx": np.arange(len(key.labels))})
    table = table.shuffle(seed=seed)
    partitioner = _make_partitioner(
        scheme,
        num_partitions,
        alpha=alpha,
        classes_per_client=classes_per_client,
        shards_per_client=shards_per_client,
        seed=seed,
        min_partition_size=min_partition_size,
    )
    partitioner.dataset = table
    parts = _run_partitioner(partitioner, num_partitions, scheme, alpha)
    _check_non_empty(parts, scheme)
    for part in parts:
        part.setflags(write=False)
    return tuple(parts)


def _make_partitioner(
    scheme: str,
    num_partitions: int,
    *,
    alpha: float,
    classes_per_client: int,
    shards_per_client: int,
    seed: int,
    min_partition_size: int,
) -> Partitioner:
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
            class_assignment_mode=PATHOLOGICAL_ASSIGNMENT,
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


def _check_non_empty(parts: list[np.ndarray], scheme: str) -> None:
    for pid, part in enumerate(parts):
        if len(part) == 0:
            raise DataError(
                f"partition {pid} of {len(parts)} got zero samples under "
                f"scheme {scheme!r}; use fewer clients (num_partitions) or "
                f"a larger alpha"
            )
