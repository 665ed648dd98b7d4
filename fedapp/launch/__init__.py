"""Run a simulation with ``flwr run`` in a self-contained Flower home, then clean up.

``flwr run .`` submits the app to a local SuperLink that it starts on first use
and leaves running. This launcher gives the run its own ``FLWR_HOME`` with a
federation sized for the run (N simulated SuperNodes, 1 CPU each unless told
otherwise), streams the logs until the run ends, checks that the results were
written, and stops the SuperLink it started, by PID::

    python -m fedapp.launch                                  # the default run
    python -m fedapp.launch --run-config 'method="standalone" partition="pathological"'
    python -m fedapp.launch --preset conf/fedavg-cifar10.yaml --run-config 'data-dir="/data/cifar10-train.tar.gz"'

Everything after the options is the ordinary ``--run-config`` syntax of Flower.

This module holds :func:`run` and the command line; its parts, each importable from here:

* :mod:`fedapp.launch.settings`: overrides, presets and client resources, checked before anything starts;
* :mod:`fedapp.launch.data_check`: the runs' data loaded and partitioned before anything starts;
* :mod:`fedapp.launch.processes`: ports, SuperLink PIDs, stopping process trees;
* :mod:`fedapp.launch.federation`: the private Flower home and one ``flwr run`` submitted to it;
* :mod:`fedapp.launch.stream`: the run's log as the user sees it (cleaned; a progress bar on a terminal).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from fedapp.config import APP_ROOT
from fedapp.errors import FedAppError
from fedapp.launch.data_check import check_runs_data
from fedapp.launch.federation import LOCAL_CONNECTION_TOML, RunFailed, flower_env, local_federation, submit
from fedapp.launch.processes import (
    free_port,
    process_tree,
    sigterm_raises_system_exit,
    stop_processes,
    superlink_pids,
)
from fedapp.launch.settings import (
    PreparedRun,
    check_client_resources,
    expand_preset,
    federation_overrides,
    parse_overrides,
    prepare_run,
    visible_gpus,
)
from fedapp.launch.stream import LogCleaner, show_log, strip_ansi
from fedapp.runfolder import check_run_folder, check_writable_folders, nothing_to_resume

__all__ = [
    "LOCAL_CONNECTION_TOML",
    "LogCleaner",
    "PreparedRun",
    "check_client_resources",
    "cpus_to_check",
    "expand_preset",
    "federation_overrides",
    "flower_env",
    "free_port",
    "local_federation",
    "main",
    "parse_overrides",
    "prepare_run",
    "process_tree",
    "run",
    "show_log",
    "sigterm_raises_system_exit",
    "stop_processes",
    "strip_ansi",
    "submit",
    "superlink_pids",
    "visible_gpus",
]


def gpus_to_check(gpus_per_client: float) -> int | None:
    """This machine's GPUs when the simulated clients ask for a share of one, else None (nothing to check).

    A simulation that joins a running Ray cluster (``RAY_ADDRESS`` set) places its workers on
    the cluster's nodes, whose GPUs this machine cannot count.
    """
    if not gpus_per_client or os.environ.get("RAY_ADDRESS"):
        return None
    return visible_gpus()


def cpus_to_check() -> int | None:
    """This machine's CPUs, which a local simulation's clients share; None when the simulation
    joins a Ray cluster (``RAY_ADDRESS`` set), whose nodes this machine cannot count."""
    return None if os.environ.get("RAY_ADDRESS") else os.cpu_count()


def run(
    overrides: dict,
    *,
    num_clients: int | None = None,
    cpus_per_client: int = 1,
    gpus_per_client: float = 0.0,
    flwr_home: Path | None = None,
    app_dir: Path = APP_ROOT,
    timeout: float | None = None,
) -> Path:
    """Run one simulation through ``flwr run`` on its own local SuperLink and return its results folder.

    The configuration and the client resources are validated here first, so a
    bad key or flag fails in a second instead of inside the SuperLink.
    """
    check_client_resources(cpus_per_client, gpus_per_client, gpus_to_check(gpus_per_client), cpus_to_check())
    prepared = prepare_run(overrides, num_clients)
    # What the ServerApp would refuse after Flower's start-up, refused here in a second.
    check_run_folder(prepared.run_dir, resume=prepared.config.resume)
    if prepared.config.resume and (finished := nothing_to_resume(prepared.run_dir, prepared.config.num_rounds)):
        print(finished, flush=True)  # nothing started, nothing written
        return prepared.run_dir
    check_writable_folders(prepared.config.values, simulation=True)
    check_runs_data([prepared.overrides])
    with local_federation(flwr_home) as env:
        return submit(
            prepared,
            env,
            cpus_per_client=cpus_per_client,
            gpus_per_client=gpus_per_client,
            app_dir=app_dir,
            timeout=timeout,
        )


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m fedapp.launch [--preset F] [--run-config 'k=v ...'] [--num-clients N] ...``.

    Returns
    -------
    int
        0 when the run finished (its log ends with the server's ``done:`` line and the results
        folder); 1 when ``flwr run`` failed, or the run ended without its ``done:`` line and
        without a reason; 2 when the configuration, a flag or the run was refused, or the run
        ended with an error (the last line says which); 130 when interrupted (Ctrl-C).
    """
    # Named explicitly: run as a package, argparse would call the program "__main__.py".
    parser = argparse.ArgumentParser(prog="python -m fedapp.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", help="YAML preset in conf/ (same as --run-config 'preset=\"...\"')")
    parser.add_argument("--run-config", action="append", default=[], help="Flower-style 'key=value ...' overrides")
    parser.add_argument("--num-clients", type=int, help="simulated SuperNodes (default: num-partitions)")
    parser.add_argument("--cpus-per-client", type=int, default=1, help="CPUs Ray reserves per client (default 1)")
    parser.add_argument(
        "--gpus-per-client",
        type=float,
        default=0.0,
        help="share of a GPU per client: 0.25 puts 4 clients on each GPU; 0 (default): CPUs only",
    )
    parser.add_argument("--flwr-home", type=Path, help="Flower home to use (default: a new temporary folder)")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.run_config)
        if args.preset:
            overrides["preset"] = args.preset
        run_dir = run(
            overrides,
            num_clients=args.num_clients,
            cpus_per_client=args.cpus_per_client,
            gpus_per_client=args.gpus_per_client,
            flwr_home=args.flwr_home,
        )
    except RunFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except FedAppError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"error: flwr run failed with exit code {err.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the run's processes are stopped by local_federation on the way out
        print(
            "error: interrupted; the run folder keeps the rounds it finished (resume=true continues from its "
            "last checkpoint)",
            file=sys.stderr,
        )
        return 128 + signal.SIGINT
    # The summary is in run_dir/summary.json; the server's done: line above gave its headline.
    print(f"results: {run_dir}")
    return 0
