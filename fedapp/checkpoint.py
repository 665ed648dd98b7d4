"""Server checkpoints: everything a stopped run needs to continue exactly.

One ``checkpoint.npz`` per run folder, rewritten atomically after every round:
the global arrays, the strategy's own state (e.g. FedD2P's prompt generator),
the completed round, the running totals, the per-round records so far, the
server's random number generator states and the run configuration it was made
under. Plain ``numpy`` files without pickles, so a checkpoint from an untrusted
place cannot run code; the metadata is JSON stored as bytes.

Clients' personal state is not here: it lives on the clients (``state="disk"``).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedapp.errors import StateError

FORMAT_VERSION = 1
FILENAME = "checkpoint.npz"

#: Keys that may differ between the stopped run and its continuation: they do
#: not change what the remaining rounds compute.
RESUMABLE_CHANGES = frozenset(
    {
        "num-rounds",
        "resume",
        "results-dir",
        "device",
        "target-accuracy",
        "preset",
        "traceback",
        "cache-dir",
        "tracker",
        "tracking-uri",
        "export-models",
        "api",
    }
)

META_KEYS = frozenset(
    {"format", "round", "config", "num_global_arrays", "state_names", "totals", "records", "rng", "run_token"}
)
TOTALS = frozenset({"mb_cumulative", "mb_eval_cumulative", "params_cumulative", "flops_cumulative"})
RNG_ARRAYS = ("numpy_keys", "torch")


@dataclass
class ServerCheckpoint:
    """A run's server side after ``round`` completed rounds."""

    round: int
    config: dict[str, Any]
    global_arrays: list[np.ndarray]
    strategy_state: dict[str, np.ndarray] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    rng: dict[str, Any] = field(default_factory=dict)
    #: The token of the run (what clients' personal state is bound to); None in checkpoints made before it.
    run_token: str | None = None

    @property
    def method(self) -> str:
        return str(self.config.get("method", ""))


