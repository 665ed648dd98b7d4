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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from fedapp.config import APP_ROOT, RunConfig, load_preset, resolve_run_config
from fedapp.errors import ConfigError, FedAppError
from fedapp.metrics import check_clients_trained, check_run_folder, check_writable_folders

LOCAL_CONNECTION_TOML = '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'


def federation_overrides(num_supernodes: int, cpus_per_client: int, gpus_per_client: float) -> str:
    """``--federation-config`` for a local simulation of ``num_supernodes`` clients.

    ``gpus_per_client`` is Ray's share of a GPU per client: 0.25 packs four
    clients' workers on each GPU; 0 (the default) leaves the GPUs out.
    """
    items = [f"num-supernodes={num_supernodes}", f"client-resources-num-cpus={cpus_per_client}"]
    if gpus_per_client:
        items.append(f"client-resources-num-gpus={gpus_per_client}")
    return " ".join(items)


def check_client_resources(cpus_per_client: int, gpus_per_client: float, gpus_available: int | None = None) -> None:
    """Refuse client resources that Ray or Flower would reject only once the simulation runs.

    Parameters
    ----------
    cpus_per_client : int
        CPUs per simulated client; at least 1.
    gpus_per_client : float
        GPUs per simulated client: 0, a fraction below 1 (clients share a GPU),
        or a whole number (Ray accepts nothing else).
    gpus_available : int, optional
        GPUs this machine has; checked against ``gpus_per_client`` when given.

    Raises
    ------
    ConfigError
        Naming the flag and the value.
    """
    if cpus_per_client < 1:
        raise ConfigError(f"--cpus-per-client {cpus_per_client}: each client needs at least 1 CPU")
    gpus = float(gpus_per_client)
    flag = f"--gpus-per-client {gpus_per_client:g}"
    if not math.isfinite(gpus) or gpus < 0:
        raise ConfigError(f"{flag}: must be 0 (no GPU), a share of one GPU below 1 (e.g. 0.25), or a whole number")
    if gpus > 1 and not gpus.is_integer():
        raise ConfigError(
            f"{flag}: above 1, Ray only hands out whole GPUs; use {math.floor(gpus)} or {math.ceil(gpus)}, "
            "or a share below 1 to put several clients on one GPU"
        )
    if gpus and gpus_available is not None and gpus_available < math.ceil(gpus):
        found = "no GPU" if gpus_available == 0 else f"only {gpus_available} GPU(s)"
        raise ConfigError(
            f"{flag}: torch finds {found} on this machine (Flower would stop with an empty actor pool); "
            "leave the flag out to simulate on CPUs"
        )


def visible_gpus() -> int:
    """GPUs torch can use on this machine, which the local simulation's workers share."""
    import torch  # noqa: PLC0415 - needed only when GPUs are asked for

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# One ``key=value`` item as ``flwr run --run-config`` reads it: a quoted value may hold spaces.
_OVERRIDE_ITEM = re.compile(r"""([^\s=]+)=('[^']*'|"[^"]*"|\S+)""")


def parse_overrides(text: list[str]) -> dict:
    """Parse Flower-style ``key=value`` overrides with TOML values (as ``flwr run`` does).

    Unlike Flower's parser, nothing is skipped silently: an item that is not ``key=value``, or
    whose value is not TOML (most often an unquoted string), is refused with the item named.
    """
    import tomllib  # noqa: PLC0415

    values: dict = {}
    for chunk in text:
        position = 0
        while True:
            while position < len(chunk) and chunk[position].isspace():
                position += 1
            if position == len(chunk):
                break
            match = _OVERRIDE_ITEM.match(chunk, position)
            if match is None or (match.end() < len(chunk) and not chunk[match.end()].isspace()):
                item = chunk[position:].split(maxsplit=1)[0]
                raise FedAppError(f'--run-config item {item!r} is not key=value (quote values with spaces: key="a b")')
            key, raw = match.groups()
            try:
                values.update(tomllib.loads(f'"{key}" = {raw}'))
            except tomllib.TOMLDecodeError:
                hint = f': quote a string, {key}="{raw}"' if re.fullmatch(r"[\w./~-]+", raw) else ""
                raise FedAppError(
                    f"--run-config item {key}={raw}: {raw} is not a number, true/false or a quoted string{hint}"
                ) from None
            position = match.end()
    return values


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


@dataclass(frozen=True)
class PreparedRun:
    """A validated run: the overrides to submit, its resolved config and its results folder."""

    overrides: dict
    config: RunConfig
    run_dir: Path

    @property
    def num_clients(self) -> int:
        return self.config.num_partitions


