"""Client-level differential privacy, Flower-free: the config rules, the sampling rate, the
clipping of an update and the RDP accountant. :mod:`fedapp.flower.privacy` applies them
through Flower's fixed-clipping wrappers (its docstring says how, and what the budget means).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedapp.aggregation import Arrays

# RDP orders of the accountant: integers, for which the sampled Gaussian's RDP has a closed form.
RDP_ORDERS = (*range(2, 257), 320, 384, 448, 512, 768, 1024)


def sampled_per_round(training_clients: int, min_clients: int, fraction_fit: float) -> int:
    """How many of the ``training_clients`` (every partition but the held-out ones) the strategy
    samples to train each round (:meth:`fedapp.flower.sampling.ClientSampler.sample`)."""
    return min(training_clients, max(min_clients, math.ceil(fraction_fit * training_clients)))


def sampling_rate(training_clients: int, min_clients: int, fraction_fit: float) -> float:
    """q of the accountant: the share of the training clients sampled each round."""
    return sampled_per_round(training_clients, min_clients, fraction_fit) / training_clients


def rdp_sampled_gaussian(q: float, sigma: float, orders: Sequence[int] = RDP_ORDERS) -> np.ndarray:
    """RDP of one step of the Poisson-subsampled Gaussian mechanism at integer ``orders``.

    For sampling rate ``q`` and noise multiplier ``sigma`` (noise std / L2
    sensitivity), order alpha has epsilon(alpha) = log(A_alpha) / (alpha - 1) with
    A_alpha = sum_k binom(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 sigma^2))
    (Mironov, Talwar and Zhang 2019, Sec. 3.3), summed in log space. With q = 1 it
    is the Gaussian mechanism's alpha / (2 sigma^2).
    """
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling rate q = {q} must lie in (0, 1]")
    if sigma < 0:
        raise ValueError(f"noise multiplier sigma = {sigma} must be >= 0")
    alphas = np.asarray(orders, dtype=np.int64)
    if alphas.min() < 2:
        raise ValueError("RDP orders must be integers >= 2")
    if sigma == 0:
        return np.full(alphas.shape, math.inf)
    if q == 1.0:
        return alphas / (2.0 * sigma**2)
    out = np.empty(alphas.shape)
    # log(n!) for n = 0 .. max order: the orders are integers, so the binomials need no gamma function.
    log_factorial = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, alphas.max() + 1, dtype=np.float64)))))
    for i, alpha in enumerate(alphas):
        k = np.arange(alpha + 1)
        log_binom = log_factorial[alpha] - log_factorial[k] - log_factorial[alpha - k]
        terms = log_binom + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2.0 * sigma**2)
        top = terms.max()
        out[i] = (top + math.log(np.exp(terms - top).sum())) / (alpha - 1)
    return out


def epsilon(q: float, sigma: float, rounds: int, delta: float, orders: Sequence[int] = RDP_ORDERS) -> float:
    """The epsilon of (epsilon, delta)-DP after ``rounds`` sampled Gaussian steps.

    RDP composes by addition over rounds; the conversion to (epsilon, delta) is
    Canonne, Kamath and Steinke 2020 (Prop. 12), minimised over the orders, as
    in Google's ``dp_accounting``. ``inf`` when ``sigma`` = 0, 0 before any round.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta = {delta} must lie in (0, 1)")
    if rounds <= 0:
        return 0.0
    rdp = rounds * rdp_sampled_gaussian(q, sigma, orders)
    alphas = np.asarray(orders, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        eps = rdp + np.log1p(-1.0 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1.0)
    # Where delta^2 + expm1(-rdp) > 0 the order certifies epsilon = 0.
    eps = np.where(delta**2 + np.expm1(-rdp) > 0, 0.0, eps)
    best = float(np.min(eps))
    return max(0.0, best) if math.isfinite(best) else math.inf


def same_layout(arrays: Arrays, reference: Arrays) -> bool:
    """Whether ``arrays`` has the shapes and dtypes of ``reference``, array by array."""
    return len(arrays) == len(reference) and all(
        a.shape == r.shape and a.dtype == r.dtype for a, r in zip(arrays, reference, strict=True)
    )


def update_norm(arrays: Arrays, reference: Arrays) -> float:
    """L2 norm of ``arrays - reference`` over all arrays flattened together."""
    return math.sqrt(
        sum(float(np.sum((a.astype(np.float64) - r) ** 2)) for a, r in zip(arrays, reference, strict=True))
    )


def clip_update(arrays: Arrays, reference: Arrays, clipping_norm: float) -> Arrays:
    """``reference + update * min(1, C / ||update||)`` in the arrays' own dtypes (FlatClip,
    as Flower's ``compute_clip_model_update``, which divides by zero on an unchanged reply)."""
    norm = update_norm(arrays, reference)
    if norm <= clipping_norm:
        return arrays
    scale = clipping_norm / norm
    return [(r + (a.astype(np.float64) - r) * scale).astype(a.dtype) for a, r in zip(arrays, reference, strict=True)]
