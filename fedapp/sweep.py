"""Run a grid of simulations (methods x settings x seeds) on one local SuperLink, resumably.

    python -m fedapp.sweep --preset conf/sdfed-digits.yaml --methods sdfed,promptfl --seeds 0,1,2 \\
        --grid 'partition=["pathological","dirichlet"]' --run-config 'num-rounds=5' --results-dir results/sweep-a

Every run gets its own folder in ``--results-dir``, named by its method, its grid values, a
digest of all its other settings and its seed (``sdfed-partitionpathological-3f2a9c-s0``): two runs
never share a folder, and repetitions share all but the ``-s<seed>`` tail. Every run is validated before
the first starts; all go, one after another, to one local SuperLink in a temporary Flower home and one
Ray (:mod:`fedapp.launch.ray_head`): their start-up is paid once; both stop when the sweep ends.

Started again, a sweep skips finished runs, resumes a run that has a checkpoint (``resume=true``),
and moves an earlier attempt aside (``<name>.incomplete-<n>``) instead of writing over it when it
left no checkpoint, or when its clients kept personal state in memory (``state = "memory"``), which
ended with that attempt (``state="disk"`` in ``--run-config`` makes such runs resumable). A failing
run is reported and the sweep goes on. ``report.md`` and ``report.png`` then tabulate the finished
runs, mean ± std over seeds (``fedapp-report``).

With ``--select``, the sweep chooses each method's grid point on validation data
(:mod:`fedapp.report.selection`: the clients' accuracy on data of their own held back from training,
over the last ``--select-last-rounds`` rounds and the seeds), records it in ``selection.json`` and
``selection.md``, and reports the chosen points' runs only: no other point's test accuracy is read.
Run the grid on a seed no reported figure uses, then the chosen point on the reported seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib
import yaml

from fedapp.config import resume_loses_personal_state, same_setting_key, settings_digest
from fedapp.errors import ConfigError, FedAppError
from fedapp.launch import (
    PreparedRun,
    check_client_resources,
    cpus_to_check,
    local_federation,
    parse_overrides,
    prepare_run,
    submit,
)
from fedapp.launch.data_check import check_runs_data
from fedapp.launch.ray_head import shared_ray
from fedapp.report import expand_run_dirs, write_report
from fedapp.report.render import REPORT_TOOL
from fedapp.report.selection import Candidate, render_selection, select
from fedapp.runfolder import (
    check_rewritable,
    check_writable_folders,
    is_set_aside,
    lock_results_folder,
    mark_markdown,
    nothing_to_resume,
    set_aside,
)

__all__ = ["SweepRun", "parse_grid", "plan_sweep", "run_sweep"]

SWEEP_TOOL = "fedapp.sweep"
"""The mark of the selection files the sweep writes (its report is the report's: ``fedapp-report``)."""


@dataclass(frozen=True)
class SweepRun:
    """One point of the grid, validated: its folder name and its prepared run, the method and
    grid values it runs (what a selection compares) and its seed."""

    name: str
    prepared: PreparedRun
    method: str = ""
    point: tuple[tuple[str, Any], ...] = ()


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``['lr=[0.01, 0.03]', 'partition="iid"']`` -> ``{'lr': [0.01, 0.03], 'partition': ['iid']}``.

    Each item is ``key=<TOML value>``; an array gives the axis' values (a value repeated counts
    once), anything else one value.

    Raises
    ------
    ConfigError
        For an item that is not ``key=value``, a value that is not TOML, an empty
        array, or a key given twice.
    """
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--grid {item!r} is not key=value (e.g. 'lr=[0.01, 0.03]')")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"--grid {item!r}: {raw.strip()!r} is not a TOML value or array ({err})") from err
        values = value if isinstance(value, list) else [value]
        # A value repeated is one point: run once, never a second run of the same folder.
        values = list({json.dumps(v, sort_keys=True): v for v in values}.values())
        if not values:
            raise ConfigError(f"--grid {item!r} gives no values")
        if key in grid:
            raise ConfigError(f"--grid names {key!r} twice; give all its values in one array")
        grid[key] = values
    return grid


def _slug(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")[:40] or "_"


def plan_sweep(
    base: dict[str, Any],
    *,
    methods: Sequence[str] = (),
    seeds: Sequence[int] = (0,),
    grid: dict[str, list[Any]] | None = None,
    results_dir: Path,
) -> list[SweepRun]:
    """Every run of the grid, validated, in order (method, then grid values, then seed).

    Parameters
    ----------
    base : dict
        Run-config overrides shared by every run (``preset`` included).
    methods : Sequence[str]
        Methods to run; empty: the one ``base`` (or its preset) names.
    seeds : Sequence[int]
        Seeds every setting runs with.
    grid : dict[str, list], optional
        Further axes: key -> values (see :func:`parse_grid`).
    results_dir : Path
        Where the run folders go.

    Raises
    ------
    ConfigError
        If any run's configuration is invalid (naming the run), or a key is both
        an axis and set by the flags that own it.
    """
    grid = dict(grid or {})
    for owned in ("method", "seed", "run-name", "results-dir"):
        if owned in grid:
            raise ConfigError(f"--grid {owned}=...: set {owned!r} with its own flag, not as a grid axis")
    if not seeds:
        raise ConfigError("--seeds gives no seed")
    axes = list(grid)
    existing = _existing_runs(Path(results_dir))
    return [
        _plan_run(base, method, dict(zip(axes, values, strict=True)), seed, Path(results_dir), existing)
        for method in methods or [None]
        for values in itertools.product(*(grid[key] for key in axes))
        for seed in seeds
    ]


def _plan_run(
    base: dict[str, Any],
    method: str | None,
    point: dict[str, Any],
    seed: int,
    results_dir: Path,
    existing: dict[tuple[str, int], str],
) -> SweepRun:
    """One run of the grid: ``base`` with the method, grid values and seed, validated and named.

    Raises
    ------
    ConfigError
        If the run's configuration is invalid; the message names the run's method, grid values and seed.
    """
    overrides = {**base, **point, "seed": int(seed), "results-dir": str(results_dir.resolve())}
    if method is not None:
        overrides["method"] = method
    label = ", ".join(f"{k}={v}" for k, v in {"method": method, **point, "seed": seed}.items() if v is not None)
    try:
        prepared = prepare_run(overrides)
        check_writable_folders(prepared.config.values, simulation=True)  # every run's, before the first starts
    except ConfigError as err:
        raise ConfigError(f"sweep run ({label}): {err}") from err
    config = prepared.config.as_dict()
    name = "-".join(
        [str(config["method"])]
        + [f"{key}{_slug(value)}" for key, value in point.items()]
        + [settings_digest(config), f"s{seed}"]
    )
    if not (results_dir / name).exists():
        # The same run made by an earlier version, under the name that version gave it.
        name = existing.get((same_setting_key(config), int(seed)), name)
    return SweepRun(
        name=name,
        prepared=prepare_run({**prepared.overrides, "run-name": name}),
        method=str(config["method"]),
        point=tuple(point.items()),
    )


def _existing_runs(results_dir: Path) -> dict[tuple[str, int], str]:
    """``(setting, seed) -> folder name`` of the run folders already in ``results_dir``."""
    index: dict[tuple[str, int], str] = {}
    if not results_dir.is_dir():
        return index
    for folder in sorted(results_dir.iterdir()):
        config_path = folder / "config.yaml"
        if is_set_aside(folder) or not config_path.is_file():
            continue
        try:
            config = yaml.safe_load(config_path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(config, dict):
            index.setdefault((same_setting_key(config), int(config.get("seed", 0))), folder.name)
    return index


def _finished(run: SweepRun) -> bool:
    return nothing_to_resume(run.prepared.run_dir, run.prepared.config.num_rounds) is not None


def run_sweep(
    runs: Sequence[SweepRun], *, cpus_per_client: int = 1, timeout: float | None = None
) -> tuple[list[Path], list[tuple[str, str]]]:
    """Run what is not finished yet on one local SuperLink.

    Returns
    -------
    tuple[list[Path], list[tuple[str, str]]]
        The folders of the finished runs (skipped ones included), and ``(name, error)``
        for every run that failed.
    """
    finished: list[Path] = []
    failed: list[tuple[str, str]] = []
    pending = []
    for run in runs:
        if _finished(run):
            print(f"[sweep] {run.name}: finished before, skipped", flush=True)
            finished.append(run.prepared.run_dir)
        else:
            pending.append(run)
    if not pending:
        return finished, failed
    check_runs_data([run.prepared.overrides for run in pending], [f"sweep run {run.name}" for run in pending])
    with local_federation() as env, contextlib.ExitStack() as stack:
        if len(pending) > 1:  # Ray's services start once for the sweep, not once a run
            env = stack.enter_context(shared_ray(env))
            print(f"[sweep] {len(pending)} runs share one Ray (RAY_ADDRESS={env['RAY_ADDRESS']})", flush=True)
        for number, run in enumerate(pending, start=1):
            prepared = run.prepared
            checkpointed = (prepared.run_dir / "checkpoint.npz").is_file()
            if checkpointed and not resume_loses_personal_state(prepared.config):
                prepared = prepare_run({**prepared.overrides, "resume": True})
                how = "resuming from its checkpoint"
            elif prepared.run_dir.exists():
                lost = "; its clients' personal state was in memory, which a resume cannot bring back"
                why = lost if checkpointed else ""
                how = f"starting again (the earlier attempt moved to {set_aside(prepared.run_dir).name}{why})"
            else:
                how = "starting"
            print(f"[sweep] run {number}/{len(pending)} {run.name}: {how}", flush=True)
            started = time.perf_counter()
            try:
                finished.append(submit(prepared, env, cpus_per_client=cpus_per_client, timeout=timeout))
            except (FedAppError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
                failed.append((run.name, str(err)))
                print(f"[sweep] {run.name} failed: {err}", flush=True)
                continue
            print(f"[sweep] {run.name}: done in {time.perf_counter() - started:.0f} s", flush=True)
    return finished, failed


def write_selection(
    runs: Sequence[SweepRun], finished: Sequence[Path], results_dir: Path, last_rounds: int
) -> list[Path]:
    """Choose each method's point on validation (:func:`fedapp.report.selection.select`) among the
    finished runs, write ``selection.json`` and ``selection.md`` into ``results_dir``, and return
    the chosen points' run folders."""
    done = {path.resolve() for path in finished}
    grouped: dict[tuple[str, tuple[tuple[str, Any], ...]], list[Path]] = {}
    for run in runs:
        if run.prepared.run_dir.resolve() in done:
            grouped.setdefault((run.method, run.point), []).append(run.prepared.run_dir)
    candidates = [Candidate(method, dict(point), tuple(dirs)) for (method, point), dirs in grouped.items()]
    selections = select(candidates, last_rounds)
    record = {"written_by": SWEEP_TOOL, "selections": [sel.as_dict() for sel in selections]}
    (results_dir / "selection.json").write_text(json.dumps(record, indent=2) + "\n")
    (results_dir / "selection.md").write_text(mark_markdown(render_selection(selections), SWEEP_TOOL))
    for selection in selections:
        chosen = selection.chosen
        print(f"[sweep] {selection.method}: chose {dict(chosen.candidate.point)} (val acc {chosen.score:.4f})")
    return [path for selection in selections for path in selection.chosen.candidate.run_dirs]


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError as err:
        raise ConfigError(f"{flag} {text!r} is not a comma list of integers") from err


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, required=True, help="folder of the sweep's run folders")
    parser.add_argument("--preset", help="YAML preset every run starts from")
    parser.add_argument("--methods", default="", help="comma list (default: the preset's or config's method)")
    parser.add_argument("--seeds", default="0", help="comma list of seeds (default 0)")
    parser.add_argument("--grid", action="append", default=[], help="an axis: 'key=[v1, v2]' (repeatable)")
    parser.add_argument("--run-config", action="append", default=[], help="Flower-style 'key=value ...' for all runs")
    parser.add_argument("--cpus-per-client", type=int, default=1)
    parser.add_argument("--timeout", type=float, help="seconds one run may take before it is stopped")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    parser.add_argument(
        "--select",
        action="store_true",
        help="choose each method's grid point on the clients' validation accuracy (selection.json, selection.md)",
    )
    parser.add_argument(
        "--select-last-rounds", type=int, default=1, help="rounds at the end of each run the selection averages"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        check_client_resources(args.cpus_per_client, 0.0, cpus_available=cpus_to_check())
        if args.select_last_rounds < 1:
            raise ConfigError(f"--select-last-rounds {args.select_last_rounds}: must be at least 1")
        base = parse_overrides(args.run_config)
        for owned in ("run-name", "results-dir", "seed", "method"):
            if owned in base and (owned != "method" or args.methods):
                raise ConfigError(f"--run-config sets {owned!r}, which the sweep sets for every run; drop it")
        if args.preset:
            base["preset"] = args.preset
        # The files the sweep writes at its end: refused now, not after hours of runs.
        for name in ("report.md", "report.png") + (("selection.json", "selection.md") if args.select else ()):
            tool = REPORT_TOOL if name.startswith("report") else SWEEP_TOOL
            check_rewritable(args.results_dir / name, tool, f"the sweep's {name.split('.')[0]}")
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        runs = plan_sweep(
            base,
            methods=methods,
            seeds=_int_list(args.seeds, "--seeds"),
            grid=parse_grid(args.grid),
            results_dir=args.results_dir,
        )
        print(f"[sweep] {len(runs)} runs into {args.results_dir.resolve()}", flush=True)
        if args.dry_run:
            print("\n".join(run.name for run in runs))
            return 0
        lock = lock_results_folder(args.results_dir)
    except FedAppError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with lock:
        return _run_and_report(runs, args)


def _run_and_report(runs: Sequence[SweepRun], args: argparse.Namespace) -> int:
    """Run the planned sweep, then write its report (and, with ``--select``, its selection)."""
    try:
        finished, failed = run_sweep(runs, cpus_per_client=args.cpus_per_client, timeout=args.timeout)
    except FedAppError as err:  # a run's data refused, or Ray not started, before the first run started
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the running launch stops its processes on the way out
        print("error: interrupted; finished runs are kept; the same command continues with the rest", file=sys.stderr)
        return 128 + signal.SIGINT
    reported = finished
    if finished and args.select:
        try:
            reported = write_selection(runs, finished, args.results_dir, args.select_last_rounds)
        except FedAppError as err:
            print(f"error: no selection: {err}", file=sys.stderr)
            return 1
    if reported:
        out = args.results_dir / "report.md"
        write_report(expand_run_dirs(reported), out, args.results_dir / "report.png", None)
        print(f"[sweep] {len(finished)} of {len(runs)} runs finished; report: {out}")
    for name, error in failed:
        print(f"[sweep] FAILED {name}: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
