"""Aggregation and the validation every client update passes through first."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Arrays = list[np.ndarray]


def weighted_average(updates: Sequence[tuple[Arrays, int]]) -> Arrays:
    """FedAvg: the example-weighted mean of each array position.

    Parameters
    ----------
    updates
        ``(arrays, num_examples)`` per client; all clients send the same layout.
    """
    if not updates:
        raise ValueError("weighted_average() needs at least one update")
    total = float(sum(n for _, n in updates))
    if total <= 0:
        raise ValueError("weighted_average() needs a positive total example count")
    first = updates[0][0]
    out = [np.zeros(a.shape, dtype=np.float64) for a in first]
    for arrays, n in updates:
        weight = n / total
        for total_array, array in zip(out, arrays, strict=True):
            total_array += weight * array
    # Integer buffers (e.g. BatchNorm's num_batches_tracked) keep their dtype.
    return [
        acc.astype(ref.dtype) if np.issubdtype(ref.dtype, np.floating) else np.rint(acc).astype(ref.dtype)
        for acc, ref in zip(out, first, strict=True)
    ]


def update_problem(arrays: Arrays, num_examples: int, expected: Arrays | None) -> str | None:
    """Why a client update must be left out, or None if it is usable.

    ``expected`` gives the shapes and dtypes the update must match (the global
    arrays sent that round); None skips that check.
    """
    if num_examples <= 0:
        return f"non-positive example count {num_examples}"
    if expected is not None:
        if len(arrays) != len(expected):
            return f"{len(arrays)} arrays, expected {len(expected)}"
        for i, (got, want) in enumerate(zip(arrays, expected, strict=True)):
            if got.shape != want.shape:
                return f"array {i} has shape {got.shape}, expected {want.shape}"
            if got.dtype != want.dtype:
                return f"array {i} has dtype {got.dtype}, expected {want.dtype}"
    for i, array in enumerate(arrays):
        if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
            return f"array {i} holds NaN or Inf values"
    return None
