"""What a launch submits, checked before any process starts: run-config overrides, presets, client resources.

A bad key, value or flag fails here in a second instead of inside the SuperLink after Flower's start-up.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from fedapp.catalog import CATALOG
from fedapp.config import RunConfig, load_preset, resolve_run_config
from fedapp.errors import ConfigError, FedAppError, ModelError
from fedapp.extras import RAY, check_client_extras, check_server_extras, require


def federation_overrides(num_supernodes: int, cpus_per_client: int, gpus_per_client: float) -> str:
    """``--federation-config`` for a local simulation of ``num_supernodes`` clients.

    ``gpus_per_client`` is Ray's share of a GPU per client: 0.25 packs four
    clients' workers on each GPU; 0 (the default) leaves the GPUs out.
    """
    items = [f"num-supernodes={num_supernodes}", f"client-resources-num-cpus={cpus_per_client}"]
    if gpus_per_client:
        items.append(f"client-resources-num-gpus={gpus_per_client}")
    return " ".join(items)


def check_client_resources(
    cpus_per_client: int,
    gpus_per_client: float,
    gpus_available: int | None = None,
    cpus_available: int | None = None,
) -> None:
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
    cpus_available : int, optional
        CPUs the simulation can use; checked against ``cpus_per_client`` when given (a client
        asking for more would never be placed: Ray fails the run after Flower's start-up).

    Raises
    ------
    ConfigError
        Naming the flag and the value.
    """
    if cpus_per_client < 1:
        raise ConfigError(f"--cpus-per-client {cpus_per_client}: each client needs at least 1 CPU")
    if cpus_available is not None and cpus_per_client > cpus_available:
        raise ConfigError(
            f"--cpus-per-client {cpus_per_client}: this machine has {cpus_available} CPUs, so no client could "
            "start; ask for at most that many (or join a larger Ray cluster with RAY_ADDRESS)"
        )
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
            if key in values:
                raise FedAppError(f"--run-config gives {key!r} twice ({values[key]!r} and {raw}); give it once")
            try:
                values.update(tomllib.loads(f'"{key}" = {raw}'))
            except tomllib.TOMLDecodeError:
                hint = f': quote a string, {key}="{raw}"' if re.fullmatch(r"[\w./~-]+", raw) else ""
                raise FedAppError(
                    f"--run-config item {key}={raw}: {raw} is not a number, true/false or a quoted string{hint}"
                ) from None
            position = match.end()
    return values


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
        if "num-partitions" in overrides:  # given by the user or the preset, not the default
            raise ConfigError(
                f"--num-clients {num_clients} contradicts num-partitions = {config.num_partitions} "
                "(the run config or the preset): give the number of clients once"
            )
        overrides = {**overrides, "num-partitions": num_clients}
        config = resolve_run_config(overrides)
    check_server_extras(config)  # the ServerApp runs in this environment
    check_client_extras(config, own_data_dir=False)  # and so does every simulated client
    require(RAY, "a local simulation")
    check_pretrained_checkpoint(config)
    results = Path(config.results_dir).expanduser()
    if not results.is_absolute():
        results = Path.cwd() / results
        overrides = {**overrides, "results-dir": str(results)}
    return PreparedRun(overrides=overrides, config=config, run_dir=results / config.resolved_run_name)


def check_pretrained_checkpoint(config: RunConfig) -> None:
    """Refuse a CLIP checkpoint path with no file behind it before anything starts.

    A local simulation runs every part of the run on this machine, so the file must be here; in a
    deployment each process checks its own when it loads CLIP.
    """
    if CATALOG[config.method].backbone == "cnn":
        return  # nothing in the run loads CLIP
    from fedapp.models.clip import local_checkpoint  # noqa: PLC0415 - the launcher imports torch only for CLIP runs

    try:
        local_checkpoint(config.pretrained)
    except ModelError as error:
        raise ConfigError(f"config key 'pretrained' = {config.pretrained!r}: {error}") from None


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
