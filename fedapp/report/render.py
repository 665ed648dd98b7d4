"""The report itself: its markdown (main, seed and per-domain tables), its figure, and the files written."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedapp.errors import DataError
from fedapp.metrics import save_accuracy_figure
from fedapp.report.paired import paired_section, select_reference
from fedapp.report.runs import MECHANISM_FIGURES, ReportRow, report_rows
from fedapp.report.seeds import group_by_seed, render_seed_table
from fedapp.report.tables import (
    FIGURE_COLUMNS,
    MISSING,
    NOT_REACHED,
    fmt_acc,
    fmt_bytes,
    fmt_rounds,
    markdown_table,
    plural,
    table_cell,
)
from fedapp.runfolder import check_rewritable, mark_markdown

if TYPE_CHECKING:  # importing fedapp.data loads torch: the figure's helpers are imported when one is drawn
    from fedapp.data.figures import Panel

MAIN_HEADER = ["run", "method", "protocol", "shots", *FIGURE_COLUMNS]
REPORT_TOOL = "fedapp-report"
"""The mark of the reports and figures it writes: it overwrites no other file (:func:`check_outputs`)."""


def _to_target(row: ReportRow) -> tuple[str, str]:
    if row.target is None:
        return MISSING, MISSING
    if row.rounds_to_target is None or row.seconds_to_target is None:
        return NOT_REACHED, NOT_REACHED
    return str(row.rounds_to_target), f"{row.seconds_to_target:.1f}"


def _main_table(rows: Sequence[ReportRow]) -> str:
    """One row per run: its protocol and figures (:data:`MAIN_HEADER`)."""
    body = []
    for row in rows:
        rounds_to, seconds_to = _to_target(row)
        body.append(
            [
                table_cell(row.run),
                table_cell(row.method),
                table_cell(row.protocol),
                "all" if row.shots == 0 else str(row.shots),
                fmt_rounds(row.rounds, row.num_rounds),
                fmt_acc(row.val_acc_mean),
                fmt_acc(row.acc_mean),
                fmt_acc(row.acc_worst),
                fmt_acc(row.acc_std),
                table_cell(row.generalization),
                fmt_bytes(row.bytes_per_round),
                f"{row.total_mb:.2f}",
                rounds_to,
                seconds_to,
            ]
        )
    return markdown_table(MAIN_HEADER, body)


def _target_line(rows: Sequence[ReportRow]) -> str:
    """The sentence naming the accuracy the 'to target' columns are timed to."""
    targets = sorted({row.target for row in rows if row.target is not None})
    if len(targets) == 1:
        return f"Target: mean client accuracy ≥ {targets[0]:.4f}."
    if targets:
        return "Target: each run's own target-accuracy (" + ", ".join(f"{t:.4f}" for t in targets) + ")."
    return "Target: none given and none in the runs' configs."


def _seed_section(rows: Sequence[ReportRow]) -> list[str]:
    """The mean ± std table, when some runs repeat a setting over seeds; else nothing."""
    groups = group_by_seed(rows)
    if not any(len(group.runs) > 1 for group in groups):
        return []
    return [
        "",
        "## Mean ± std over seeds",
        "",
        "Runs whose configs differ only in seed (and name or folder) form one row: mean ± sample standard "
        "deviation over them; 'to target' columns average the runs that reached it (reached/runs).",
        "",
        render_seed_table(groups),
    ]


def _domain_section(rows: Sequence[ReportRow]) -> list[str]:
    """Accuracy per domain of the runs that recorded it; nothing when none did."""
    with_domains = [row for row in rows if row.domain_acc]
    if not with_domains:
        return []
    domains: list[str] = []
    for row in with_domains:  # columns in the order the runs name their domains
        domains += [name for name in row.domain_acc if name not in domains]
    body = [[table_cell(row.run)] + [fmt_acc(row.domain_acc.get(name)) for name in domains] for row in with_domains]
    return ["", "## Accuracy per domain (last round)", "", markdown_table(["run", *map(table_cell, domains)], body)]


def _mechanism_section(rows: Sequence[ReportRow]) -> list[str]:
    """The seed methods' mechanism figures the runs recorded (last round); nothing when none did."""
    with_figures = [row for row in rows if row.mechanism]
    if not with_figures:
        return []
    names = [name for name in MECHANISM_FIGURES if any(name in row.mechanism for row in with_figures)]
    body = [
        [table_cell(row.run)]
        + [MISSING if name not in row.mechanism else f"{row.mechanism[name]:.4g}" for name in names]
        for row in with_figures
    ]
    return ["", "## The methods' mechanisms (last round)", "", markdown_table(["run", *names], body)]


def _paired_section(rows: Sequence[ReportRow], paired_against: str | None) -> list[str]:
    if paired_against is None:
        return []
    groups = group_by_seed(rows)
    return paired_section(groups, select_reference(groups, paired_against))