def rng_state() -> dict[str, Any]:
    """The server process's generator states (Python, NumPy's global, torch CPU)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "numpy_keys": np.asarray(keys, dtype=np.uint32),
        "torch": torch.get_rng_state().numpy().copy(),
    }


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], state["numpy_keys"], numpy["pos"], numpy["has_gauss"], numpy["cached"]))
    torch.set_rng_state(torch.from_numpy(np.asarray(state["torch"], dtype=np.uint8).copy()))


def save_checkpoint(path: str | os.PathLike, checkpoint: ServerCheckpoint) -> Path:
    """Write ``checkpoint`` to ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = dict(checkpoint.rng)
    arrays: dict[str, np.ndarray] = {f"global/{i}": np.asarray(a) for i, a in enumerate(checkpoint.global_arrays)}
    arrays.update({f"state/{name}": np.asarray(a) for name, a in checkpoint.strategy_state.items()})
    for name in ("numpy_keys", "torch"):
        if name in rng:
            arrays[f"rng/{name}"] = np.asarray(rng.pop(name))
    meta = {
        "format": FORMAT_VERSION,
        "round": checkpoint.round,
        "config": checkpoint.config,
        "num_global_arrays": len(checkpoint.global_arrays),
        "state_names": sorted(checkpoint.strategy_state),
        "totals": checkpoint.totals,
        "records": checkpoint.records,
        "rng": rng,
        "run_token": checkpoint.run_token,
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".checkpoint-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | os.PathLike) -> ServerCheckpoint:
    """Read a checkpoint, refusing anything that is not a complete one of ours."""
    path = Path(path)
    if not path.exists():
        raise StateError(f"no checkpoint at {path}: nothing to resume (was the run started with these settings?)")
    try:
        # Our own handle, closed however np.load fails (on a truncated archive it left its own open).
        with path.open("rb") as handle, np.load(handle, allow_pickle=False) as data:
            stored = {name: data[name] for name in data.files}
        meta = json.loads(bytes(stored.pop("meta")).decode())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as err:
        raise StateError(f"checkpoint {path} is corrupt or not a fedapp checkpoint ({err})") from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise StateError(f"checkpoint {path} has format {found!r}; this version reads format {FORMAT_VERSION}")
    unknown = sorted(set(meta) - META_KEYS)
    if unknown:
        raise StateError(f"checkpoint {path} has fields this version does not know: {', '.join(unknown)}")
    try:
        global_arrays = [stored.pop(f"global/{i}") for i in range(int(meta["num_global_arrays"]))]
        state = {name: stored.pop(f"state/{name}") for name in meta["state_names"]}
        rng = dict(meta["rng"])
        rng.update({name: stored.pop(f"rng/{name}") for name in RNG_ARRAYS if f"rng/{name}" in stored})
        if stored:
            raise StateError(f"checkpoint {path} holds arrays it does not list: {', '.join(sorted(stored))}")
        checkpoint = ServerCheckpoint(
            round=int(meta["round"]),
            config=dict(meta["config"]),
            global_arrays=global_arrays,
            strategy_state=state,
            totals={k: float(v) for k, v in meta["totals"].items()},
            records=list(meta["records"]),
            rng=rng,
            run_token=meta.get("run_token"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise StateError(f"checkpoint {path} is incomplete ({err!r} missing or malformed)") from err
    check_contents(checkpoint, path)
    return checkpoint


def check_contents(checkpoint: ServerCheckpoint, path: str | os.PathLike) -> None:
    """Refuse a checkpoint whose fields are out of range, whatever wrote it: a negative round
    count, records that are not increasing rounds in 1..round, unknown or negative or
    non-finite totals, and global or strategy arrays with NaN or infinite values."""
    where = f"checkpoint {path}"
    if checkpoint.round < 0:
        raise StateError(f"{where} says {checkpoint.round} rounds completed; a round count is >= 0")
    rounds = [record.get("round") if isinstance(record, dict) else None for record in checkpoint.records]
    in_range = all(isinstance(r, int) and 1 <= r <= checkpoint.round for r in rounds)
    if not in_range or rounds != sorted(set(rounds)):
        raise StateError(f"{where} records rounds {rounds[:8]}; expected increasing rounds in 1..{checkpoint.round}")
    unknown = sorted(set(checkpoint.totals) - TOTALS)
    if unknown:
        raise StateError(f"{where} has totals this version does not know: {', '.join(unknown)}")
    bad = sorted(name for name, value in checkpoint.totals.items() if not np.isfinite(value) or value < 0)
    if bad:
        raise StateError(f"{where} has negative or non-finite totals: {', '.join(bad)}")
    named = [(f"global/{i}", a) for i, a in enumerate(checkpoint.global_arrays)]
    named += [(f"state/{name}", a) for name, a in checkpoint.strategy_state.items()]
    for name, array in named:
        if array.dtype.kind not in "biuf":
            raise StateError(f"{where}: array {name} has dtype {array.dtype}; model arrays are numbers")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise StateError(f"{where}: array {name} holds NaN or infinite values")


def check_resumable(checkpoint: ServerCheckpoint, config: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Refuse to continue a run under settings that would compute something else, or past its end."""
    method = str(config["method"])
    if checkpoint.method != method:
        raise StateError(f"checkpoint {path} belongs to method {checkpoint.method!r}, not {method!r}")
    if checkpoint.round > int(config["num-rounds"]):
        raise StateError(
            f"checkpoint {path} completed {checkpoint.round} rounds, more than num-rounds = {config['num-rounds']};"
            " set num-rounds to at least that many to continue"
        )
    changed = sorted(
        key
        for key in set(checkpoint.config) | set(config)
        if key not in RESUMABLE_CHANGES and checkpoint.config.get(key) != config.get(key)
    )
    if changed:
        details = ", ".join(f"{k}: {checkpoint.config.get(k)!r} -> {config.get(k)!r}" for k in changed)
        raise StateError(f"checkpoint {path} was written under other settings ({details}); resume with the same ones")


def check_state_shapes(
    stored: Mapping[str, np.ndarray], fresh: Mapping[str, np.ndarray], path: str | os.PathLike
) -> None:
    """Refuse strategy state with names or shapes other than the method's own (``fresh``;
    empty when the method has not built its state yet, which then checks it on loading)."""
    if not fresh:
        return
    unknown, missing = sorted(set(stored) - set(fresh)), sorted(set(fresh) - set(stored))
    if stored and (unknown or missing):
        raise StateError(f"checkpoint {path}: strategy state unknown {unknown}, missing {missing}")
    wrong = [name for name in stored if np.shape(stored[name]) != np.shape(fresh[name])]
    if wrong:
        raise StateError(
            f"checkpoint {path}: strategy state {', '.join(wrong)} has other shapes than this method builds"
        )


def what_can_resume(directory: Path) -> str:
    """What a stopped run's folder holds to continue from, as the files on disk say: the round its
    checkpoint can resume after, or that it has none (then the run must start again)."""
    path = Path(directory) / FILENAME
    try:
        completed = load_checkpoint(path).round
    except (OSError, StateError):
        return f"it has no readable checkpoint ({path}): free space and start the run again under a new run-name"
    return (
        f"its checkpoint of round {completed} ({path}) is intact: free space and run the same configuration "
        "with resume=true to continue"
    )
