"""Robust aggregation through Flower's own rules (median, trimmed mean, Krum, Multi-Krum,
Bulyan), applied to our validated updates in float64 and cast back to the arrays' dtypes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.server.strategy.aggregate import aggregate_bulyan, aggregate_krum, aggregate_median, aggregate_trimmed_avg

from fedapp.aggregation import AGGREGATION_RULES, Arrays, in_dtypes_of, min_updates, weighted_average


def robust_aggregate(
    updates: Sequence[tuple[Arrays, int]], rule: str, *, trim_fraction: float = 0.2, byzantine: int = 0
) -> Arrays:
    """Aggregate same-layout updates with ``rule`` (one of :data:`AGGREGATION_RULES`).

    Parameters
    ----------
    updates
        ``(arrays, num_examples)`` per client.
    rule
        ``mean`` (example-weighted, FedAvg), ``median`` (coordinate-wise), ``trimmed-mean``
        (coordinate-wise, ``trim_fraction`` cut from each end), ``krum`` (the one update closest to
        its ``n - f - 2`` neighbours), ``multi-krum`` (the mean of the ``n - f`` best by Krum's score)
        or ``bulyan`` (Multi-Krum selection, then a coordinate-wise trimmed mean).
    trim_fraction
        Share cut from each end per coordinate by ``trimmed-mean``.
    byzantine
        ``f``, the malicious updates Krum, Multi-Krum and Bulyan tolerate.

    Raises
    ------
    ValueError
        For an unknown rule, or fewer updates than :func:`min_updates` asks for.
    """
    if rule not in AGGREGATION_RULES:
        raise ValueError(f"unknown aggregation rule {rule!r}; use one of {', '.join(AGGREGATION_RULES)}")
    if len(updates) < min_updates(rule, byzantine):
        raise ValueError(
            f"{rule} with {byzantine} byzantine clients needs at least {min_updates(rule, byzantine)} updates, "
            f"got {len(updates)}"
        )
    if rule == "mean":
        return weighted_average(updates)
    # Flower's rules average in the arrays' own dtype: work in float64, then cast back.
    results = [([np.asarray(a, dtype=np.float64) for a in arrays], int(n)) for arrays, n in updates]
    if rule == "median":
        out = aggregate_median(results)
    elif rule == "trimmed-mean":
        out = aggregate_trimmed_avg(results, trim_fraction)
    elif rule == "krum":
        out = aggregate_krum(results, byzantine, to_keep=0)
    elif rule == "multi-krum":
        out = aggregate_krum(results, byzantine, to_keep=len(results) - byzantine)
    else:
        out = aggregate_bulyan(results, byzantine, aggregate_krum, to_keep=0)
    return in_dtypes_of(out, updates[0][0])
