"""A client's personal state: what stays on the device between rounds.

Two stores with one interface. :class:`MemoryStateStore` keeps arrays in a
mapping that outlives a round (in Flower, the node's ``Context.state``);
:class:`DiskStateStore` writes one ``.npz`` per client under
``<state-dir>/<run-name>/partition-<id>.npz`` so large personal models leave
memory between rounds and survive a process or SuperLink restart.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Protocol

import numpy as np

from fedapp.errors import StateError

StateArrays = dict[str, np.ndarray]


def on_supernode() -> bool:
    """Whether this process is a SuperNode's ClientApp process (``flwr-clientapp``), as
    opposed to a simulation worker or a script that builds clients itself: on a SuperNode
    the node decides where it writes (its state, its exported models)."""
    return Path(sys.argv[0]).name == "flwr-clientapp"


class StateStore(Protocol):
    """Load and save one client's named arrays."""

    def load(self, name: str) -> StateArrays | None:
        """Return the arrays saved under ``name``, or None if nothing was saved."""
        ...

    def save(self, name: str, arrays: StateArrays) -> None:
        """Persist ``arrays`` under ``name``, replacing what was there."""
        ...


class MemoryStateStore:
    """State kept in a mapping owned by the caller (e.g. Flower's ``Context.state``).

    Values are stored through ``encode``/``decode`` so the same class can wrap a
    plain dict (tests) or a Flower ``RecordDict`` (the client app passes
    converters to ``ArrayRecord``).
    """

    def __init__(self, mapping: MutableMapping, prefix: str = "fedapp", encode=None, decode=None):
        self._mapping = mapping
        self._prefix = prefix
        self._encode = encode or (lambda arrays: {k: v.copy() for k, v in arrays.items()})
        self._decode = decode or (lambda stored: {k: v.copy() for k, v in stored.items()})

    def _key(self, name: str) -> str:
        return f"{self._prefix}.{name}"

    def load(self, name: str) -> StateArrays | None:
        stored = self._mapping.get(self._key(name))
        return None if stored is None else self._decode(stored)

    def save(self, name: str, arrays: StateArrays) -> None:
        self._mapping[self._key(name)] = self._encode(arrays)


class DiskStateStore:
    """State as ``.npz`` files in a per-run, per-client folder, written atomically."""

    def __init__(self, root: str | os.PathLike, run_name: str, partition_id: int | str):
        self.directory = Path(root).expanduser() / run_name / f"partition-{partition_id}"

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.npz"

    def load(self, name: str) -> StateArrays | None:
        path = self.path(name)
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                return {key: data[key] for key in data.files}
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise StateError(f"client state file {path} is unreadable ({err}); delete it to start fresh") from err

    def save(self, name: str, arrays: StateArrays) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a crash mid-write never leaves a torn file behind.
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        except OSError as err:
            raise StateError(
                f"cannot write client state under {self.directory} ({err.strerror or err}): "
                "the state-dir must be a writable folder"
            ) from err
        try:
            with os.fdopen(fd, "wb") as handle:
                np.savez(handle, **arrays)
            os.replace(tmp, self.path(name))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
