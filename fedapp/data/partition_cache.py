"""The on-disk cache of partitions: one ``partitions/<digest>.npz`` file per partition.

The ServerApp partitions once before round 1 and writes the result here; every
simulation worker then reads it instead of importing flwr-datasets and
partitioning again. Files are written atomically (workers may race to write the
same one); a missing, unreadable or foreign file only means partitioning again.
"""

from __future__ import annotations

import hashlib
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from fedapp.data.arrays import save_npz_atomically

__all__ = ["cache_path", "read_parts", "write_parts"]

log = logging.getLogger("flwr.fedapp")


def cache_path(cache_dir: Path, labels_digest: str, num_partitions: int, scheme: str, arguments: dict) -> Path:
    """The file of one partition: a digest of everything the result depends on.

    Parameters
    ----------
    cache_dir : Path
        The cache folder; files go to its ``partitions/`` subfolder.
    labels_digest : str
        SHA-256 of the label array's bytes.
    num_partitions : int
        Number of clients.
    scheme : str
        The partition scheme.
    arguments : dict
        The partitioner's keywords.

    Returns
    -------
    Path
        ``<cache_dir>/partitions/<32 hex digits>.npz``.
    """
    # The partitioners' code is part of "everything": their package versions go in too.
    versions = []
    for package in ("flwr-datasets", "datasets"):
        try:
            versions.append(version(package))
        except PackageNotFoundError:
            versions.append("?")
    text = repr((labels_digest, num_partitions, scheme, sorted(arguments.items()), versions))
    return cache_dir / "partitions" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.npz"


def read_parts(path: Path, num_partitions: int, num_samples: int) -> tuple[np.ndarray, ...] | None:
    """Read a cached partition back.

    Parameters
    ----------
    path : Path
        The file, from :func:`cache_path`.
    num_partitions : int
        Number of clients the partition must have.
    num_samples : int
        Number of samples its indices must stay below.

    Returns
    -------
    tuple[np.ndarray, ...] or None
        Per client, its read-only ``int64`` indices; ``None`` when the file is
        absent, unreadable or not a partition of this shape (the last two logged).
    """
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


def write_parts(path: Path, parts: tuple[np.ndarray, ...]) -> None:
    """Store ``parts`` atomically (workers may race to write the same file); failures only log.

    Parameters
    ----------
    path : Path
        The file, from :func:`cache_path`.
    parts : tuple[np.ndarray, ...]
        Per client, its ``int64`` indices; stored concatenated, with offsets.
    """
    offsets = np.cumsum([0, *(len(part) for part in parts)], dtype=np.int64)
    indices = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    try:
        save_npz_atomically(path, indices=indices, offsets=offsets)
    except OSError as err:
        log.debug("could not cache the partition in %s: %s", path, err)