def render_markdown(rows: Sequence[ReportRow], figure: str | None = None, paired_against: str | None = None) -> str:
    """The report's markdown: title, target line, main table, seed table, paired table (when
    ``paired_against`` names a reference setting, see :func:`select_reference`), per-domain table, figure link.

    Raises
    ------
    DataError
        When ``paired_against`` names no reported setting, or more than one.
    """
    parts = [
        f"# Federated run report ({plural(len(rows), 'run')})",
        "",
        "Rounds are completed / configured (num-rounds). Accuracies are of the last round (mean / worst / std over "
        "evaluated clients); bytes/round is the mean training traffic (up + down) per round, in base-1024 units like "
        f"total MB. {_target_line(rows)}",
        "",
        _main_table(rows),
        *_seed_section(rows),
        *_paired_section(rows, paired_against),
        *_domain_section(rows),
        *_mechanism_section(rows),
    ]
    if figure:
        parts += ["", f"![mean accuracy vs round and vs MB]({figure})"]
    return "\n".join(parts) + "\n"


def figure_panels(rows: Sequence[ReportRow]) -> list[Panel]:
    """The report figure's two panels: mean client accuracy against round (integer ticks) and
    against cumulative MB (log axis; a run that sent nothing cannot be placed there, and the
    panel names it), a line per run, and the target line when the runs share one target."""
    from fedapp.data.figures import MB_AXIS, ROUND_AXIS, Curve, Panel  # noqa: PLC0415 - matplotlib's helpers

    targets = {row.target for row in rows}
    target = targets.pop() if len(targets) == 1 else None
    colours = [f"C{index % 10}" for index in range(len(rows))]  # a run keeps its colour in both panels
    by_round = [
        Curve(row.curve_rounds, row.curve_acc_mean, row.run, color=colour)
        for row, colour in zip(rows, colours, strict=True)
    ]
    sends = [any(mb > 0 for mb in row.curve_mb) for row in rows]
    by_mb = [
        Curve(row.curve_mb, row.curve_acc_mean, row.run, color=colour)
        for row, colour, sent in zip(rows, colours, sends, strict=True)
        if sent
    ]
    silent = [row.run for row, sent in zip(rows, sends, strict=True) if not sent]
    note = f"sent nothing (0 MB), not shown: {', '.join(silent)}" if silent else ""
    return [
        Panel("mean accuracy vs round", "round", by_round, ROUND_AXIS, target=target),
        Panel(
            "mean accuracy vs communication",
            "MB communicated (cumulative, log)",
            by_mb,
            MB_AXIS,
            target=target,
            note=note,
        ),
    ]


def write_figure(rows: Sequence[ReportRow], path: Path) -> Path:
    """One PNG, two panels (:func:`figure_panels`): mean client accuracy against round and against cumulative MB."""
    return save_accuracy_figure(path, figure_panels(rows), software=REPORT_TOOL)


def check_outputs(run_dirs: Sequence[Path], out: Path, figure: Path | None) -> None:
    """Refuse, before anything is written, outputs that would lose something: a folder named
    as a file, a path under a file, the same file twice, an existing file inside one of
    the run folders being reported (its metrics, summary, config, checkpoint, models...), or
    anywhere an existing file that is not a report or figure this tool wrote.

    Raises
    ------
    DataError, ConfigError
        Naming the option and the path.
    """
    outputs = [("--out", Path(out))] + ([("--figure", Path(figure))] if figure is not None else [])
    if figure is not None and Path(out).resolve() == Path(figure).resolve():
        raise DataError(f"--out and --figure both name {out}: give the figure another file")
    runs = [Path(run).resolve() for run in run_dirs]
    for flag, path in outputs:
        if path.is_dir():
            raise DataError(f"{flag} {path} is a folder: name a file in it, e.g. {path / ('report' + path.suffix)}")
        blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
        if blocking is not None:
            raise DataError(f"{flag} {path}: {blocking} is a file, not a folder")
        resolved = path.resolve()
        for run in runs:
            if path.exists() and resolved.is_relative_to(run):
                raise DataError(
                    f"{flag} {path} would overwrite {resolved.relative_to(run)} of run folder {run}: "
                    "name a file that does not exist yet"
                )
        check_rewritable(path, REPORT_TOOL, flag)  # anywhere else: only a report or figure it wrote itself


def write_report(
    run_dirs: Iterable[Path],
    out: Path,
    figure: Path | None,
    target: float | None,
    paired_against: str | None = None,
) -> str:
    """Write the markdown report of ``run_dirs`` to ``out`` (and the figure, unless ``figure`` is None).

    Parameters
    ----------
    run_dirs : Iterable[Path]
        Run folders (see :func:`fedapp.report.runs.expand_run_dirs` for folders of run folders).
    out : Path
        The markdown file to write; its folder is created.
    figure : Path | None
        The PNG to write; the markdown links it relative to ``out``'s folder.
    target : float | None
        Mean accuracy to time the runs to; None: each run's own ``target-accuracy``.
    paired_against : str | None
        The reference setting of the paired table (``"fedproto lr=0.05"``); None: no paired table.

    Returns
    -------
    str
        The markdown written.
    """
    rows = report_rows(run_dirs, target)
    out = Path(out)
    link = None
    if figure is not None:
        link = Path(os.path.relpath(Path(figure).resolve(), out.resolve().parent)).as_posix()
    markdown = render_markdown(rows, link, paired_against)  # a bad reference fails here, before any file is written
    if figure is not None:
        write_figure(rows, Path(figure))
    markdown = mark_markdown(markdown, REPORT_TOOL)  # the file says which tool may rewrite it
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown)
    return markdown
