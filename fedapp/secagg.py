"""Secure aggregation (SecAgg+), Flower-free: the workflow's options and
the error bound of its quantization. :mod:`fedapp.flower.secure_aggregation` runs it
through Flower's ``secaggplus_mod`` and ``SecAggPlusWorkflow``.
"""

from __future__ import annotations

from typing import Any, Protocol

MODULUS_RANGE = 2**32
"""The masks of SecAgg+ are drawn from [0, MODULUS_RANGE): Flower's largest (and default) choice."""


class SecAggSettings(Protocol):
    """The run settings SecAgg+'s workflow takes (a :class:`fedapp.config.RunConfig` has them)."""

    round_timeout: float
    secagg_num_shares: float
    secagg_reconstruction_threshold: float
    secagg_max_weight: float
    secagg_clipping_range: float
    secagg_quantization_range: int


def secagg_workflow_options(config: SecAggSettings) -> dict[str, Any]:
    """The keyword arguments of :class:`SecAggPlusWorkflow` for this run."""
    timeout = config.round_timeout
    return {
        "num_shares": _count_or_fraction(config.secagg_num_shares),
        "reconstruction_threshold": _count_or_fraction(config.secagg_reconstruction_threshold),
        "max_weight": config.secagg_max_weight,
        "clipping_range": config.secagg_clipping_range,
        "quantization_range": config.secagg_quantization_range,
        "modulus_range": MODULUS_RANGE,
        "timeout": timeout if timeout > 0 else None,
    }


def error_bound(
    num_examples: list[int], max_abs: float, clipping_range: float, quantization_range: int, max_weight: float
) -> float:
    """Largest difference, per value, between the SecAgg+ aggregate and the exact
    example-weighted average of uploads whose values lie within ``max_abs``
    (<= ``clipping_range``; larger values are clipped before masking).

    Each client quantizes ``w_i * x`` with ``w_i ~ n_i / max_weight`` to
    ``quantization_range`` levels over ``[-c, c]``: stochastic rounding (plus
    float32 arithmetic) is off by under 2 levels per client, and the weights by
    half a level. Dividing by ``W = sum(w_i)`` gives
    ``n (4c + max_abs) / (quantization_range * W)``, plus float32 rounding.
    """
    clients = len(num_examples)
    levels = float(quantization_range)
    weight_sum = sum(num_examples) / max_weight - clients / (2 * levels)
    return clients * (4 * clipping_range + max_abs) / (levels * weight_sum) + 2.0**-23 * max_abs


def _count_or_fraction(value: float) -> int | float:
    """``secagg-num-shares`` / ``-reconstruction-threshold`` as Flower takes them:
    a value <= 1 is a fraction (float), a larger one a count (int)."""
    return float(value) if value <= 1 else int(value)
