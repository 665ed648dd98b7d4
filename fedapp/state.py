"""A client's personal state: what stays on the device between rounds.

Two stores with one interface. :class:`MemoryStateStore` keeps arrays in a
mapping that outlives a round (in Flower, the node's ``Context.state``);
:class:`DiskStateStore` writes one ``.safetensors`` file per name under
``<state-dir>/<run-name>/partition-<id>/`` so large personal models leave
memory between rounds and survive a process or SuperLink restart.

Personal state belongs to one run. The server stamps every instruction with its
run's token (:data:`RUN_TOKEN_KEY`: made when the run starts, kept in its
checkpoint, so a resumed run sends the same one), and a disk store keeps the token
of the run its files belong to (``run.json``). State another run left under the
same name is never loaded into a new run: it is set aside, whole, next to the
folder, and the client starts afresh; a new run continues an earlier run's
personal state only when it says so (``personal-state-from``), and the node's
``run.json`` records where its state came from.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Protocol

import numpy as np
import safetensors
import safetensors.numpy

from fedapp.errors import StateError

StateArrays = dict[str, np.ndarray]

RUN_TOKEN_KEY = "run-token"
"""The instruction key that names the run a client's personal state must belong to."""

STATE_SUFFIX = ".safetensors"
"""A disk store's file per name: ``<name>.safetensors``."""

LEGACY_SUFFIX = ".npz"
"""The file per name that releases before safetensors wrote; still read."""

RUN_FILE = "run.json"
"""A disk store's record of the run its files belong to (and the run it continued, if any)."""

log = logging.getLogger(__name__)


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

    def join_run(self, token: str | None, continue_from: str = "") -> None:
        """Bind the store to the run ``token`` names before its state is read (see the module)."""
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

    def join_run(self, token: str | None, continue_from: str = "") -> None:
        """Nothing to check: the mapping is the run's own (Flower gives every run a new ``Context``)."""


class DiskStateStore:
    """State as ``.safetensors`` files in a per-run, per-client folder, written atomically, with
    the token of the run they belong to in ``run.json`` (:meth:`join_run`).

    safetensors rather than ``.npz``: reading a file is a header and one copy per array,
    where ``np.load`` also checks a zip checksum over every byte, which showed in the
    per-message cost at scale. ``.npz`` files that earlier releases wrote are still read.
    """

    def __init__(self, root: str | os.PathLike, run_name: str, partition_id: int | str):
        self.root = Path(root).expanduser()
        self.partition = f"partition-{partition_id}"
        self.directory = self.root / run_name / self.partition

    def owner(self) -> dict[str, str] | None:
        """What ``run.json`` says (``run-token``, and ``continued-from`` if set), or None without one."""
        try:
            return json.loads((self.directory / RUN_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise StateError(f"client state record {self.directory / RUN_FILE} is unreadable ({err})") from err

    def join_run(self, token: str | None, continue_from: str = "") -> None:
        """Make this folder the state of run ``token`` before anything is read from it.

        State of another run (or of no recorded run) is moved aside whole, to
        ``partition-<id>.run-<its token>``, and the client starts afresh, unless it is this
        run's own. ``continue_from`` (a run name) starts a new run from the state that run
        left in this node's ``state-dir``, copied, never moved. ``token`` None (a server that
        sends none) checks nothing.
        """
        if token is None:
            return
        owner = self.owner()
        if owner is not None and owner.get(RUN_TOKEN_KEY) == token:
            return
        if self.directory.exists():
            self._set_aside(owner)
        record = {RUN_TOKEN_KEY: token}
        source = self.root / continue_from / self.partition if continue_from else None
        if source is not None and source.is_dir():
            shutil.copytree(source, self.directory, ignore=shutil.ignore_patterns(RUN_FILE, "*.tmp"))
            record["continued-from"] = continue_from
            log.info("personal state of %s continues from run %s", self.directory, continue_from)
        elif source is not None:
            log.warning(
                "no personal state of run %s at %s on this node: this client starts afresh", continue_from, source
            )
        self._make_directory()
        (self.directory / RUN_FILE).write_text(json.dumps(record) + "\n")

    def _set_aside(self, owner: dict[str, str] | None) -> None:
        earlier = owner.get(RUN_TOKEN_KEY, "unknown") if owner else "unknown"
        aside = self.directory.with_name(f"{self.partition}.run-{earlier}")
        for suffix in range(1, 1000):
            if not aside.exists():
                break
            aside = self.directory.with_name(f"{self.partition}.run-{earlier}-{suffix}")
        os.replace(self.directory, aside)
        log.warning(
            "personal state in %s belongs to another run: moved to %s; this run's clients start afresh "
            "(resume=true continues a run; personal-state-from continues another run's personal state)",
            self.directory,
            aside,
        )

    def _make_directory(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.W_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as err:
            raise StateError(
                f"cannot write client state under {self.directory} ({err.strerror or err}): "
                "the state-dir must be a writable folder"
            ) from err

    def path(self, name: str) -> Path:
        return self.directory / f"{name}{STATE_SUFFIX}"

    def load(self, name: str) -> StateArrays | None:
        path, legacy = self.path(name), self.directory / f"{name}{LEGACY_SUFFIX}"
        try:
            if path.exists():
                return safetensors.numpy.load_file(path)
            if legacy.exists():
                path = legacy
                with np.load(path, allow_pickle=False) as data:
                    return {key: data[key] for key in data.files}
        except (OSError, ValueError, zipfile.BadZipFile, safetensors.SafetensorError) as err:
            raise StateError(f"client state file {path} is unreadable ({err}); delete it to start fresh") from err
        return None

    def save(self, name: str, arrays: StateArrays) -> None:
        self._make_directory()
        # Write then rename, so a crash mid-write never leaves a torn file behind.
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        try:
            os.close(fd)
            # save_file writes straight from the arrays' buffers: several times faster than save().
            safetensors.numpy.save_file({key: np.ascontiguousarray(a) for key, a in arrays.items()}, tmp)
            os.replace(tmp, self.path(name))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        # An earlier release's file of the same name would otherwise outlive the state that replaced it.
        (self.directory / f"{name}{LEGACY_SUFFIX}").unlink(missing_ok=True)
