"""The claims' markdown: each family's block of ``benchmarks/CLAIMS.md`` and the README's table,
made from :mod:`claims_spec`'s paired rows (``python benchmarks/claims.py tables``)."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path

from claims_spec import (
    PAGES,
    ROOT,
    ClaimRow,
    ClaimsError,
    Family,
    Record,
    claim_groups,
    evaluate_claims,
    load_records,
    read_selections,
    runs_by_seed,
    score,
)

from fedapp.report.tables import fmt_count, markdown_table, table_cell
from fedapp.report.verdict import describe, per_seed


def verdict_cell(row: ClaimRow) -> str:
    text = f"**{row.result.verdict}**"
    if row.result.n < row.needed_seeds:
        text += f" ({row.result.n} of {row.needed_seeds} seeds)"
    if row.result.unpaired:
        text += f"; {row.result.unpaired} seed(s) left out: a run never reached {row.claim.target}"
    return text


def ours_cell(row: ClaimRow, digits: int = 4, named: bool = True) -> str:
    """The means of a and b; a cost's is named with its target unless ``named`` is off (the README's
    claim names it)."""
    if row.claim.cost:
        unit = {"MB": lambda v: f"{v:.1f} MB", "rounds": lambda v: f"{v:.1f} rounds"}.get(row.claim.cost, fmt_count)
        means = f"{unit(row.a_mean)} vs {unit(row.b_mean)}"
        return f"{row.claim.cost} to {row.claim.target:g}: {means} (mean)" if named else means
    return f"{row.a_mean:.{digits}f} vs {row.b_mean:.{digits}f}"


def per_seed_cell(row: ClaimRow) -> str:
    if row.claim.cost:  # the ratio b / a of each seed
        return ", ".join(f"×{math.exp(d):.2f}" for d in row.result.differences)
    return per_seed(row.result)


def difference_cell(row: ClaimRow, digits: int = 4) -> str:
    if not row.claim.cost:
        return describe(row.result, digits)
    if row.result.n < 2:
        return f"b/a ×{math.exp(row.result.mean):.2f} (one seed)"
    low, high = row.result.interval
    return f"b/a ×{math.exp(row.result.mean):.2f} [×{math.exp(low):.2f}, ×{math.exp(high):.2f}]"


def resolvable_cell(row: ClaimRow) -> str:
    if row.result.n < 2:
        return "—"
    if row.claim.cost:
        return f"×{math.exp(row.result.half_width):.2f}"
    return f"{row.result.half_width:.4f}"


def setting_table(family: Family, records: Sequence[Record], group: str) -> str:
    """One row per setting: its seeds, the score of each, mean ± sample std."""
    body = []
    for label in family.settings:
        keys = family.resolved(label)
        runs = {} if keys is None else runs_by_seed(records, {**keys, **family.groups[group]}, f"{label} {group}")
        if not runs:
            continue
        scores = {seed: score(run, "acc_mean", family.last_rounds) for seed, run in sorted(runs.items())}
        values = list(scores.values())
        spread = f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else ""
        body.append(
            [
                table_cell(label),
                ", ".join(map(str, scores)),
                ", ".join(f"{v:.4f}" for v in values),
                f"{statistics.fmean(values):.4f}{spread}",
            ]
        )
    if not body:
        return "No records yet."
    rounds = "the last round" if family.last_rounds == 1 else f"the mean of the last {family.last_rounds} rounds"
    header = ["setting", "seeds", f"mean client accuracy, {rounds}", "mean ± std"]
    return markdown_table(header, body)


def claim_table(rows: Sequence[ClaimRow]) -> str:
    if not rows:
        return ""
    body = [
        [
            table_cell(row.claim.text)
            + (" (headline)" if row.claim.headline else "")
            + (" (ablation)" if row.claim.ablation else ""),
            table_cell(row.group) or "—",
            table_cell(row.claim.paper_figure(row.group)) or "—",
            ours_cell(row),
            per_seed_cell(row),
            difference_cell(row),
            resolvable_cell(row),
            verdict_cell(row),
        ]
        for row in rows
    ]
    header = ["claim", "group", "paper", "ours: a vs b", "paired, per seed", "mean [95% interval]",
              "resolvable", "verdict"]  # fmt: skip
    return markdown_table(header, body)


def selection_table(family: Family) -> str:
    """Every point the selection tried with its validation score, a row per method, the chosen one in bold."""
    path = family.selection_dir / "selection.json"
    if not path.is_file():
        return "The selection has not run yet: no setting that takes a chosen value has a row."
    body = []
    entries = read_selections(path)
    for entry in entries:
        points = []
        for point in entry["points"]:
            values = ", ".join(f"{key}={value}" for key, value in point["point"].items()) or "—"
            text = f"{values}: {point['val_score']:.4f}"
            points.append(f"**{text}**" if point["point"] == entry["chosen"] else text)
        body.append([entry["method"], table_cell(" · ".join(points))])
    rule = entries[0]["rule"]
    header = ["method", f"each point's validation accuracy, seed {family.select_seed} (the choice in bold)"]
    return f"Selection ({rule}):\n\n{markdown_table(header, body)}"


def family_block(family: Family) -> str:
    records = load_records(family.records)
    if family.select_seed is not None and (reported := [r for r in records if r.config["seed"] == family.select_seed]):
        raise ClaimsError(f"{reported[0].path}: seed {family.select_seed} chose the settings; no table may report it")
    # Linked from benchmarks/CLAIMS.md, named from the repository's root.
    link, name = os.path.relpath(family.records, PAGES["claims"].parent), os.path.relpath(family.records, ROOT)
    where = f"[`{name}/`]({link}/), {len(records)} runs" if records else f"no reported run yet (they land in `{name}/`)"
    parts = [f"Records: {where}. Choices: {family.selection}."]
    if family.select_grids:
        parts.append(selection_table(family))
    for group in family.groups:
        heading = f"**{group}**\n\n" if group else ""
        parts.append(heading + setting_table(family, records, group))
    rows = evaluate_claims(family, records)
    if rows:
        parts.append(claim_table(rows))
    done = {(row.claim.text, row.group) for row in rows}
    if missing := [f"{c.text} ({g})" if g else c.text for c, g in claim_groups(family) if (c.text, g) not in done]:
        command = f"`python benchmarks/claims.py run --family {family.name}`"
        parts.append(f"Claims without records yet ({command}): {'; '.join(missing)}.")
    return "\n\n".join(parts)


def readme_block(families: Sequence[Family]) -> str:
    """One row per claim and group of every family (ablations are CLAIMS.md's alone): the paper's
    figure, ours (the means of a and b), the paired difference and the verdict."""
    body = []
    for family in families:
        rows = [row for row in evaluate_claims(family, load_records(family.records)) if not row.claim.ablation]
        short = family.title.split(" (")[0]
        for row in rows:
            group = f" ({row.group})" if len(family.groups) > 1 else ""
            text = row.claim.text if row.claim.text.startswith(short) else f"{short}: {row.claim.text}"
            body.append(
                [
                    table_cell(f"{text}{group}"),
                    table_cell(row.claim.paper_figure(row.group)) or "—",
                    ours_cell(row, digits=3, named=False),
                    difference_cell(row, digits=3),
                    verdict_cell(row),
                ]
            )
        if not rows:
            body.append([f"{short}: every claim", "—", "no records yet", "—", "queued (CLAIMS.md)"])
    header = ["claim", "paper", "ours: a vs b", "a − b, mean [95% interval] over seeds", "verdict"]
    return markdown_table(header, body)


def costs_block(families: Sequence[Family]) -> str:
    """What each family's recorded runs took on the machine that ran them: the sum of each run's
    ``round_seconds`` (start-up not included), the selection's runs and the reported ones."""
    body = []
    for family in families:
        runs = [*load_records(family.selection_dir), *load_records(family.records)]
        minutes = [sum(float(row["round_seconds"]) for row in run.rounds) / 60 for run in runs]
        if not minutes:
            body.append([family.title, "0", "—", "—"])
            continue
        spread = f"{min(minutes):.0f}-{max(minutes):.0f}" if round(min(minutes)) != round(max(minutes)) else ""
        body.append([family.title, str(len(runs)), spread or f"{min(minutes):.0f}", f"{sum(minutes) / 60:.1f}"])
    header = ["family", "runs recorded (selection and reported)", "minutes a run", "hours in all"]
    return markdown_table(header, body)


def blocks(loaded: Sequence[Family]) -> dict[tuple[str, str], str]:
    """(page, block name) -> the block's markdown."""
    out = {("claims", f"family-{family.name}"): family_block(family) for family in loaded}
    out[("claims", "costs")] = costs_block(loaded)
    out[("readme", "readme")] = readme_block(loaded)
    return out


def replace_block(text: str, name: str, content: str, page: Path) -> str:
    begin, end = f"<!-- claims:{name} -->", f"<!-- /claims:{name} -->"
    if begin not in text or end not in text:
        raise ClaimsError(f"{page}: no {begin} ... {end} to hold the table")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{content}\n{end}{tail}"
