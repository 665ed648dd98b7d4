"""How the report writes numbers and markdown: cell formats, tables and the figure columns.

The benchmark scripts use :func:`fmt_count` and :func:`markdown_table` too (through
``benchmarks/compare.py``), so their tables look like the report's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NOT_REACHED = "not reached"
MISSING = "—"

# The figures of a run; the main table gives them per run, the seed table as mean ± std per setting.
# 'rounds' is completed / configured (num-rounds): a run stopped early shows it. 'val acc' is the
# clients' mean accuracy on the validation data they hold back from training (what a choice rests on).
FIGURE_COLUMNS = [
    "rounds",
    "val acc",
    "mean acc",
    "worst acc",
    "std acc",
    "held-out / novel",
    "bytes/round",
    "total MB",
    "rounds to target",
    "s to target",
]


def fmt_count(value: float | None) -> str:
    """1234567 -> '1.23M'; None -> 'not reached'."""
    if value is None:
        return NOT_REACHED
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table; cells are used as given (no escaping)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_bytes(value: float) -> str:
    """Bytes in base-1024 units, three significant digits: 512 -> '512 B', 12595 -> '12.3 kB'.

    Base 1024 so that '1.00 MB' here is the same megabyte as ``fedapp.metrics.MB`` (total MB column).
    """
    if not math.isfinite(value):
        return MISSING
    size = float(value)
    unit = "B"
    for next_unit in ("kB", "MB", "GB", "TB"):
        if round(size) < 1024:
            break
        size /= 1024
        unit = next_unit
    if unit == "B":
        return f"{size:.0f} B"
    decimals = 0 if size >= 100 else 1 if size >= 10 else 2
    return f"{size:.{decimals}f} {unit}"


def fmt_rounds(done: int, planned: int | None) -> str:
    """Rounds completed out of those configured: ``15/15``, ``7/15`` (a run stopped early); ``7`` when unknown."""
    return str(done) if planned is None else f"{done}/{planned}"


def fmt_acc(value: float | None) -> str:
    """An accuracy with four decimals; ``—`` when absent or not finite."""
    return MISSING if value is None or not math.isfinite(value) else f"{value:.4f}"


def table_cell(text: str) -> str:
    """A markdown cell: a '|' or a line break in free text (run names, notes) would break the table."""
    return text.replace("|", "\\|").replace("\n", " ")


def plural(count: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def mean_std(values: Sequence[float | None]) -> tuple[float, float, int] | None:
    """Mean, sample standard deviation (n - 1; 0 for one value) and count of the finite values."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return None
    mean = sum(finite) / len(finite)
    var = sum((v - mean) ** 2 for v in finite) / (len(finite) - 1) if len(finite) > 1 else 0.0
    return mean, math.sqrt(var), len(finite)


def fmt_mean_std(values: Sequence[float | None], digits: int = 4) -> str:
    """``0.8123 ± 0.0100`` over the finite values; ``—`` when there are none."""
    stats = mean_std(values)
    if stats is None:
        return MISSING
    mean, std, count = stats
    return f"{mean:.{digits}f}" if count == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"
