"""Aggregation and the validation every client update passes through first."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
    return in_dtypes_of(out, first)


def in_dtypes_of(out: Arrays, reference: Arrays) -> Arrays:
    """``out`` in ``reference``'s dtypes; integer buffers (BatchNorm's num_batches_tracked) are rounded."""
    return [
        np.asarray(acc).astype(ref.dtype) if np.issubdtype(ref.dtype, np.floating) else np.rint(acc).astype(ref.dtype)
        for acc, ref in zip(out, reference, strict=True)
    ]


AGGREGATION_RULES = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "bulyan")
"""``mean`` is FedAvg; the others are Flower's robust rules (``flwr.server.strategy.aggregate``)."""


def min_updates(rule: str, byzantine: int) -> int:
    """The fewest updates ``rule`` can aggregate while tolerating ``byzantine`` malicious ones.

    Krum needs ``n > 2f + 2`` (Blanchard et al., 2017); Bulyan ``n >= 4f + 3`` (El Mhamdi et al., 2018).
    """
    if rule in ("krum", "multi-krum"):
        return 2 * byzantine + 3
    if rule == "bulyan":
        return 4 * byzantine + 3
    return 1


def update_norm(arrays: Arrays, reference: Arrays) -> float:
    """L2 norm of ``arrays - reference`` over the floating-point arrays (the update a client made)."""
    squares = sum(
        float(np.sum((np.asarray(a, dtype=np.float64) - np.asarray(r, dtype=np.float64)) ** 2))
        for a, r in zip(arrays, reference, strict=True)
        if np.issubdtype(r.dtype, np.floating)
    )
    return math.sqrt(squares)


def update_problem(arrays: Arrays, num_examples: int, expected: Arrays | None) -> str | None:
    """Why a client update must be left out, or None if it is usable.

    ``expected`` gives the shapes and dtypes the update must match (the global
    arrays sent that round); None skips that check. Integer arrays are counts
    (per-class example counts, BatchNorm's batch counter) and must not be
    negative; floating arrays must be finite.
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, int | np.integer):
        return f"example count {num_examples!r} is not an integer"
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
        if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
            return f"array {i} holds NaN or Inf values"
        if np.issubdtype(array.dtype, np.signedinteger) and array.size and array.min() < 0:
            return f"array {i} holds negative counts"
    return None


def metrics_problem(metrics: Mapping[str, object]) -> str | None:
    """Why a client's fit metrics make its update unusable, or None.

    The server averages ``train_loss`` over clients and sums ``train_flops``;
    either, when present, must be a finite number (``train_flops`` also not
    negative). A client that reports a NaN loss has diverged even if its arrays
    are still finite, and taking it would make the round's loss NaN.
    """
    for key in ("train_loss", "train_flops"):
        if key not in metrics:
            continue
        value = metrics[key]
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            return f"metric {key} = {value!r} is not a number"
        if not math.isfinite(float(value)):
            return f"metric {key} = {value!r} is NaN or Inf"
        if key == "train_flops" and value < 0:
            return f"metric {key} = {value!r} is negative"
    return None
