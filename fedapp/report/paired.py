"""Paired differences over seeds: each setting against one reference setting, seed by seed.

Two settings run on the same seed share the partition (and, for methods that allow it, the
initialisation), so the difference seed by seed is the comparison a claim such as "method A beats
method B" needs; its spread is usually far below that of either setting's own mean over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedapp.config import partition_settings, with_defaults
from fedapp.errors import DataError
from fedapp.report.runs import ReportRow
from fedapp.report.seeds import SeedGroup
from fedapp.report.tables import MISSING, fmt_mean_std, markdown_table, mean_std, table_cell

PAIRED_HEADER = [
    "setting",
    "seeds paired",
    "mean acc − reference (per seed)",
    "mean ± std",
    "higher in",
    "worst client − reference",
    "clients higher / lower / equal",
    "train FLOPs to target ÷ reference",
    "MB to target ÷ reference",
]


def _matches(group: SeedGroup, method: str, conditions: Sequence[tuple[str, str]]) -> bool:
    if group.runs[0].method != method:
        return False
    config = with_defaults(group.runs[0].config)
    for key, wanted in conditions:
        value = config.get(key)
        try:
            same = math.isclose(float(value), float(wanted))  # "0.05" names lr = 0.05 however it was written
        except (TypeError, ValueError):
            same = str(value).lower() == wanted.lower()
        if not same:
            return False
    return True


def select_reference(groups: Sequence[SeedGroup], reference: str) -> SeedGroup:
    """The one group that ``reference`` names: a method, then ``key=value`` conditions, e.g. ``"fedproto lr=0.05"``.

    Raises
    ------
    DataError
        When the text names no group or more than one (the message lists the candidates).
    """
    tokens = reference.replace(",", " ").split()
    if not tokens or "=" in tokens[0]:
        raise DataError(f"--paired-against {reference!r}: start with a method name, e.g. 'fedproto lr=0.05'")
    bad = [token for token in tokens[1:] if token.count("=") != 1 or token.startswith("=")]
    if bad:
        raise DataError(f"--paired-against {reference!r}: {bad[0]!r} is not key=value")
    conditions = [tuple(token.split("=")) for token in tokens[1:]]
    found = [group for group in groups if _matches(group, tokens[0], conditions)]  # type: ignore[arg-type]
    if len(found) == 1:
        return found[0]
    if not found:
        methods = sorted({group.runs[0].method for group in groups})
        raise DataError(
            f"--paired-against {reference!r} names none of the reported settings (methods: {', '.join(methods)})"
        )
    listed = "; ".join(group.setting for group in found)
    raise DataError(f"--paired-against {reference!r} names {len(found)} settings: {listed}; add key=value to pick one")


def _by_seed(group: SeedGroup) -> dict[int, ReportRow]:
    return dict(zip(group.seeds, group.runs, strict=True))


def _fmt_signed(values: Sequence[float], digits: int = 4) -> str:
    stats = mean_std(values)
    if stats is None:
        return MISSING
    mean, std, count = stats
    return f"{mean:+.{digits}f}" if count == 1 else f"{mean:+.{digits}f} ± {std:.{digits}f}"


def _client_counts(pairs: Sequence[tuple[ReportRow, ReportRow]]) -> str:
    """Over the seeds both ran, the clients whose own last-round accuracy is above, below and equal to
    theirs in the reference run: a mean can move on a few clients (the count says whether it did)."""
    diffs = [
        row.client_acc[client] - ref.client_acc[client]
        for row, ref in pairs
        for client in row.client_acc
        if client in ref.client_acc
    ]
    if not diffs:
        return MISSING
    tie = 1e-9  # accuracies are ratios of counts: equal ones subtract to float rounding at most
    return f"{sum(d > tie for d in diffs)} / {sum(d < -tie for d in diffs)} / {sum(abs(d) <= tie for d in diffs)}"


def _cost_ratio(pairs: Sequence[tuple[ReportRow, ReportRow]], attribute: str) -> str:
    """Mean ± std of the per-seed ratio, over the seeds where both reached the target (reached/paired)."""
    ratios = []
    for row, ref in pairs:
        mine, theirs = getattr(row, attribute), getattr(ref, attribute)
        if mine is not None and theirs:  # both reached it, and the reference spent something
            ratios.append(mine / theirs)
    if all(row.target is None for row, _ in pairs):
        return MISSING
    return f"{fmt_mean_std(ratios, 2)}× ({len(ratios)}/{len(pairs)})" if ratios else f"{MISSING} (0/{len(pairs)})"


def _partition(group: SeedGroup) -> dict[str, object]:
    """What decides each client's data, but the seed: two groups equal in it share a partition seed by seed."""
    settings = partition_settings(with_defaults(group.runs[0].config))
    settings.pop("seed", None)
    return settings


def render_paired_table(groups: Sequence[SeedGroup], reference: SeedGroup) -> str:
    """One row per other group sharing a seed and the partition with ``reference``: differences and cost
    ratios, seed by seed (a group on other data, e.g. another ``alpha``, has no pair on any seed)."""
    ref_runs = _by_seed(reference)
    ref_partition = _partition(reference)
    body = []
    for group in groups:
        if group is reference or _partition(group) != ref_partition:
            continue
        runs = _by_seed(group)
        seeds = [seed for seed in runs if seed in ref_runs]
        if not seeds:
            continue
        pairs = [(runs[seed], ref_runs[seed]) for seed in seeds]
        diffs = [row.acc_mean - ref.acc_mean for row, ref in pairs]
        body.append(
            [
                table_cell(group.setting),
                f"{len(pairs)} ({', '.join(map(str, seeds))})",
                ", ".join(f"{diff:+.4f}" for diff in diffs),
                _fmt_signed(diffs),
                f"{sum(diff > 0 for diff in diffs)} of {len(diffs)}",
                _fmt_signed([row.acc_worst - ref.acc_worst for row, ref in pairs]),
                _client_counts(pairs),
                _cost_ratio(pairs, "flops_to_target"),
                _cost_ratio(pairs, "mb_to_target"),
            ]
        )
    return markdown_table(PAIRED_HEADER, body)


def paired_section(groups: Sequence[SeedGroup], reference: SeedGroup) -> list[str]:
    """The report's paired section: a heading, what the columns mean, and the table."""
    return [
        "",
        f"## Paired over seeds, against {reference.setting}",
        "",
        "Each setting's last-round figures minus the reference's on the same seed (same partition; settings on "
        "other data are left out), then mean ± "
        "sample std over the seeds both ran; 'higher in' counts the seeds where the setting's mean accuracy is "
        "above the reference's; the clients' counts compare each client's own last-round accuracy with the "
        "same client's in the reference run, over the paired seeds. Cost ratios are per seed, over the seeds "
        "where both reached the target.",
        "",
        render_paired_table(groups, reference),
    ]