def prepare_run(overrides: dict, num_clients: int | None = None) -> PreparedRun:
    """Validate ``overrides`` here, so a bad key fails in a second instead of inside the SuperLink.

    The preset is flattened into explicit values, ``num_clients`` (if given) becomes
    ``num-partitions``, and a relative ``results-dir`` is made absolute (the ServerApp
    runs in another process and folder).
    """
    overrides = expand_preset(overrides)
    config = resolve_run_config(overrides)
    if num_clients is not None and num_clients != config.num_partitions:
        overrides = {**overrides, "num-partitions": num_clients}
        config = resolve_run_config(overrides)
    results = Path(config.results_dir).expanduser()
    if not results.is_absolute():
        results = Path.cwd() / results
        overrides = {**overrides, "results-dir": str(results)}
    return PreparedRun(overrides=overrides, config=config, run_dir=results / config.resolved_run_name)


def flower_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment for Flower commands and processes with ``home`` as ``FLWR_HOME``: this
    interpreter's executables first on ``PATH`` (a SuperLink or SuperNode starts
    ``flwr-serverapp``/``flwr-clientapp`` from it), no runtime re-install of the app, no update
    check; ``extra`` on top."""
    return {
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
    try:
        with sigterm_raises_system_exit():
            yield env
    finally:
        stop_processes(superlink_pids(home))
        if own_home:
            shutil.rmtree(home, ignore_errors=True)


def submit(
    prepared: PreparedRun,
    env: dict[str, str],
    *,
    cpus_per_client: int = 1,
    gpus_per_client: float = 0.0,
    app_dir: Path = APP_ROOT,
    timeout: float | None = None,
) -> Path:
    """``flwr run --stream`` one prepared run in ``env`` (see :func:`local_federation`), wait for it
    to end, check that it wrote all its rounds, and return its results folder.

    Raises
    ------
    subprocess.CalledProcessError
        If ``flwr run`` fails.
    FedAppError
        If the run ended without writing its summary or stopped early.
    """
    run_config = " ".join(f"{key}={_toml_value(value)}" for key, value in prepared.overrides.items())
    flwr = Path(sys.executable).parent / "flwr"
    command = [str(flwr) if flwr.exists() else "flwr", "run", str(app_dir), "local", "--stream"]
    command += ["--federation-config", federation_overrides(prepared.num_clients, cpus_per_client, gpus_per_client)]
    if run_config:
        command += ["--run-config", run_config]
    summary = prepared.run_dir / "summary.json"
    started = time.time()
    try:
        subprocess.run(command, env=env, check=True, timeout=timeout)
    except subprocess.CalledProcessError:
        check_clients_trained(prepared.run_dir)  # the ServerApp's reason, when it was this one
        raise
    if not summary.exists() or summary.stat().st_mtime < started:
        raise FedAppError(f"the run ended without writing {summary}; see the log above")
    rounds = json.loads(summary.read_text()).get("rounds", 0)
    if rounds < prepared.config.num_rounds:
        raise FedAppError(
            f"the run stopped after {rounds} of {prepared.config['num-rounds']} rounds; see the log above"
        )
    check_clients_trained(prepared.run_dir)
    return prepared.run_dir


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
    check_client_resources(cpus_per_client, gpus_per_client, visible_gpus() if gpus_per_client else None)
    prepared = prepare_run(overrides, num_clients)
    # What the ServerApp would refuse after Flower's start-up, refused here in a second.
    check_run_folder(prepared.run_dir, resume=prepared.config.resume)
    check_writable_folders(prepared.config.values)
    with local_federation(flwr_home) as env:
        return submit(
            prepared,
            env,
            cpus_per_client=cpus_per_client,
            gpus_per_client=gpus_per_client,
            app_dir=app_dir,
            timeout=timeout,
        )


def expand_preset(overrides: dict) -> dict:
    """Apply the preset here, where explicit overrides are still known.

    Inside the ServerApp an override equal to the default cannot be told apart
    from no override, so a preset would win over it; flattening the preset into
    explicit values first keeps "explicit beats preset" exact.
    """
    preset = overrides.get("preset")
    if not preset:
        return dict(overrides)
    explicit = {key: value for key, value in overrides.items() if key != "preset"}
    return {**load_preset(str(preset)), **explicit, "preset": ""}


def _toml_value(value: object) -> str:
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    except FedAppError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"error: flwr run failed with exit code {err.returncode}", file=sys.stderr)
        return 1
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"results: {run_dir}")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
