"""Per-client train/val/test splits that keep the client's label distribution."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedapp.errors import DataError

_FRACTION_TOLERANCE = 1e-6


@dataclass(frozen=True, eq=False)
class ClientSplit:
    """Disjoint global index arrays (sorted ``int64``) of one client's splits."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def split_stratified(
    indices: np.ndarray,
    labels: np.ndarray,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    seed: int = 0,
) -> ClientSplit:
    """Split a client's indices into train/val/test, stratified by label.

    Each class's indices are shuffled and cut by ``fractions`` with
    largest-remainder rounding; ties favour train, then val, so a class with
    very few samples lands in train first.

    Parameters
    ----------
    indices : np.ndarray
        The client's global sample indices.
    labels : np.ndarray
        The full label array, indexed by ``indices`` (not the client's labels).
    fractions : Sequence[float]
        Train, val and test shares; non-negative, summing to 1. A zero share
        gives an empty split (e.g. ``(0.9, 0.1, 0.0)`` with an external test set).
    seed : int
        Seed of the per-class shuffle.

    Returns
    -------
    ClientSplit
        Disjoint splits that together cover ``indices``.

    Raises
    ------
    DataError
        If the fractions are invalid, or ``indices`` has duplicates or points
        outside ``labels``.
    """
    weights = _check_fractions(fractions)
    index_array, label_array = _check_indices(indices, labels)
    client_labels = label_array[index_array]
    rng = np.random.default_rng(seed)
    pieces: list[list[np.ndarray]] = [[], [], []]
    for cls in np.unique(client_labels):
        members = rng.permutation(index_array[client_labels == cls])
        counts = largest_remainder(len(members), weights)
        bounds = np.cumsum(counts)[:-1]
        for piece, chunk in zip(pieces, np.split(members, bounds), strict=True):
            piece.append(chunk)
    train, val, test = (_sorted_concat(piece) for piece in pieces)
    return ClientSplit(train=train, val=val, test=test)


def sample_external_test(train_labels: np.ndarray, test_pool_labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Sample a client's test set from a shared pool, matching its train labels.

    Per-class targets are ``size`` times the class's share of ``train_labels``
    (largest-remainder rounding); a class the pool has fewer of is capped at what
    the pool has, so the result can be smaller than ``size``.

    Parameters
    ----------
    train_labels : np.ndarray
        The client's training labels (defines the class distribution).
    test_pool_labels : np.ndarray
        Labels of the shared test pool.
    size : int
        Requested number of test samples.
    seed : int
        Seed of the sampling.

    Returns
    -------
    np.ndarray
        Sorted ``int64`` indices into the pool, without repeats, only of classes
        present in ``train_labels``.

    Raises
    ------
    DataError
        If ``size`` is negative or ``train_labels`` is empty.
    """
    train = _as_int_labels(train_labels, "train_labels")
    pool = _as_int_labels(test_pool_labels, "test_pool_labels")
    if size < 0:
        raise DataError(f"external test size must be >= 0, got {size}")
    if len(train) == 0:
        raise DataError("train_labels is empty; no class distribution to match")
    classes, counts = np.unique(train, return_counts=True)
    targets = largest_remainder(int(size), counts.astype(np.float64))
    rng = np.random.default_rng(seed)
    picked = []
    for cls, target in zip(classes, targets, strict=True):
        available = np.flatnonzero(pool == cls)
        take = min(int(target), len(available))
        picked.append(rng.choice(available, size=take, replace=False))
    return _sorted_concat(picked)


def largest_remainder(total: int, weights: np.ndarray | Sequence[float]) -> np.ndarray:
    """Round ``total * weights / sum(weights)`` to integers that sum to ``total``.

    Parameters
    ----------
    total : int
        The integer to distribute.
    weights : array-like
        Non-negative weights with a positive sum.

    Returns
    -------
    np.ndarray
        ``int64`` counts; leftover units go to the largest fractional parts,
        ties to the earlier entry.
    """
    w = np.asarray(weights, dtype=np.float64)
    quotas = total * w / w.sum()
    counts = np.floor(quotas).astype(np.int64)
    leftover = total - int(counts.sum())
    # A stable sort keeps earlier entries first among equal remainders.
    order = np.argsort(-(quotas - counts), kind="stable")
    counts[order[:leftover]] += 1
    return counts


def _check_fractions(fractions: Sequence[float]) -> np.ndarray:
    weights = np.asarray(fractions, dtype=np.float64)
    if weights.shape != (3,) or not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise DataError(f"fractions must be three non-negative numbers (train, val, test), got {tuple(fractions)}")
    if abs(weights.sum() - 1.0) > _FRACTION_TOLERANCE:
        raise DataError(f"fractions must sum to 1, got {tuple(fractions)} (sum {weights.sum():g})")
    return weights


def _check_indices(indices: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    index_array = _as_int_labels(indices, "indices")
    label_array = _as_int_labels(labels, "labels")
    if len(index_array) and (index_array.min() < 0 or index_array.max() >= len(label_array)):
        raise DataError(
            f"indices must lie in [0, {len(label_array)}) (the label array), "
            f"found [{index_array.min()}, {index_array.max()}]"
        )
    if len(np.unique(index_array)) != len(index_array):
        raise DataError("indices contain duplicates; a sample cannot be in two splits")
    return index_array, label_array


def _as_int_labels(values: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise DataError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{name} must be integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _sorted_concat(chunks: list[np.ndarray]) -> np.ndarray:
    if not chunks:
        return np.empty(0, dtype=np.int64)
    return np.sort(np.concatenate(chunks)).astype(np.int64, copy=False)
