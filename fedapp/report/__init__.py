"""A markdown report and one figure comparing finished run folders.

Every run leaves ``<results-dir>/<run-name>/`` with ``config.yaml``, ``metrics.jsonl`` and
``summary.json`` (see :mod:`fedapp.metrics`). This package reads only those files, so it works on
runs from any machine and any version that wrote them (config keys added later are optional)::

    fedapp-report results/ --out report.md --figure report.png --target 0.8

The table has one row per run: protocol, rounds completed / configured, final mean / worst / std client accuracy, the
generalization number the run measured (held-out clients, or base-to-novel), communication and
the rounds and seconds it took to reach the target accuracy; a second table gives per-domain
accuracy when runs recorded it.

Its parts, each importable from here:

* :mod:`fedapp.report.tables`: number and cell formats, markdown tables (the benchmarks use them too);
* :mod:`fedapp.report.protocol`: the protocol column, from a run's config;
* :mod:`fedapp.report.runs`: run folders read into :class:`ReportRow`;
* :mod:`fedapp.report.seeds`: runs that differ only in seed, as mean ± std;
* :mod:`fedapp.report.paired`: every setting minus a reference setting, seed by seed;
* :mod:`fedapp.report.render`: the markdown, the figure and the files written;
* :mod:`fedapp.report.cli`: the ``fedapp-report`` command line (also ``python -m fedapp.report``).
"""

from fedapp.report.cli import main
from fedapp.report.paired import PAIRED_HEADER, render_paired_table, select_reference
from fedapp.report.protocol import describe_protocol
from fedapp.report.render import MAIN_HEADER, figure_panels, render_markdown, write_figure, write_report
from fedapp.report.runs import MECHANISM_FIGURES, REQUIRED_METRICS, ReportRow, expand_run_dirs, load_run, report_rows
from fedapp.report.seeds import SEED_HEADER, SeedGroup, group_by_seed, render_seed_table
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
)

__all__ = [
    "FIGURE_COLUMNS",
    "MAIN_HEADER",
    "MECHANISM_FIGURES",
    "MISSING",
    "NOT_REACHED",
    "PAIRED_HEADER",
    "REQUIRED_METRICS",
    "SEED_HEADER",
    "ReportRow",
    "SeedGroup",
    "describe_protocol",
    "expand_run_dirs",
    "figure_panels",
    "fmt_bytes",
    "fmt_count",
    "fmt_mean_std",
    "fmt_rounds",
    "group_by_seed",
    "load_run",
    "main",
    "markdown_table",
    "mean_std",
    "render_markdown",
    "render_paired_table",
    "render_seed_table",
    "report_rows",
    "select_reference",
    "write_figure",
    "write_report",
]
