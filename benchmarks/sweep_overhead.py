"""What a sweep pays around its rounds: one launch against a sweep of ``--runs`` such launches.

    python benchmarks/sweep_overhead.py                            # 5 one-round FedAvg runs (issue 65)
    python benchmarks/sweep_overhead.py --checkout /tmp/before     # the same, on another checkout's code
    python benchmarks/sweep_overhead.py --smoke                    # 2 runs of 2 clients (CI): nothing asserted

Runs ``python -m fedapp.launch`` once (seed 0) and then ``python -m fedapp.sweep`` over seeds
0..runs-1 of the same run (FedAvg on digits, 10 clients, ``--rounds`` rounds by default 1), each in a
temporary folder, and reads every run's round seconds from its ``metrics.jsonl``. Prints the launch's
wall time and its start-up (the wall time less its rounds), the sweep's wall time and the sum of its
runs' rounds, the budget "``--runs`` times the launch's rounds plus one start-up" and the sweep's wall
time over it (1.0: a run of the sweep pays nothing but what a launch's rounds take). ``--out`` writes
the figures as JSON. ``--checkout`` runs the commands with another checkout's code (``PYTHONPATH``),
for a figure before a change.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedapp.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent


def _timed(command: list[str], checkout: Path, timeout: float) -> float:
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
    }
    started = time.perf_counter()
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def _round_seconds(run_dir: Path) -> float:
    return sum(float(row["round_seconds"]) for row in read_metrics(run_dir / "metrics.jsonl"))


def measure(checkout: Path, runs: int, run_config: str, num_clients: int | None, timeout: float) -> dict:
    """The launch's and the sweep's wall times and rounds, in seconds."""
    clients = ["--num-clients", str(num_clients)] if num_clients else []
    with tempfile.TemporaryDirectory(prefix="fedapp-sweep-overhead-") as folder:
        one = Path(folder) / "one"
        launch = [sys.executable, "-m", "fedapp.launch", *clients]
        launch += ["--run-config", f'{run_config} method="fedavg" seed=0 results-dir="{one}" run-name="launch"']
        launch_wall = _timed(launch, checkout, timeout)
        launch_rounds = _round_seconds(one / "launch")
        sweep_dir = Path(folder) / "sweep"
        seeds = ",".join(str(seed) for seed in range(runs))
        sweep = [sys.executable, "-m", "fedapp.sweep", "--results-dir", str(sweep_dir), "--methods", "fedavg"]
        sweep += ["--seeds", seeds, "--run-config", run_config]
        sweep_wall = _timed(sweep, checkout, timeout * runs)
        per_run = [_round_seconds(path.parent) for path in sorted(sweep_dir.glob("*/summary.json"))]
    if len(per_run) != runs:
        raise SystemExit(f"the sweep finished {len(per_run)} of {runs} runs")
    start_up = launch_wall - launch_rounds
    budget = runs * launch_rounds + start_up  # issue 65: "5x one run's rounds plus one start-up"
    return {
        "checkout": str(checkout),
        "runs": runs,
        "run_config": run_config,
        "launch_wall_s": round(launch_wall, 1),
        "launch_rounds_s": round(launch_rounds, 1),
        "launch_start_up_s": round(start_up, 1),
        "sweep_wall_s": round(sweep_wall, 1),
        "sweep_rounds_s": round(sum(per_run), 1),
        "sweep_outside_rounds_per_run_s": round((sweep_wall - sum(per_run)) / runs, 1),
        "budget_s": round(budget, 1),
        "sweep_over_budget": round(sweep_wall / budget, 2),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs in the sweep (seeds 0..runs-1)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each run")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the code to run (default: this checkout)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    parser.add_argument("--smoke", action="store_true", help="2 runs of 2 clients, one round (CI): nothing asserted")
    args = parser.parse_args(argv)
    run_config, num_clients, runs = f"num-rounds={args.rounds}", None, args.runs
    if args.smoke:
        run_config, num_clients, runs = f"{run_config} num-partitions=2", 2, 2
    result = measure(args.checkout.resolve(), runs, run_config, num_clients, args.timeout)
    print(f"one launch: {result['launch_wall_s']:.1f} s, of which rounds {result['launch_rounds_s']:.1f} s "
          f"(start-up {result['launch_start_up_s']:.1f} s)")  # fmt: skip
    print(f"sweep of {runs}: {result['sweep_wall_s']:.1f} s, of which rounds {result['sweep_rounds_s']:.1f} s "
          f"({result['sweep_outside_rounds_per_run_s']:.1f} s a run outside its rounds)")  # fmt: skip
    print(f"budget ({runs} x the launch's rounds + one start-up): {result['budget_s']:.1f} s; sweep / budget: "
          f"{result['sweep_over_budget']:.2f}x")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
