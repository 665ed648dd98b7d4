"""A private Flower home with a local SuperLink, and one run submitted to it with ``flwr run --stream``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from fedapp.config import APP_ROOT, defaults
from fedapp.errors import FedAppError
from fedapp.launch.app_copy import copy_app, declare_plugin_keys
from fedapp.launch.processes import free_port, sigterm_raises_system_exit, stop_processes, superlink_pids
from fedapp.launch.sentinel import stand_down, start_sentinel
from fedapp.launch.settings import PreparedRun, federation_overrides
from fedapp.launch.stream import stream_command
from fedapp.metrics import check_clients_trained
from fedapp.options import toml_value

LOCAL_CONNECTION_TOML = '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'


def flower_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment for Flower commands and processes with ``home`` as ``FLWR_HOME``: this
    interpreter's executables first on ``PATH`` (a SuperLink or SuperNode starts
    ``flwr-serverapp``/``flwr-clientapp`` from it), no runtime re-install of the app, no update
    check; ``extra`` on top. Ray leaves a simulation worker given no GPU the devices it inherited
    (Ray 2.x's coming default; our ClientApp picks the CPU there itself) unless the caller's
    environment says otherwise."""
    return {
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        **extra,
    }


@contextlib.contextmanager
def local_federation(flwr_home: Path | None = None) -> Iterator[dict[str, str]]:
    """A Flower home whose ``local`` connection runs simulations on a private local SuperLink.

    Yields the environment for ``flwr`` commands. The first ``flwr run`` in it starts the
    SuperLink; every later one reuses it (Flower's start-up is paid once). On exit the
    SuperLink is stopped by PID and a temporary home is removed; a given ``flwr_home`` is
    the caller's and is kept.
    """
    own_home = flwr_home is None
    if flwr_home is not None:
        existing = Path(flwr_home).expanduser() / "config.toml"
        if existing.is_file() and existing.read_text() != LOCAL_CONNECTION_TOML:
            # The user's own connections (remote SuperLinks, TLS) live there: never rewrite them.
            raise FedAppError(
                f"--flwr-home {flwr_home} already holds a Flower config.toml of its own; give a new or empty "
                "folder (the launcher writes its local connection there), or leave --flwr-home out"
            )
    home = Path(flwr_home or tempfile.mkdtemp(prefix="fedapp-flwr-home-")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(LOCAL_CONNECTION_TOML)
    # A private local SuperLink: another launch (or the user's own `flwr run`) must neither
    # receive these runs nor be stopped when they end.
    env = flower_env(
        home,
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
    )
    sentinel = start_sentinel(home, remove_home=own_home)  # stops what is left if this process is killed
    try:
        with sigterm_raises_system_exit():
            yield env
    finally:
        stop_processes(superlink_pids(home))
        if own_home:
            shutil.rmtree(home, ignore_errors=True)
        stand_down(sentinel)


class RunFailed(FedAppError):
    """The run was submitted but did not finish, and its ServerApp gave no reason."""


def submit(
    prepared: PreparedRun,
    env: dict[str, str],
    *,
    cpus_per_client: int = 1,
    gpus_per_client: float = 0.0,
    app_dir: Path = APP_ROOT,
    timeout: float | None = None,
) -> Path:
    """``flwr run --stream`` one prepared run in ``env`` (see :func:`local_federation`), show its log
    (:func:`fedapp.launch.stream.show_log`: cleaned, with a progress bar on a terminal), wait for it
    to end, check that it wrote all its rounds, and return its results folder.

    Raises
    ------
    subprocess.CalledProcessError
        If ``flwr run`` fails.
    RunFailed
        If the ServerApp ended without its ``done:`` line and without an error.
    FedAppError
        If the ServerApp ended with an error (its message), or the run ended without writing
        its summary or stopped early.
    """
    run_config = " ".join(f"{key}={toml_value(value)}" for key, value in prepared.overrides.items())
    flwr = Path(sys.executable).parent / "flwr"
    # The app's files alone, in the Flower home: flwr run packs the same FAB without walking a .venv.
    app_copy = copy_app(app_dir, Path(env["FLWR_HOME"]) / "fedapp-app")
    declare_plugin_keys(app_copy / "pyproject.toml", {key: toml_value(value) for key, value in defaults().items()})
    command = [str(flwr) if flwr.exists() else "flwr", "run", str(app_copy), "local", "--stream"]
    command += ["--federation-config", federation_overrides(prepared.num_clients, cpus_per_client, gpus_per_client)]
    if run_config:
        command += ["--run-config", run_config]
    summary = prepared.run_dir / "summary.json"
    started = time.time()
    try:
        ending = stream_command(command, env=env, num_rounds=prepared.config.num_rounds, timeout=timeout)
    except subprocess.CalledProcessError:
        check_clients_trained(prepared.run_dir)  # the ServerApp's reason, when it was this one
        raise
    finally:
        shutil.rmtree(app_copy, ignore_errors=True)
    # flwr run exits 0 whatever became of the run: the ServerApp's own last lines say. (A summary
    # alone could be another run's: one that held the folder and finished while this one waited.)
    if ending.error is not None:
        raise FedAppError(ending.error)  # the ServerApp's own reason, as the last line
    if ending.done is None:
        raise RunFailed("the run ended without the server's done: line; see the log above")
    if not summary.exists() or summary.stat().st_mtime < started:
        raise FedAppError(f"the run ended without writing {summary}; see the log above")
    rounds = json.loads(summary.read_text()).get("rounds", 0)
    if rounds < prepared.config.num_rounds:
        raise FedAppError(f"the run stopped after {rounds} of {prepared.config.num_rounds} rounds; see the log above")
    check_clients_trained(prepared.run_dir)
    return prepared.run_dir
