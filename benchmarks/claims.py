"""The papers' claims, tested here: every table of ``benchmarks/CLAIMS.md`` and the README's claim
table, made from the run records in ``claims/records/`` by one rule (:mod:`fedapp.report.verdict`).

    python benchmarks/claims.py tables                 # print every family's tables
    python benchmarks/claims.py tables --family c      # one family's
    python benchmarks/claims.py tables --write         # write them into CLAIMS.md and README.md
    python benchmarks/claims.py tables --check         # exit 1 when a page differs from the records

Each family is a file ``claims/family-<x>.yaml``: its settings (the config keys a record must
hold), its groups (a partition or α; each adds keys), how its paper scores a run, and its claims
("a beats b", each with the paper's figure). A record is a run folder (``config.yaml``,
``metrics.jsonl``, ``summary.json``); a run matches a setting when every key the setting and the
group name has that value (keys a record lacks take today's default). Two records of one setting
and seed are an error, never a silent choice.

The pages hold each table between ``<!-- claims:<name> -->`` and ``<!-- /claims:<name> -->``;
``--write`` replaces only what lies between, ``--check`` compares it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from claims_spec import (
    HEADLINE_SEEDS,
    OTHER_SEEDS,
    PAGES,
    RECORD_FILES,
    ROOT,
    ClaimsError,
    Family,
    families,
    load_family,
    read_selections,
)
from claims_tables import blocks, costs_block, family_block, replace_block

from fedapp.sweep import SWEEP_TOOL

__all__ = ["ClaimsError", "costs_block", "family_block", "load_family", "main", "run_family"]

#: How many times a selection grid goes on past the edge its choice sat on.
MAX_EXTENSIONS = 3

# ----- the runs: selection on its seed, then every setting a claim needs on the reported seeds -----


def toml_value(value: Any) -> str:
    """A value as Flower's ``--run-config`` and the sweep's ``--grid`` read it (TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def overrides(keys: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={toml_value(value)}" for key, value in keys.items() if key != "method")


@dataclass(frozen=True)
class Step:
    """One sweep of the family's queue: what it runs, and where its results go."""

    what: str
    argv: tuple[str, ...]
    results_dir: Path
    selection: bool = False
    method: str = ""
    grid: Mapping[str, list[Any]] = field(default_factory=dict)


def plan(family: Family, results: Path, run_config: str, cpus_per_client: int) -> list[Step]:
    """The family's queue: each method's selection grid on the selection seed (when the family
    chooses anything), then, once chosen, each setting a claim compares on the reported seeds
    (the headline's settings first, on 5 seeds; the others on 3)."""
    common = ["--preset", family.preset, "--cpus-per-client", str(cpus_per_client)]
    steps = [
        selection_step(family, method, grid, results, run_config, cpus_per_client)
        for method, grid in family.select_grids.items()
    ]
    needed: dict[tuple[str, str], int] = {}
    for claim in sorted(family.claims, key=lambda c: not c.headline):
        for group in claim.groups or tuple(family.groups):
            for side in (claim.a, claim.b):
                seeds = HEADLINE_SEEDS if claim.headline else OTHER_SEEDS
                needed[(side, group)] = max(needed.get((side, group), 0), seeds)
    where = results / f"family-{family.name}"
    for (setting, group), seeds in needed.items():
        keys = family.resolved(setting)
        if keys is None:
            steps.append(Step(f"{setting} ({group}): waits for the selection", (), where))
            continue
        argv = [*common, "--results-dir", str(where), "--methods", str(keys["method"])]
        argv += ["--seeds", ",".join(map(str, range(seeds)))]
        argv += ["--run-config", f"{overrides({**keys, **family.groups[group]})} {run_config}".strip()]
        steps.append(Step(f"{setting} ({group})", tuple(argv), where))
    return steps


def selection_step(
    family: Family, method: str, grid: Mapping[str, list[Any]], results: Path, run_config: str, cpus_per_client: int
) -> Step:
    """One method's selection sweep over ``grid`` on the family's selection seed, chosen on validation."""
    where = results / f"family-{family.name}" / f"selection-{method}"
    argv = ["--preset", family.preset, "--cpus-per-client", str(cpus_per_client), "--results-dir", str(where)]
    argv += ["--methods", method, "--seeds", str(family.select_seed)]
    for key, values in grid.items():
        argv += ["--grid", f"{key}={toml_value(list(values))}"]
    argv += ["--run-config", f"{overrides(family.groups[family.select_group])} {run_config}".strip()]
    argv += ["--select", "--select-last-rounds", str(family.last_rounds)]
    return Step(f"select {method}", tuple(argv), where, selection=True, method=method, grid=dict(grid))


def beyond_the_edge(grid: Mapping[str, list[Any]], chosen: Mapping[str, Any]) -> dict[str, list[Any]] | None:
    """``grid`` with one more point past the edge its choice sat on (the same ratio as the last step
    there), or None when every numeric axis's choice is inside its grid: a choice at an edge is no optimum."""
    for key, values in grid.items():
        numbers = sorted(v for v in values if isinstance(v, int | float) and not isinstance(v, bool) and v > 0)
        if len(numbers) < 2 or len(numbers) != len(values) or chosen.get(key) not in (numbers[0], numbers[-1]):
            continue
        low = chosen[key] == numbers[0]
        nearest, next_in = (numbers[0], numbers[1]) if low else (numbers[-1], numbers[-2])
        beyond = float(f"{nearest * nearest / next_in:.3g}")
        return {**grid, key: sorted([*values, beyond])}
    return None


def copy_records(results_dir: Path, target: Path) -> list[str]:
    """Each finished run in ``results_dir`` into ``target`` (its three record files), unless there."""
    copied = []
    for summary in sorted(results_dir.glob("*/summary.json")):
        run = summary.parent
        config = yaml.safe_load((run / "config.yaml").read_text())
        if json.loads(summary.read_text()).get("rounds", 0) < int(config["num-rounds"]):
            continue
        destination = target / run.name
        if destination.exists():
            continue
        destination.mkdir(parents=True)
        for name in RECORD_FILES:
            shutil.copy2(run / name, destination / name)
        copied.append(run.name)
    return copied


def merge_selection(step: Step, family: Family) -> dict[str, Any]:
    """The method's choice into the family's ``selection.json`` (one entry per method); returns it."""
    [entry] = read_selections(step.results_dir / "selection.json")
    path = family.selection_dir / "selection.json"
    entries = [e for e in (read_selections(path) if path.is_file() else []) if e["method"] != entry["method"]]
    order = list(family.select_grids)
    entries = sorted([*entries, entry], key=lambda e: order.index(e["method"]) if e["method"] in order else len(order))
    path.write_text(json.dumps({"written_by": SWEEP_TOOL, "selections": entries}, indent=2) + "\n")
    return dict(entry["chosen"])


def run_family(family: Family, results: Path, run_config: str, cpus_per_client: int, dry_run: bool) -> int:
    """Run the family's queue (each step a resumable sweep): the selection first, then the settings
    with the chosen values; each finished run's records go into the family's records folder as its
    step ends. Returns the number of steps whose sweep reported a failure."""
    from fedapp import sweep  # noqa: PLC0415 - the tables need no Flower; only the runs start one

    failures = 0
    for step in [step for step in plan(family, results, run_config, cpus_per_client) if step.selection]:
        for _ in range(MAX_EXTENSIONS + 1):
            failures += _run_step(step, family, sweep.main, dry_run)
            if dry_run or not (step.results_dir / "selection.json").is_file():
                break
            chosen = merge_selection(step, family)
            wider = beyond_the_edge(step.grid, chosen)
            if wider is None:
                break
            print(f"[claims] {step.method}: chose {chosen} at the edge of its grid; the grid goes on to {wider}")
            step = selection_step(family, step.method, wider, results, run_config, cpus_per_client)
    # Planned once the selection has chosen: the settings that take its values need them.
    for step in [step for step in plan(family, results, run_config, cpus_per_client) if not step.selection]:
        failures += _run_step(step, family, sweep.main, dry_run)
    return failures


def _run_step(step: Step, family: Family, run_sweep: Callable[[list[str]], int], dry_run: bool) -> int:
    """One step: its sweep, then its finished runs' records copied; 1 when the sweep failed."""
    if not step.argv:
        print(f"[claims] {step.what}", flush=True)
        return 0
    print(f"[claims] {step.what}: python -m fedapp.sweep {shlex.join(step.argv)}", flush=True)
    if dry_run:
        return 0
    target = family.selection_dir if step.selection else family.records
    _prefill(target, step.results_dir)
    failed = run_sweep(list(step.argv)) != 0
    print(f"[claims] records added: {', '.join(copy_records(step.results_dir, target)) or 'none'}", flush=True)
    return int(failed)


def _prefill(records: Path, results_dir: Path) -> None:
    """Put the records already in the repository where the sweep looks, so that it skips them."""
    for config in sorted(records.glob("*/config.yaml")) if records.is_dir() else []:
        destination = results_dir / config.parent.name
        if not destination.exists():
            shutil.copytree(config.parent, destination)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tables = sub.add_parser("tables", help="the tables, from the records")
    tables.add_argument("--family", action="append", default=[], help="one family (a, b, c, d); repeatable")
    mode = tables.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the tables into CLAIMS.md and README.md")
    mode.add_argument("--check", action="store_true", help="exit 1 when a page's table differs from the records'")
    run = sub.add_parser("run", help="a family's runs, from nothing to its records (resumable)")
    run.add_argument("--family", required=True, help="a, b, c or d")
    run.add_argument("--run-config", default="", help="'key=value ...' for every run: data-dir, pretrained, device")
    run.add_argument("--results-dir", type=Path, default=Path("results/claims"), help="where the sweeps run")
    run.add_argument("--cpus-per-client", type=int, default=1)
    run.add_argument("--dry-run", action="store_true", help="print the queue's sweeps and stop")
    return parser


def write_tables(names: Sequence[str], write: bool, check: bool) -> int:
    made = blocks(families(names))
    if not (write or check):
        print("\n\n".join(f"<!-- claims:{name} -->\n{text}" for (_, name), text in made.items()))
        return 0
    stale = []
    for page_name, page in PAGES.items():
        text = page.read_text()
        new = text
        for (where, name), content in made.items():
            if where == page_name:
                new = replace_block(new, name, content, page)
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if write:
                page.write_text(new)
    if check and stale:
        rerun = "python benchmarks/claims.py tables --write"
        print(f"error: {', '.join(stale)} differ from the records' tables: run {rerun}", file=sys.stderr)
        return 1
    print(("written: " if write else "up to date: ") + (", ".join(stale) or "nothing changed"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "tables":
            return write_tables(args.family, args.write, args.check)
        [family] = families([args.family])
        failures = run_family(family, args.results_dir, args.run_config, args.cpus_per_client, args.dry_run)
    except ClaimsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if failures:
        print(f"error: {failures} step(s) had a failed run; the same command continues with them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
