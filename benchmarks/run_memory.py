"""The memory a simulation costs: every process of one ``python -m fedapp.launch`` run, sampled.

    python benchmarks/run_memory.py                          # the default run of the README's command 1
    python benchmarks/run_memory.py --run-config 'num-rounds=3 method="pfedlora"'
    python benchmarks/run_memory.py --smoke                  # one round of 2 clients (CI): nothing asserted

Starts the launch and, every ``--every`` seconds until it ends, reads the proportional set size
(PSS: a page shared by n processes counts 1/n in each, so the sum is the memory the run holds) of
the launcher and every process below it (the SuperLink, ``flwr run``, Flower's simulation process
with the ServerApp and Ray's driver, Ray's services and its ``ClientAppActor`` workers), as
``scale.py`` reads them. Prints the peak of the summed PSS and, per process (named by its command), its own peak,
largest first; ``--out`` writes them as JSON. The run writes into a temporary folder.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import descendants, pss_bytes

ROOT = Path(__file__).resolve().parent.parent
MB = 2**20
# What names a process of the run, first match wins (the sentinel's command holds "fedapp.launch" too).
MARKERS = (
    "fedapp.launch.sentinel",
    "fedapp.launch",
    "ClientAppActor",
    "flwr-simulation",
    "flower-superlink",
    "flower-superexec",
    "flwr run",
    "gcs_server",
    "raylet",
    "dashboard/agent",
    "dashboard.py",
    "runtime_env/agent",
    "log_monitor",
    "monitor.py",
    "data_check",
)


def process_name(pid: int) -> str:
    """A short name for a process of the run, from its command line."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    command = [part for part in command if part]
    text = " ".join(command)
    for marker in MARKERS:
        if marker in text:
            return marker
    return Path(command[0]).name if command else "?"


def sample(root: int) -> dict[int, tuple[str, int]]:
    """PSS of ``root`` and each process below it, by pid, with its name."""
    return {pid: (process_name(pid), pss_bytes(pid)) for pid in descendants([root])}


def measure(run_config: str, every: float, num_clients: int | None) -> dict:
    """Run the launch and return its peak summed PSS and each process's peak, in MB."""
    with tempfile.TemporaryDirectory(prefix="fedapp-memory-") as folder:
        overrides = f'{run_config} results-dir="{folder}/results"'.strip()
        command = [sys.executable, "-m", "fedapp.launch", "--run-config", overrides]
        if num_clients:
            command += ["--num-clients", str(num_clients)]
        env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        launch = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        root = launch.pid
        peak_total, peaks, started = 0, {}, time.time()
        while launch.poll() is None:
            found = sample(root)
            peak_total = max(peak_total, sum(pss for _, pss in found.values()))
            for pid, (name, pss) in found.items():
                if pss > peaks.get(pid, ("", 0))[1]:
                    peaks[pid] = (name, pss)
            time.sleep(every)
        stderr = launch.stderr.read().decode(errors="replace") if launch.stderr else ""
        if launch.returncode != 0:
            raise SystemExit(f"the launch failed ({launch.returncode}):\n{stderr[-3000:]}")
    processes = sorted(((name, pss / MB) for name, pss in peaks.values()), key=lambda item: -item[1])
    return {
        "run_config": run_config,
        "wall_s": round(time.time() - started, 1),
        "peak_summed_pss_mb": round(peak_total / MB, 1),
        "processes": [{"name": name, "peak_pss_mb": round(mb, 1)} for name, mb in processes],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default="", help="overrides of the run, as python -m fedapp.launch takes them")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    parser.add_argument("--smoke", action="store_true", help="one round of two clients (CI): nothing asserted")
    args = parser.parse_args(argv)
    run_config, num_clients = args.run_config, None
    if args.smoke:
        run_config, num_clients = f"num-rounds=1 num-partitions=2 {run_config}", 2
    result = measure(run_config, args.every, num_clients)
    print(f"peak summed PSS: {result['peak_summed_pss_mb']:.0f} MB over {len(result['processes'])} processes "
          f"({result['wall_s']:.0f} s)")  # fmt: skip
    for process in result["processes"]:
        print(f"  {process['peak_pss_mb']:7.1f} MB  {process['name']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
