"""One rule that turns paired runs into a verdict on a claim "a beats b".

For each seed both settings ran (the same seed draws the same partition for every method), the
paired difference is ``d_s = score(a, s) - score(b, s)``. Over the ``n`` seeds: the mean ``d``,
the sample standard deviation ``s_d`` and the two-sided 95% Student-t interval
``d ± t(0.975, n - 1) · s_d / √n``. The verdict:

* **holds**: the interval lies above 0;
* **reversed**: the interval lies below 0;
* **not resolved**: the interval contains 0 (or there is one seed only).

The interval's half-width is the smallest mean difference these seeds, at their spread, could
have resolved: a mean difference of that size or less cannot be told from zero.

For a cost (rounds, bytes, FLOPs to a target accuracy), where lower is better, the paired figure
is ``log(cost_b / cost_a)``, so that "a costs less than b" holds when the interval of the mean log
ratio lies above 0; the ratio is reported as ``exp`` of it. A run that never reached the target
has no cost: a pair with one is left out and the count of those pairs is reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

HOLDS = "holds"
REVERSED = "reversed"
NOT_RESOLVED = "not resolved"

#: t(0.975, df) for df = 1 .. 30; beyond, the Cornish-Fisher expansion (error below 1e-4).
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959964


def t_quantile_975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"a t quantile needs at least one degree of freedom, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class PairedVerdict:
    """Paired differences over seeds and what the rule makes of them.

    Attributes
    ----------
    seeds : tuple[int, ...]
        The seeds both settings ran, in order.
    differences : tuple[float, ...]
        ``a - b`` per seed (for a cost: ``log(cost_b / cost_a)``).
    unpaired : int
        Seeds left out because a run of the pair has no figure (a cost target not reached).
    """

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    unpaired: int = 0

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return sum(self.differences) / self.n if self.n else math.nan

    @property
    def std(self) -> float:
        """Sample standard deviation (n - 1); NaN for fewer than two seeds."""
        if self.n < 2:
            return math.nan
        mean = self.mean
        return math.sqrt(sum((d - mean) ** 2 for d in self.differences) / (self.n - 1))

    @property
    def half_width(self) -> float:
        """Half the 95% interval: the smallest mean difference these seeds could resolve."""
        if self.n < 2:
            return math.inf
        return t_quantile_975(self.n - 1) * self.std / math.sqrt(self.n)

    @property
    def interval(self) -> tuple[float, float]:
        return self.mean - self.half_width, self.mean + self.half_width

    @property
    def above(self) -> int:
        """Seeds in which a is above b."""
        return sum(d > 0 for d in self.differences)

    @property
    def verdict(self) -> str:
        low, high = self.interval
        if self.n >= 2 and low > 0:
            return HOLDS
        if self.n >= 2 and high < 0:
            return REVERSED
        return NOT_RESOLVED


def paired_verdict(a: Mapping[int, float | None], b: Mapping[int, float | None]) -> PairedVerdict:
    """The rule on two settings' scores by seed (higher is better): ``a - b`` over the seeds both have.

    A seed whose score is None (or not finite) on either side is counted in ``unpaired``.
    """
    return _pair(a, b, lambda x, y: x - y)


def cost_verdict(a: Mapping[int, float | None], b: Mapping[int, float | None]) -> PairedVerdict:
    """The rule on two settings' costs by seed (lower is better; None: the target was not reached):
    ``log(cost_b / cost_a)`` over the seeds both reached the target."""
    return _pair(a, b, lambda x, y: math.log(y / x))


def _pair(
    a: Mapping[int, float | None], b: Mapping[int, float | None], difference: Callable[[float, float], float]
) -> PairedVerdict:
    seeds, differences, unpaired = [], [], 0
    for seed in sorted(set(a) & set(b)):
        x, y = a[seed], b[seed]
        if x is None or y is None or not math.isfinite(x) or not math.isfinite(y):
            unpaired += 1
            continue
        seeds.append(seed)
        differences.append(float(difference(x, y)))
    return PairedVerdict(tuple(seeds), tuple(differences), unpaired)


def fmt_signed(value: float, digits: int = 4) -> str:
    """``+0.0123`` / ``−0.0123`` (a true minus sign, as the claims pages print)."""
    if not math.isfinite(value):
        return "—"
    return f"{value:+.{digits}f}".replace("-", "−")


def describe(result: PairedVerdict, digits: int = 4) -> str:
    """``+0.0174 [+0.0110, +0.0238]``: the mean and its 95% interval (the mean alone for one seed)."""
    if result.n == 0:
        return "—"
    if result.n == 1:
        return f"{fmt_signed(result.mean, digits)} (one seed)"
    low, high = result.interval
    return f"{fmt_signed(result.mean, digits)} [{fmt_signed(low, digits)}, {fmt_signed(high, digits)}]"


def per_seed(result: PairedVerdict, digits: int = 3) -> str:
    """``+0.015, +0.017, +0.020``: the paired difference of each seed."""
    return ", ".join(fmt_signed(d, digits) for d in result.differences)
