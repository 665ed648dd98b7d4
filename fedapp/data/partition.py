"""Split a labelled dataset across clients with flwr-datasets' partitioners."""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedapp.data.arrays import save_npz_atomically
from fedapp.errors import DataError

if TYPE_CHECKING:  # flwr-datasets (and HF datasets, scipy, seaborn with it) take seconds to import
    from flwr_datasets.partitioner import Partitioner

log = logging.getLogger("flwr.fedapp")

PARTITIONS = ("iid", "dirichlet", "pathological", "shard", "domain")

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
    cache_dir: str | os.PathLike | None = None,
    domains: np.ndarray | None = None,
    clients_per_domain: int = 1,
) -> list[np.ndarray]:
    """Assign sample indices to ``num_partitions`` clients.

    A pure function of its arguments, cached in-process because every simulated
    client calls it with the same arguments, and with ``cache_dir`` also on disk:
    the ServerApp partitions once before round 1 and every simulation worker
    then reads the result instead of importing flwr-datasets and partitioning again.

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
    cache_dir : str or os.PathLike, optional
        Folder for ``partitions/<key>.npz`` files (written atomically; an
        unreadable one is recomputed). ``None`` keeps the cache in memory only.
    domains : np.ndarray, optional
        ``domain``: the domain id of every sample, shape ``(N,)``.
    clients_per_domain : int
        ``domain``: clients per domain; partition ``p`` holds data of domain
        ``p // clients_per_domain``, and a domain with several clients is split
        among them by Dirichlet over labels with ``alpha`` (as SDFed does).

    Returns
    -------
    list[np.ndarray]
        Per client, its sorted ``int64`` sample indices. Partitions are disjoint;
        ``iid``, ``dirichlet`` and ``domain`` cover every sample, ``pathological`` does when
        ``num_partitions + classes_per_client - 1 >= num_classes``, ``shard``
        drops the remainder of ``N / (num_partitions * shards_per_client)``.

    Raises
    ------
    DataError
        If an argument is out of range, the partitioner cannot satisfy it, or a
        client ends up with no samples.
    """
    label_array = _as_labels(labels)
    if scheme == "domain":
        return _domain_parts(
            label_array,
            domains,
            num_partitions,
            clients_per_domain,
            alpha=alpha,
            seed=seed,
            min_partition_size=min_partition_size,
            cache_dir=cache_dir,
        )
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
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    # Copies, so a caller that mutates its partition cannot corrupt the cache.
    return [part.copy() for part in parts]


def _domain_parts(
    labels: np.ndarray,
    domains: np.ndarray | None,
    num_partitions: int,
    clients_per_domain: int,
    *,
    alpha: float,
    seed: int,
    min_partition_size: int,
    cache_dir: str | os.PathLike | None,
) -> list[np.ndarray]:
    """Each client one domain; a domain's clients split it by Dirichlet over labels."""
    if domains is None:
        raise DataError("partition 'domain' needs a dataset with domains (dataset 'domains' or synthetic-domains)")
    domain_array = _as_labels(domains)
    if domain_array.shape != labels.shape:
        raise DataError(f"domains have shape {domain_array.shape}, labels {labels.shape}")
    if clients_per_domain < 1:
        raise DataError(f"clients_per_domain must be >= 1, got {clients_per_domain}")
    num_domains = int(domain_array.max()) + 1 if domain_array.size else 0
    if num_partitions != num_domains * clients_per_domain:
        raise DataError(
            f"partition 'domain' gives each of the {num_domains} domains {clients_per_domain} client(s), so it "
            f"needs num-partitions = {num_domains * clients_per_domain}, got {num_partitions}"
        )
    parts: list[np.ndarray] = []
    for domain in range(num_domains):
        members = np.flatnonzero(domain_array == domain)
        if len(members) < clients_per_domain:
            raise DataError(f"domain {domain} has {len(members)} samples, fewer than its {clients_per_domain} clients")
        if clients_per_domain == 1:
            parts.append(members.astype(np.int64))
            continue
        try:
            within = partition_indices(
                labels[members],
                clients_per_domain,
                "dirichlet",
                alpha=alpha,
                seed=seed + domain,
                min_partition_size=min_partition_size,
                cache_dir=cache_dir,
            )
        except DataError as err:
            raise DataError(f"splitting domain {domain} among {clients_per_domain} clients: {err}") from err
        parts.extend(members[part] for part in within)
    return parts


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
    cache_dir: str | None,
) -> tuple[np.ndarray, ...]:
    arguments = dict(
        alpha=alpha,
        classes_per_client=classes_per_client,
        shards_per_client=shards_per_client,
        seed=seed,
        min_partition_size=min_partition_size,
    )
    path = None
    if cache_dir is not None:
        path = _disk_path(Path(cache_dir), key, num_partitions, scheme, arguments)
        parts = _read_parts(path, num_partitions, len(key.labels))
        if parts is not None:
            return parts
    parts = _compute_parts(key, num_partitions, scheme, **arguments)
    if path is not None:
        _write_parts(path, parts)
    return parts


def _disk_path(cache_dir: Path, key: _LabelKey, num_partitions: int, scheme: str, arguments: dict) -> Path:
    # Everything the result depends on, including the partitioners' code.
    versions = []
    for package in ("flwr-datasets", "datasets"):
        try:
            versions.append(version(package))
        except PackageNotFoundError:
            versions.append("?")
    text = repr((key.digest, num_partitions, scheme, sorted(arguments.items()), PATHOLOGICAL_ASSIGNMENT, versions))
    return cache_dir / "partitions" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.npz"


def _read_parts(path: Path, num_partitions: int, num_samples: int) -> tuple[np.ndarray, ...] | None:
    """The cached partition, or None when absent or not a valid partition of these samples."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            indices, offsets = stored["indices"], stored["offsets"]
        parts = tuple(np.asarray(part, dtype=np.int64) for part in np.split(indices, offsets[1:-1]))
        valid = len(parts) == num_partitions and offsets[-1] == len(indices) and indices.max(initial=-1) < num_samples
    except (OSError, ValueError, KeyError, IndexError) as err:
        log.warning("partition cache %s is unreadable (%s); partitioning again", path, err)
        return None
    if not valid:
        log.warning("partition cache %s does not fit this data; partitioning again", path)
        return None
    for part in parts:
        part.setflags(write=False)
    return parts


def _write_parts(path: Path, parts: tuple[np.ndarray, ...]) -> None:
    """Store ``parts`` atomically (workers may race to write the same file); failures only log."""
    offsets = np.cumsum([0, *(len(part) for part in parts)], dtype=np.int64)
    indices = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    try:
        save_npz_atomically(path, indices=indices, offsets=offsets)
    except OSError as err:
        log.debug("could not cache the partition in %s: %s", path, err)


def _compute_parts(key: _LabelKey, num_partitions: int, scheme: str, **arguments: Any) -> tuple[np.ndarray, ...]:
    """Partition with flwr-datasets; ``arguments`` are :func:`_make_partitioner`'s keywords."""
    from datasets import Dataset  # noqa: PLC0415 - see the TYPE_CHECKING import above

    # IidPartitioner cuts contiguous blocks, so shuffle first (as FederatedDataset
    # does); the "idx" column maps rows back to the caller's indices.
    table = Dataset.from_dict({"label": key.labels, "idx": np.arange(len(key.labels))})
    table = table.shuffle(seed=arguments["seed"])
    partitioner = _make_partitioner(scheme, num_partitions, **arguments)
    partitioner.dataset = table
    parts = _run_partitioner(partitioner, num_partitions, scheme, arguments["alpha"])
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
