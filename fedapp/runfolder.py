"""A run's results folder on disk: a fresh run never writes over another's results, a resumed one
needs its folder, one process at a time writes it (``.lock``), and every folder a run writes is
checked for writability before round 1."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from fedapp.errors import ConfigError, StateError

log = logging.getLogger("flwr.fedapp")

RESULT_FILES = ("metrics.jsonl", "summary.json", "checkpoint.npz")
"""What makes a folder hold a run's results: a fresh run never writes over them."""

LOCK_FILE = ".lock"
SWEEP_LOCK_FILE = ".sweep.lock"

SET_ASIDE_MARK = ".incomplete-"
"""What a sweep puts between a run folder's name and an attempt number when it moves an attempt
that cannot resume out of the way (``<name>.incomplete-<n>``): kept, but no longer the run."""


# Run folders this process holds the lock of. A process takes its own lock over (a stopped run
# resumed in the same process, as the in-process simulation engine does in tests); other processes are refused.
_HELD_LOCKS: dict[Path, IO[str]] = {}


# A stopped run's ServerApp learns of ``flwr stop`` only at its next task heartbeat (Flower sends one
# every 17-23 s, with a 5 s call timeout) and holds its folder's lock until then: a resume submitted
# right after the stop waits this long for it before refusing.
STOPPED_RUN_GRACE_S = 45.0


def lock_folder(directory: Path, wait_s: float = 0.0) -> IO[str]:
    """An exclusive ``flock`` on ``directory/.lock``, held while the returned file is open.

    Parameters
    ----------
    directory
        The run folder.
    wait_s
        How long to wait for another process to release the lock (0: refuse at once).

    Raises
    ------
    StateError
        If another process still holds it after ``wait_s`` (that process is writing this run).
    """
    key = directory.resolve()
    held = _HELD_LOCKS.get(key)
    if held is not None and not held.closed:
        return held
    handle = (directory / LOCK_FILE).open("a")
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if time.monotonic() >= deadline:
                handle.close()
                raise StateError(
                    f"run folder {directory} is being written by another run (its lock is held"
                    + (f" after {wait_s:.0f} s" if wait_s else "")
                    + "): wait for that run to end, or choose another run-name"
                ) from None
        if not waiting:
            waiting = True
            log.info(
                "run folder %s is locked by another run (a stopped one exits at its next heartbeat): "
                "waiting up to %.0f s",
                directory,
                wait_s,
            )
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    _HELD_LOCKS[key] = handle
    return handle


def lock_results_folder(directory: Path) -> IO[str]:
    """An exclusive ``flock`` on a sweep's ``directory/.sweep.lock``, held while the returned file is
    open: two sweeps into one results folder would each write a report of half the runs.

    Raises
    ------
    StateError
        If another sweep holds it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    handle = (directory / SWEEP_LOCK_FILE).open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise StateError(
            f"results folder {directory} is being written by another sweep: wait for it to end, "
            "or choose another --results-dir"
        ) from None
    return handle


def release_folder(directory: Path) -> None:
    """Release this process's lock on ``directory`` (also released when the process ends)."""
    handle = _HELD_LOCKS.pop(directory.resolve(), None)
    if handle is not None:
        handle.close()


def held_results(directory: Path) -> list[str]:
    """The result files in ``directory`` that hold something (an empty metrics file does not count)."""
    return [name for name in RESULT_FILES if (directory / name).is_file() and (directory / name).stat().st_size > 0]


