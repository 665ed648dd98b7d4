"""Stops a launch's Flower processes when the launcher dies, however it dies (``SIGKILL`` too).

The launcher starts ``python -m fedapp.launch.sentinel HOME REMOVE`` in a session of its own,
holding the write end of its stdin. A launcher that ends however it can still run code
(a failed run, Ctrl-C, ``SIGTERM``) stops its processes itself, then writes :data:`DONE` and
closes the pipe: the sentinel ends. One that is killed closes the pipe by dying, with nothing
written: the sentinel stops every process of the Flower home (the SuperLink's tree and
whatever else runs with that ``FLWR_HOME``) and, when the launcher made the home, removes it. Nothing is
left behind for ``kill -9`` to leak: an unauthenticated local SuperLink nobody owns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fedapp.launch.processes import home_pids, stop_processes, superlink_pids

__all__ = ["DONE", "stand_down", "start_sentinel"]

DONE = b"done"
"""What a launcher that cleaned up after itself writes before closing the pipe."""


def start_sentinel(home: Path, *, remove_home: bool) -> subprocess.Popen:
    """Start the sentinel of ``home``; close its ``stdin`` (or die) to set it off."""
    env = {key: value for key, value in os.environ.items() if key != "FLWR_HOME"}
    return subprocess.Popen(
        [sys.executable, "-m", "fedapp.launch.sentinel", str(home), "remove" if remove_home else "keep"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # Ctrl-C or a signal to the launcher's group must not stop it first
    )


def stand_down(sentinel: subprocess.Popen) -> None:
    """Tell the sentinel that the launcher cleaned up itself, and wait for it to end."""
    with contextlib.suppress(OSError):  # it may have ended already (killed with the launcher's group)
        sentinel.stdin.write(DONE)
        sentinel.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        sentinel.wait(timeout=30)


def main(argv: list[str]) -> int:
    home, remove = Path(argv[0]), argv[1] == "remove"
    if sys.stdin.buffer.read() == DONE:  # read() returns at end-of-file: the pipe closed, or its writer died
        return 0
    stop_processes(superlink_pids(home) + home_pids(home))
    if remove:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
