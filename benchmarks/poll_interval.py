"""What an idle federation costs at each SuperExec poll interval.

Starts a SuperLink and two SuperNodes on loopback with
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` set, waits until they are up, then
reads the CPU time (user + system, from ``/proc``, Linux) of every process
they started over a window in which no run is submitted. Each message a run
sends waits on average half an interval for the SuperExec's next poll; this
prints what the polls cost while nothing happens::

    python benchmarks/poll_interval.py                      # 0.1, 0.5 and 1 s, 30 s each
    python benchmarks/poll_interval.py --smoke              # 1 s only, a 5 s window (CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedapp.launch import free_port, stop_processes

BIN = Path(sys.executable).parent
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    interval: float
    window: float
    cpu_seconds: float

    @property
    def share_of_a_core(self) -> float:
        return self.cpu_seconds / self.window


def _descendants(roots: Sequence[int]) -> set[int]:
    """``roots`` and every process below them (from each process's parent in ``/proc``)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(entry.name)] = int(fields[1])
    found, frontier = set(roots), list(roots)
    while frontier:
        pid = frontier.pop()
        children = [child for child, ppid in parent.items() if ppid == pid and child not in found]
        found.update(children)
        frontier.extend(children)
    return found


def _cpu_seconds(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def measure(interval: float, window: float, settle: float) -> Row:
    home = Path(tempfile.mkdtemp(prefix="fedapp-poll-"))
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(interval),
    }
    port = free_port()
    commands = [[str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port)]]
    commands += [
        [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}", "--port", str(free_port())]
        for _ in range(2)
    ]
    started = [
        subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for c in commands
    ]
    try:
        time.sleep(settle)  # start-up and the nodes' registration are not idle time
        pids = _descendants([p.pid for p in started])
        before = _cpu_seconds(pids)
        time.sleep(window)
        spent = _cpu_seconds(pids) - before
    finally:
        stop_processes([p.pid for p in started])
        shutil.rmtree(home, ignore_errors=True)
    return Row(interval, window, spent)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", default="0.1,0.5,1", help="comma list of poll intervals in seconds")
    parser.add_argument("--window", type=float, default=30.0, help="idle seconds measured per interval")
    parser.add_argument("--smoke", action="store_true", help="1 s interval, 5 s window")
    args = parser.parse_args(argv)
    intervals = [1.0] if args.smoke else [float(v) for v in args.intervals.split(",")]
    window, settle = (5.0, 10.0) if args.smoke else (args.window, 15.0)
    rows = [measure(interval, window, settle) for interval in intervals]
    print("| poll interval (s) | idle window (s) | CPU (s) | share of a core |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row.interval:g} | {row.window:g} | {row.cpu_seconds:.2f} | {row.share_of_a_core:.1%} |")
    return rows


if __name__ == "__main__":
    main()
