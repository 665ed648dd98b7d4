"""The command line: ``fedapp-report`` (and ``python -m fedapp.report``)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from fedapp.errors import FedAppError
from fedapp.extras import MATPLOTLIB, require
from fedapp.report.render import check_outputs, write_report
from fedapp.report.runs import expand_run_dirs


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``fedapp-report RUN_DIR [RUN_DIR ...] [--out F] [--figure F] [--target ACC] [--paired-against R]``.

    Returns
    -------
    int
        0 when the report was written; 2 when a run folder or the output could not be read or written
        (nothing is written then); 130 when interrupted.
    """
    parser = argparse.ArgumentParser(
        prog="fedapp-report", description="Tabulate and plot finished run folders (config.yaml + metrics.jsonl)."
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run folders, or folders of run folders")
    parser.add_argument("--out", type=Path, default=Path("report.md"), help="markdown file (default: report.md)")
    parser.add_argument(
        "--figure", default=None, help='PNG file (default: the --out file with .png, beside it; "" skips it)'
    )
    parser.add_argument("--target", type=float, help="mean accuracy to time runs to (default: each run's own)")
    parser.add_argument(
        "--paired-against",
        metavar="REFERENCE",
        help="add a table of every setting minus this one, seed by seed: a method, then key=value to pick "
        "one setting of it (e.g. 'fedproto lr=0.05')",
    )
    args = parser.parse_args(argv)
    if args.target is not None and not 0.0 <= args.target <= 1.0:
        parser.error(f"--target {args.target} is not an accuracy in [0, 1]")
    figure = None if args.figure == "" else Path(args.figure) if args.figure else args.out.with_suffix(".png")
    try:
        if figure is not None:  # before any file is read or written
            require(MATPLOTLIB, 'fedapp-report\'s figure (--figure "" skips it)')
        run_dirs = expand_run_dirs(args.run_dirs)
        check_outputs(run_dirs, args.out, figure)  # before anything is written
        markdown = write_report(run_dirs, args.out, figure, args.target, args.paired_against)
    except (FedAppError, OSError) as error:
        print(f"fedapp-report: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedapp-report: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    print(markdown, end="")
    return 0
