"""The processes a launch starts, found and stopped by PID: free ports, SuperLinks, process trees, SIGTERM.

Processes are listed and inspected with psutil (no ``/proc``, ``pgrep`` or ``ps``), so the
same code serves Linux and macOS.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from collections.abc import Iterator


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command_lines() -> Iterator[tuple[int, str]]:
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info["cmdline"]
        if cmdline:
            yield process.info["pid"], " ".join(cmdline)


def superlink_pids(flwr_home: Path) -> list[int]:
    """PIDs of SuperLink processes whose database lives in ``flwr_home``."""
    pattern = re.compile(f"flower-superlink.*{re.escape(str(flwr_home))}")
    return [pid for pid, line in _command_lines() if pattern.search(line)]


def home_pids(flwr_home: Path) -> list[int]:
    """PIDs of every process (but this one) whose ``FLWR_HOME`` is ``flwr_home``: the SuperLink,
    its SuperExec, ``flwr run`` and the app processes under them, wherever they were re-parented."""
    home, found = str(flwr_home), []
    for process in psutil.process_iter(["pid"]):
        if process.info["pid"] == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if process.environ().get("FLWR_HOME") == home:
                found.append(process.info["pid"])
    return found


def process_tree(pids: list[int]) -> list[int]:
    """``pids`` and all their descendants (children first found by ``ps``), parents before children.

    A local SuperLink starts its SuperExec in a session of its own, and that starts the
    simulation (and Ray) under it: stopping the SuperLink's process group alone would
    leave the run going on.
    """
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["pid", "ppid"]):
        children.setdefault(process.info["ppid"], []).append(process.info["pid"])
    tree, frontier = list(pids), list(pids)
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, []) if child not in tree]
        tree += frontier
    return tree


def stop_processes(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL what is left, for each PID, its descendants and their process groups
    (the process group first: a SuperLink's or SuperNode's app processes die with it)."""
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
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, sig)


def _alive(pid: int) -> bool:
    try:  # a zombie has exited; it only waits to be reaped by its parent
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
