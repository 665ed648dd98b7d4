"""Repetitions over seeds: runs whose configs differ only in seed form one group, tabulated as mean ± std."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedapp.config import UNCOMPARED, same_setting_key, with_defaults
from fedapp.report.runs import ReportRow
from fedapp.report.tables import (
    FIGURE_COLUMNS,
    MISSING,
    NOT_REACHED,
    fmt_bytes,
    fmt_count,
    fmt_mean_std,
    fmt_rounds,
    markdown_table,
    mean_std,
    table_cell,
)

# The seed table adds the cost to the target as the pFedLoRA paper counts it: communication and training FLOPs.
SEED_HEADER = ["setting", "seeds", *FIGURE_COLUMNS, "MB to target", "train FLOPs to target"]


@dataclass(frozen=True)
class SeedGroup:
    """Runs whose configs differ only in :data:`~fedapp.config.UNCOMPARED` (repetitions over seeds).

    Attributes
    ----------
    setting : str
        The method and the keys that tell this group from the others in the report.
    runs : tuple[ReportRow, ...]
        The group's runs, in report order.
    """

    setting: str
    runs: tuple[ReportRow, ...]

    @property
    def seeds(self) -> tuple[int, ...]:
        """The seed of each run, in report order."""
        return tuple(int(row.config.get("seed", 0)) for row in self.runs)


def _setting_key(row: ReportRow) -> str:
    if not row.config:  # an old run folder: nothing to compare, so it stands alone
        return f"run:{row.path}"
    return same_setting_key(row.config)


def group_by_seed(rows: Sequence[ReportRow]) -> list[SeedGroup]:
    """Group runs that differ only in seed (and name/folder), in order of first appearance."""
    grouped: dict[str, list[ReportRow]] = {}
    for row in rows:
        grouped.setdefault(_setting_key(row), []).append(row)
    firsts = [with_defaults(members[0].config) for members in grouped.values() if members[0].config]
    varying = sorted(
        key
        for key in {k for config in firsts for k in config} - UNCOMPARED - {"method"}
        if len({json.dumps(config.get(key), default=str) for config in firsts}) > 1
    )
    groups = []
    for members in grouped.values():
        config = members[0].config
        filled = with_defaults(config)
        label = ", ".join([members[0].method, *(f"{key}={filled.get(key)}" for key in varying)])
        groups.append(SeedGroup(setting=label if config else members[0].run, runs=tuple(members)))
    return groups


def _group_generalization(runs: Sequence[ReportRow]) -> str:
    if any(row.novel_acc_mean is not None for row in runs):
        return (
            f"base {fmt_mean_std([r.acc_mean for r in runs])} / novel {fmt_mean_std([r.novel_acc_mean for r in runs])}"
            f" / HM {fmt_mean_std([r.harmonic_mean for r in runs])}"
        )
    if any(row.held_out_acc_mean is not None for row in runs):
        return f"held-out {fmt_mean_std([r.held_out_acc_mean for r in runs])}"
    return MISSING


def _group_to_target(runs: Sequence[ReportRow], values: Sequence[float | None], digits: int, fmt: Any = None) -> str:
    """Mean ± std of ``values`` over the runs that reached the target (reached/runs); ``fmt``
    formats a number (default: ``digits`` decimals)."""
    if all(row.target is None for row in runs):
        return MISSING
    reached = [value for value, row in zip(values, runs, strict=True) if row.rounds_to_target is not None]
    if not reached:
        return f"{NOT_REACHED} (0/{len(runs)})"
    if fmt is None:
        return f"{fmt_mean_std(reached, digits)} ({len(reached)}/{len(runs)})"
    stats = mean_std(reached)
    if stats is None:  # reached, but the runs did not record this figure
        return MISSING
    mean, std, _ = stats
    spread = "" if len(reached) == 1 else f" ± {fmt(std)}"
    return f"{fmt(mean)}{spread} ({len(reached)}/{len(runs)})"


def render_seed_table(groups: Sequence[SeedGroup]) -> str:
    """One row per :class:`SeedGroup`: every figure of the main table as mean ± std over its seeds."""
    body = []
    for group in groups:
        runs = group.runs
        rounds = sorted({(row.rounds, row.num_rounds or 0) for row in runs})
        body.append(
            [
                table_cell(group.setting),
                f"{len(runs)} ({', '.join(map(str, group.seeds))})",
                ", ".join(fmt_rounds(done, planned or None) for done, planned in rounds),
                fmt_mean_std([r.val_acc_mean for r in runs]),
                fmt_mean_std([r.acc_mean for r in runs]),
                fmt_mean_std([r.acc_worst for r in runs]),
                fmt_mean_std([r.acc_std for r in runs]),
                table_cell(_group_generalization(runs)),
                fmt_bytes(sum(r.bytes_per_round for r in runs) / len(runs)),
                fmt_mean_std([r.total_mb for r in runs], 2),
                _group_to_target(runs, [r.rounds_to_target for r in runs], 1),
                _group_to_target(runs, [r.seconds_to_target for r in runs], 1),
                _group_to_target(runs, [r.mb_to_target for r in runs], 2),
                _group_to_target(runs, [r.flops_to_target for r in runs], 0, fmt_count),
            ]
        )
    return markdown_table(SEED_HEADER, body)