def finished_rounds(directory: Path) -> int:
    """The rounds a finished run's ``summary.json`` records (0: no summary, or not readable). The
    summary is written when the last round is, so a run resumed with this many rounds or fewer
    configured has nothing left to run."""
    try:
        return int(json.loads((directory / "summary.json").read_text()).get("rounds", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def nothing_to_resume(directory: Path, num_rounds: int) -> str | None:
    """The message for a resume of a run that finished all its ``num_rounds`` (None: it did not).
    Such a resume runs nothing and leaves every file of the run as it was."""
    done = finished_rounds(directory)
    if done and done >= num_rounds:
        return f"run folder {directory} finished all {done} rounds before: nothing to resume, its files are unchanged"
    return None


def set_aside(run_dir: Path) -> Path:
    """Rename ``run_dir`` to the first free ``<name>.incomplete-<n>`` and return the new path."""
    for attempt in itertools.count(1):
        target = run_dir.with_name(f"{run_dir.name}{SET_ASIDE_MARK}{attempt}")
        if not target.exists():
            run_dir.rename(target)
            return target
    raise AssertionError("unreachable")


def is_set_aside(folder: Path) -> bool:
    """Whether ``folder`` is an attempt a sweep moved aside: its name ends in :data:`SET_ASIDE_MARK`
    and an attempt number (a run merely named ``...incomplete-x`` is not)."""
    stem, mark, attempt = folder.name.rpartition(SET_ASIDE_MARK)
    return bool(stem and mark) and attempt.isdigit()


def check_run_folder(directory: Path, *, resume: bool) -> None:
    """Refuse a fresh run into a folder that holds results, or a resume of one that does not exist.

    Raises
    ------
    StateError
        Naming the folder and what to do instead; nothing is written either way.
    """
    if not resume and (held := held_results(directory)):
        raise StateError(
            f"run folder {directory} already holds a run ({', '.join(held)}): set resume=true to "
            "continue it, or choose another run-name (results are never overwritten)"
        )
    if resume and not directory.is_dir():
        raise StateError(f"resume=true, but run folder {directory} does not exist: nothing to resume")


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be written (None when it can), found by creating what is missing
    of it and a temporary file inside, then removing all of that: the disk is left as it was."""
    created: list[Path] = []
    try:
        for missing in reversed([p for p in (folder, *folder.parents) if not p.exists()]):
            missing.mkdir()
            created.append(missing)
        with tempfile.TemporaryFile(dir=folder):
            pass
        return None
    except OSError as err:
        return err.strerror or str(err)
    finally:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir()


def check_writable_folders(config: Mapping[str, Any], *, results: bool = True, simulation: bool = False) -> None:
    """Refuse, before any work, a ``results-dir`` (when ``results``), an explicitly set
    ``cache-dir``, or (``simulation``, where the run config's ``state-dir`` is where the
    clients write their state) the ``state-dir`` of ``state = "disk"``, that this process
    cannot write. On SuperNodes the nodes' own ``state-dir`` applies, which the server cannot probe.

    Raises
    ------
    ConfigError
        Naming the key, the folder and the system's reason.
    """
    keys = (["results-dir"] if results else []) + (["cache-dir"] if config.get("cache-dir") else [])
    keys += ["state-dir"] if simulation and config.get("state") == "disk" else []
    for key in keys:
        folder = Path(str(config[key])).expanduser().absolute()
        if (reason := unwritable(folder)) is not None:
            raise ConfigError(
                f"config key '{key}' = {config[key]!r} cannot be written ({reason}): choose a folder you can write"
            )


# ----- files a tool writes: each carries its tool's mark, and a tool rewrites only a file with its mark -----


def written_by_line(tool: str) -> str:
    """The last line of every Markdown file ``tool`` writes (an HTML comment: no renderer shows it)."""
    return f"<!-- written by {tool}; it rewrites only files that end with this line -->"


def mark_markdown(text: str, tool: str) -> str:
    """``text`` ending with ``tool``'s :func:`written_by_line`."""
    return f"{text.rstrip()}\n\n{written_by_line(tool)}\n"


def written_by(path: Path, tool: str) -> bool:
    """Whether ``path`` carries ``tool``'s mark: a PNG's ``Software`` text, a JSON object's
    ``written_by``, any other file's last line (:func:`written_by_line`)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".png":
            from PIL import Image  # noqa: PLC0415 - only a figure's check needs it

            with Image.open(path) as image:
                return image.info.get("Software") == tool
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            return isinstance(data, dict) and data.get("written_by") == tool
        lines = path.read_text(encoding="utf-8").rstrip().splitlines()
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON, not an image: not ours
        return False
    return bool(lines) and lines[-1] == written_by_line(tool)


def check_rewritable(path: Path, tool: str, what: str) -> None:
    """Refuse, before anything is written, to overwrite a file ``tool`` did not write.

    Raises
    ------
    ConfigError
        ``path`` exists and lacks ``tool``'s mark; the message names ``what`` (the flag) and the file.
    """
    path = Path(path)
    if path.is_file() and not written_by(path, tool):
        raise ConfigError(
            f"{what} {path} exists and was not written by {tool}: it is not overwritten; "
            "name a file that does not exist yet, or move that one away"
        )
