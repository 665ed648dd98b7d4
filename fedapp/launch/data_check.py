"""The runs' data loaded and partitioned before anything starts, in a child process.

The ServerApp checks its data (:func:`fedapp.clientdata.check_data`: partitions against the
samples, no empty client, the held-out domain, the test pool's classes) before round 1, but in a
simulation that is after Flower has started the SuperLink and every simulated SuperNode:
``num-partitions=5000`` on the 1,797 digits was refused after 37 s, with 5,000 nodes up. The
launcher and the sweep make the same check first, here. It runs in a child process because it
needs torch and the data, which the launcher itself never holds (its memory lasts the whole run);
the decoded arrays and partitions it writes to the cache (``cache-dir``) are the ones the run then
reads, and so is the backbone it pretrains when a CLIP run names ``pretrained = "reserve"``
(:mod:`fedapp.backbones`), whose progress it prints. The child reads a JSON list of the runs'
overrides on its standard input and prints a refusal as ``{"run": index, "error": message}``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedapp.cachedir import resolve_cache_dir
from fedapp.config import RESERVE_BACKBONE, partition_settings, resolve_run_config
from fedapp.errors import ConfigError, FedAppError

__all__ = ["check_runs_data"]


def check_runs_data(overrides: Sequence[Mapping[str, Any]], labels: Sequence[str] = ()) -> None:
    """Load and partition the data of every run that ``overrides`` describe (each run's resolved
    overrides, as :func:`fedapp.launch.settings.prepare_run` returns them), once per distinct data
    setting, in a child process.

    Raises
    ------
    ConfigError
        With the refusal's one line (e.g. ``num_partitions must be between 1 and the number of
        samples (1797), got 5000``), after ``labels[i]: `` of the run it concerns when labels are given.
    """
    pending = [index for index, item in enumerate(overrides) if not passed_before(item).exists()]
    if not pending:
        return
    proc = subprocess.run(
        # Not ``-m``: fedapp.launch imports this module, and runpy warns of a module run that is imported.
        [sys.executable, "-c", "import sys; from fedapp.launch.data_check import main; sys.exit(main())"],
        input=json.dumps([dict(overrides[index]) for index in pending], default=str),
        stdout=subprocess.PIPE,  # the refusal; its log (a backbone pretrained on first use) goes to the user
        text=True,
        check=False,
    )
    if proc.returncode == 0:
        return
    try:
        refusal = json.loads(proc.stdout)
        index, message = int(refusal["run"]), str(refusal["error"])
    except (ValueError, KeyError, TypeError):  # the child died before it could say (a crash, no memory)
        raise ConfigError(
            f"the check of the runs' data ended with exit code {proc.returncode} (its output is above)"
        ) from None
    index = pending[index]
    raise ConfigError(f"{labels[index]}: {message}" if index < len(labels) else message)


def passed_before(overrides: Mapping[str, Any]) -> Path:
    """The file the check leaves in the cache once a run's data passed (its presence skips the child):
    named by what the check depends on, the partition's keys, the image size, the backbone a run
    asks to have made, and the size and time of the data files named."""
    values = resolve_run_config(overrides).values
    facts: dict[str, Any] = {**partition_settings(values), "image-size": values["image-size"]}
    if str(values["pretrained"]).strip().lower() == RESERVE_BACKBONE:
        facts.update({key: values[key] for key in ("method", "clip-model", "client-clip-models")})
    for key in ("data-dir", "test-data-dir"):
        path = Path(str(values[key])).expanduser()
        if values[key] and path.exists():
            facts[f"{key} stat"] = [path.stat().st_size, path.stat().st_mtime_ns]
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return resolve_cache_dir(str(values["cache-dir"])) / "data-checks" / digest


def _check(items: Sequence[Mapping[str, Any]]) -> None:
    from fedapp.catalog import CATALOG  # noqa: PLC0415
    from fedapp.clientdata import check_data, clip_weights  # noqa: PLC0415 - torch and the data: this process only
    from fedapp.config import client_clip_model_names  # noqa: PLC0415

    seen: list = []
    for index, item in enumerate(items):
        try:
            config = resolve_run_config(item)
            data = partition_settings(config.values)
            if data not in seen:
                seen.append(data)
                check_data(config, config.num_partitions)
            backbone = CATALOG[config.method].backbone
            if backbone != "cnn":  # a backbone made on first use: made now
                names = client_clip_model_names(config) if backbone == "clip-text" else (config.clip_model,)
                for model_name in names:
                    clip_weights(config, model_name)
        except (FedAppError, OSError) as err:
            raise _Refused(index, str(err)) from err
        stamp = passed_before(item)
        with contextlib.suppress(OSError):  # only spares the next launch the check: never a reason to refuse
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()


class _Refused(Exception):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index, self.message = index, message


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        _check(json.loads(sys.stdin.read()))
    except _Refused as refused:
        print(json.dumps({"run": refused.index, "error": refused.message}))
        return 2
    return 0
