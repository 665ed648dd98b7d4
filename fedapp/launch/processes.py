"""The processes a launch starts, found and stopped by PID: free ports, SuperLinks, process trees, SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def superlink_pids(flwr_home: Path) -> list[int]:
    """PIDs of SuperLink processes whose database lives in ``flwr_home``."""
    out = subprocess.run(["pgrep", "-f", f"flower-superlink.*{flwr_home}"], capture_output=True, text=True, check=False)
    return [int(pid) for pid in out.stdout.split()]


def process_tree(pids: list[int]) -> list[int]:
    """``pids`` and all their descendants (children first found by ``ps``), parents before children.

    A local SuperLink starts its SuperExec in a session of its own, and that starts the
    simulation (and Ray) under it: stopping the SuperLink's process group alone would
    leave the run going on.
    """
    out = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True, check=False)
    children: dict[int, list[int]] = {}
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2 and all(field.isdigit() for field in fields):
            children.setdefault(int(fields[1]), []).append(int(fields[0]))
    tree, frontier = list(pids), list(pids)
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, []) if child not in tree]
        tree += frontier
    return tree


def stop_processes(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL what is left, for each PID, its descendants and their process groups."""
    pids = process_tree(pids)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)


@contextlib.contextmanager
def sigterm_raises_system_exit():
    """Turn SIGTERM into ``SystemExit`` while the block runs, so ``finally`` clauses
    (stopping the SuperLink this launch started) run when a scheduler or ``kill``
    stops us, as they do on Ctrl-C. Outside the main thread nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signal(pid: int, sig: int) -> None:
    # The process group first: a SuperLink's or SuperNode's app processes die with it.
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited; it only waits to be reaped by its parent
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
