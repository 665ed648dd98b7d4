"""One Ray for all the runs of a sweep: started once, joined by each run's simulation, stopped at the end.

Flower's simulation calls ``ray.init()`` (``include_dashboard=False``) in every run, so each run of a
sweep starts Ray's services and stops them again: about 4-5 s a run on 2 CPUs
(``benchmarks/sweep_overhead.py``). :func:`shared_ray` starts them once, in a process of its own
(``python -m fedapp.launch.ray_head``) that makes the same call, so the resources Ray detects, its
ports and its temporary folder are the ones a run would have had, and gives the runs its address as
``RAY_ADDRESS``: Flower's ``ray.init()`` then joins that cluster (as it joins a user's, docs/scale.md).
A run's actors still start and stop with the run; what a run computes does not change.

The process holds Ray until its standard input closes: :func:`shared_ray` closes it when the sweep
ends, and the pipe closes by itself when the sweep is killed, so Ray never outlives its sweep. It
runs with the sweep's ``FLWR_HOME``, so the launch's sentinel stops it (and Ray's processes, which
inherit that environment) with everything else of the home.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping

from fedapp.errors import FedAppError
from fedapp.launch.processes import stop_processes

__all__ = ["shared_ray"]

#: How long Ray's services may take to come up (a cold start on 2 busy CPUs takes about 6 s).
START_TIMEOUT = 120.0


def _read_address(process: subprocess.Popen, timeout: float) -> str:
    """The first line the head process prints (its GCS address), or "" when it ended or took too long."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return line[0].strip() if line else ""


@contextlib.contextmanager
def shared_ray(env: Mapping[str, str], timeout: float = START_TIMEOUT) -> Iterator[dict[str, str]]:
    """``env`` with ``RAY_ADDRESS`` naming a Ray cluster started for the block, stopped after it.

    Where ``env`` (or this process) already names a cluster (``RAY_ADDRESS``), that cluster is the
    user's: ``env`` is yielded unchanged and nothing is started.

    Raises
    ------
    FedAppError
        Ray did not start, with the end of what it printed.
    """
    if env.get("RAY_ADDRESS") or os.environ.get("RAY_ADDRESS"):
        yield dict(env)
        return
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "fedapp.launch.ray_head"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=dict(env),
            text=True,
        )
        try:
            address = _read_address(process, timeout)
            if not address:
                log.seek(0)
                said = " ".join(log.read().split()[-60:]) or "nothing"
                raise FedAppError(f"Ray did not start for the sweep within {timeout:.0f} s; it said: {said}")
            yield {**env, "RAY_ADDRESS": address}
        finally:
            with contextlib.suppress(OSError):
                process.stdin.close()  # the head's signal to stop Ray
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stop_processes([process.pid])


def main() -> int:
    # SIGTERM (the sentinel, a user's kill) ends like a closed pipe: ray.shutdown() stops the services.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    import ray  # noqa: PLC0415 - the parent side (shared_ray) runs where Ray is not imported

    context = ray.init(include_dashboard=False)  # Flower's own call: the same resources and ports
    print(context.address_info["gcs_address"], flush=True)
    try:
        sys.stdin.read()  # returns at end-of-file: the sweep closed the pipe, or died
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
