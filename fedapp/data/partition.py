"""Split a labelled dataset across clients: the partition schemes and their caches.

The schemes (:data:`PARTITIONS`), with the keywords of :func:`partition_indices`
each reads and the samples it covers:

* ``iid``: equal shares of a shuffle; covers every sample;
* ``dirichlet``: each class shared out by Dirichlet(``alpha``) proportions (smaller
  is more skewed), redrawn until every client holds ``min_partition_size``
  samples; covers every sample;
* ``pathological``: ``classes_per_client`` distinct classes per client, the class
  sets chosen by ``class_assignment`` (:data:`~fedapp.data.partitioners.CLASS_ASSIGNMENTS`:
  ``first-deterministic`` gives client ``i`` class ``i mod C`` and draws the rest with
  the seed, ``random`` draws them all, ``deterministic`` gives ``i, i+1, ...`` under
  every seed); covers every sample when each class has a client (always for
  ``first-deterministic`` with ``num_partitions >= num_classes``);
* ``shard``: ``shards_per_client`` label-sorted shards per client; drops the
  remainder of ``N / (num_partitions * shards_per_client)``;
* ``domain``: partition ``p`` holds domain ``p // clients_per_domain`` of
  ``domains``; a domain with several clients is split among them by
  ``dirichlet`` over labels with ``alpha`` (as SDFed does); covers every sample.

The first four run flwr-datasets' partitioners (:mod:`fedapp.data.partitioners`).
A partition is a pure function of its arguments, cached in-process because every
simulated client asks for the same one, and with a cache folder also on disk
(:mod:`fedapp.data.partition_cache`): the ServerApp partitions once before
round 1 and every simulation worker then reads the result instead of importing
flwr-datasets and partitioning again.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from pathlib import Path

import numpy as np

from fedapp.data import partition_cache, partitioners
from fedapp.errors import DataError

__all__ = ["PARTITIONS", "partition_indices"]

PARTITIONS = ("iid", "dirichlet", "pathological", "shard", "domain")

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
    class_assignment: str = partitioners.CLASS_ASSIGNMENTS[0],
    cache_dir: str | os.PathLike | None = None,
    domains: np.ndarray | None = None,
    clients_per_domain: int = 1,
) -> list[np.ndarray]:
    """Assign sample indices to ``num_partitions`` clients (schemes: see the module docstring).

    Parameters
    ----------
    labels : np.ndarray
        Integer class label of every sample, shape ``(N,)``.
    num_partitions : int
        Number of clients, ``1 <= num_partitions <= N``.
    scheme : str
        One of :data:`PARTITIONS`.
    alpha : float
        ``dirichlet`` and ``domain``: Dirichlet concentration.
    classes_per_client : int
        ``pathological``: distinct classes per client.
    shards_per_client : int
        ``shard``: label-sorted shards per client.
    seed : int
        Seed of the shuffle and of the partitioner.
    min_partition_size : int
        ``dirichlet``: smallest acceptable client; ``0`` means ``max(1, min(10, N // num_partitions // 2))``.
    class_assignment : str
        ``pathological``: how the class sets are chosen (see the module docstring).
    cache_dir : str or os.PathLike, optional
        Folder of the on-disk cache; ``None`` keeps the cache in memory only.
    domains : np.ndarray, optional
        ``domain``: the domain id of every sample, shape ``(N,)``.
    clients_per_domain : int
        ``domain``: clients per domain.

    Returns
    -------
    list[np.ndarray]
        Per client, its sorted ``int64`` sample indices (a copy); partitions are disjoint.

    Raises
    ------
    DataError
        An argument out of range, a partitioner that cannot satisfy it, or a client with no samples.
    """
    labels = _as_labels(labels)
    shared = {"alpha": alpha, "seed": seed, "min_partition_size": min_partition_size, "cache_dir": cache_dir}
    if scheme == "domain":
        return _domain_parts(labels, domains, num_partitions, clients_per_domain, **shared)
    by_label = (classes_per_client, shards_per_client, class_assignment)
    return _label_parts(labels, num_partitions, scheme, *by_label, **shared)


def _label_parts(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str,
    classes_per_client: int,
    shards_per_client: int,
    class_assignment: str,
    *,
    alpha: float,
    seed: int,
    min_partition_size: int,
    cache_dir: str | os.PathLike | None,
) -> list[np.ndarray]:
    """The label-based schemes (all but ``domain``): checked, then from the caches or flwr-datasets."""
    _check_arguments(
        labels,
        num_partitions,
        scheme,
        alpha=alpha,
        classes_per_client=classes_per_client,
        shards_per_client=shards_per_client,
        min_partition_size=min_partition_size,
    )
    if class_assignment not in partitioners.CLASS_ASSIGNMENTS:
        raise DataError(
            f"class_assignment must be one of {', '.join(partitioners.CLASS_ASSIGNMENTS)}, got {class_assignment!r}"
        )
    if scheme == "dirichlet" and min_partition_size == 0:
        min_partition_size = max(1, min(_DIRICHLET_MIN_SIZE_CAP, len(labels) // num_partitions // 2))
    parts = _partition_cached(
        _LabelKey(labels),
        int(num_partitions),
        scheme,
        alpha=float(alpha),
        classes_per_client=int(classes_per_client),
        shards_per_client=int(shards_per_client),
        seed=int(seed),
        min_partition_size=int(min_partition_size),
        # Only the pathological scheme reads it; the others keep one cache entry.
        class_assignment=class_assignment if scheme == "pathological" else partitioners.CLASS_ASSIGNMENTS[0],
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
    class_assignment: str,
    cache_dir: str | None,
) -> tuple[np.ndarray, ...]:
    arguments = dict(
        alpha=alpha,
        classes_per_client=classes_per_client,
        shards_per_client=shards_per_client,
        seed=seed,
        min_partition_size=min_partition_size,
        class_assignment=class_assignment,
    )
    path = None
    if cache_dir is not None:
        path = partition_cache.cache_path(Path(cache_dir), key.digest, num_partitions, scheme, arguments)
        parts = partition_cache.read_parts(path, num_partitions, len(key.labels))
        if parts is not None:
            return parts
    parts = partitioners.compute_parts(key.labels, num_partitions, scheme, **arguments)
    if path is not None:
        partition_cache.write_parts(path, parts)
    return parts
