"""Helpers for tests that run real Flower processes (SuperLink, SuperNodes, ``flwr``).

A :class:`Processes` group starts commands with their output in one log file
each and stops every one of them by PID (with its process group) at the end, so
a failing test leaves nothing running. A :class:`RunQueue` submits several
``flwr run`` commands to one federation at once and hands each test its own
run's outcome: a SuperNode works on one message at a time, but while it trains
for one run the others' ServerApps start, aggregate and poll, so the runs share
the federation's idle time instead of each paying it in turn.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx

from fedapp.launch import flower_env as launch_env
from fedapp.launch import stop_processes
from fedapp.metrics import read_metrics
from tests.paths import ROOT

BIN = Path(sys.executable).parent

# Seconds between a SuperExec's polls for new ClientApp/ServerApp tasks (Flower's default is
# 1 s; the only poll interval Flower exposes): every message waits for one poll. Not lower:
# idle, a SuperLink and two SuperNodes use 16% of a core at 0.1 s, 4% at 0.5 s
# (benchmarks/poll_interval.py).
TASK_POLL_INTERVAL = "0.5"


def flower_env(home: Path) -> dict[str, str]:
    """Environment for Flower processes: this venv's executables, a private ``FLWR_HOME``."""
    home.mkdir(parents=True, exist_ok=True)
    return launch_env(home, FLWR_TELEMETRY_ENABLED="0", FLWR_SUPEREXEC_TASK_POLL_INTERVAL=TASK_POLL_INTERVAL)


def connection_toml(name: str, address: str, root_certificates: Path | None = None) -> str:
    """A ``config.toml`` whose default SuperLink connection is ``name``."""
    security = f'root-certificates = "{root_certificates}"' if root_certificates else "insecure = true"
    return f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n{security}\n'


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0, interval: float = 0.3) -> None:
    """Poll ``condition`` until it holds, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")


def healthy(url: str) -> bool:
    """Whether ``url`` (a SuperLink's ``/health``) answers with success."""
    try:
        return httpx.get(url, timeout=1.0).is_success
    except httpx.HTTPError:
        return False


class Processes:
    """Long-running commands started for a test, each logging to ``<logs>/<name>.log``."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs = logs
        self.env = env
        self.started: dict[str, subprocess.Popen] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, command: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with (self.logs / f"{name}.log").open("w") as out:
            process = subprocess.Popen(
                list(command), env=env or self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started[name] = process
        return process

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, name: str) -> None:
        process = self.started.pop(name)
        stop_processes([process.pid])
        process.wait(timeout=10)

    def stop_all(self) -> None:
        stop_processes([p.pid for p in self.started.values()])
        for process in self.started.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self.started.clear()

    def tails(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(self.logs.iterdir()))


def flwr(args: Sequence[str], env: dict[str, str], prefix: Sequence[str] = (), timeout: float = 300):
    """Run the ``flwr`` CLI (optionally behind ``prefix``, e.g. ``ip netns exec NS``)."""
    return subprocess.run(
        [*prefix, str(BIN / "flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def run_app(connection: str, run_config: str, env: dict[str, str], prefix: Sequence[str] = (), timeout: float = 300):
    """``flwr run`` this project on ``connection`` and wait for the run to end."""
    return flwr(["run", str(ROOT), connection, "--stream", "--run-config", run_config], env, prefix, timeout)


def run_metrics(results: Path, run_name: str, done: subprocess.CompletedProcess, processes: Processes) -> list[dict]:
    """The run's per-round metrics, or a failure that shows every log."""
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{processes.tails()}"
    metrics = results / run_name / "metrics.jsonl"
    if not metrics.exists():
        raise AssertionError(f"no metrics written\n{done.stdout[-3000:]}\n{processes.tails()}")
    return read_metrics(metrics)


# Runs one federation keeps in flight: fewer when another pytest-xdist worker shares the CPUs, since
# an overloaded SuperExec starts ServerApp processes faster than they come up.
IN_FLIGHT = 2 if os.environ.get("PYTEST_XDIST_WORKER") else 4


class RunQueue:
    """``flwr run`` commands submitted to one federation side by side, at most ``in_flight`` at a time.

    ``run`` is what submits one run and waits for it (``flwr run --stream``);
    :meth:`submit` returns at once with a future of its outcome, so a module can
    put every run it checks in flight before its first test looks at one.
    """

    def __init__(self, run: Callable[[str], subprocess.CompletedProcess], in_flight: int = IN_FLIGHT) -> None:
        self._run = run
        self._pool = ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="flwr-run")
        self.submitted: list[Future] = []

    def submit(self, run_config: str) -> Future:
        future = self._pool.submit(self._run, run_config)
        self.submitted.append(future)
        return future

    def drain(self) -> None:
        """Wait until every submitted run has ended (before the federation is changed under them)."""
        for future in self.submitted:
            with contextlib.suppress(Exception):
                future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
