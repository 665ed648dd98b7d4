"""The server side's checkpoints: where a run keeps its checkpoint (:func:`checkpoint_path_of`),
writing one after a round (:func:`write_checkpoint`), and reading one back for a resumed
run, checked against this run's configuration and the arrays and state its method builds
(:func:`read_resume_point`). The file format, and its checks, are the Flower-free
:mod:`fedapp.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.aggregation import Arrays
from fedapp.checkpoint import FILENAME as CHECKPOINT_FILE
from fedapp.checkpoint import (
    ServerCheckpoint,
    check_resumable,
    check_state_shapes,
    load_checkpoint,
    rng_state,
    save_checkpoint,
)
from fedapp.config import RunConfig
from fedapp.errors import StateError
from fedapp.flower.recording import RunTotals
from fedapp.metrics import RoundRecord, RunRecorder


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: the state after its last completed round."""

    round: int
    global_arrays: Arrays
    strategy_state: dict[str, np.ndarray]
    totals: RunTotals
    #: The records of the completed rounds.
    history: list[RoundRecord]
    #: The server's generator states (:func:`fedapp.checkpoint.restore_rng_state` puts them back).
    rng: dict[str, Any]
    #: The run's token (None in a checkpoint made before runs had one).
    run_token: str | None


def checkpoint_path_of(recorder: RunRecorder | None) -> Path | None:
    """Where the run that ``recorder`` writes keeps its checkpoint (None when no results folder is written)."""
    return None if recorder is None else recorder.directory / CHECKPOINT_FILE


def write_checkpoint(
    path: Path,
    server_round: int,
    config: RunConfig,
    global_arrays: Arrays,
    strategy_state: dict[str, np.ndarray],
    totals: RunTotals,
    history: Sequence[RoundRecord],
    run_token: str | None = None,
) -> Path:
    """Write everything needed to continue after ``server_round`` to ``path`` (atomically),
    with the server's current generator states; returns ``path``."""
    checkpoint = ServerCheckpoint(
        round=server_round,
        config=config.as_dict(),
        global_arrays=list(global_arrays),
        strategy_state=strategy_state,
        totals=totals.as_checkpoint(),
        records=[asdict(record) for record in history],
        rng=rng_state(),
        run_token=run_token,
    )
    return save_checkpoint(path, checkpoint)


def read_resume_point(
    path: Path | None,
    config: RunConfig,
    initial_arrays: Callable[[], Arrays],
    strategy_state: Callable[[], dict[str, np.ndarray]],
) -> ResumePoint:
    """The checkpoint at ``path``, once it is known to fit this run.

    ``initial_arrays`` and ``strategy_state`` are the method's hooks; they are
    called only after the checkpoint has been read, and what they return gives
    the shapes and dtypes that its global arrays and state must have.

    Raises
    ------
    fedapp.errors.StateError
        If there is no results folder (``path`` None), or the checkpoint is
        missing, corrupt, of another method or other settings, or holds arrays
        or state of other shapes than the method builds.
    """
    if path is None:
        raise StateError("resume needs a results folder (results-dir/run-name) to read the checkpoint from")
    checkpoint = load_checkpoint(path)
    check_resumable(checkpoint, config.as_dict(), path)
    fresh = initial_arrays()
    if [(a.shape, a.dtype) for a in fresh] != [(a.shape, a.dtype) for a in checkpoint.global_arrays]:
        raise StateError(f"checkpoint {path} holds global arrays of other shapes than this method builds")
    check_state_shapes(checkpoint.strategy_state, strategy_state(), path)
    return ResumePoint(
        round=checkpoint.round,
        global_arrays=checkpoint.global_arrays,
        strategy_state=checkpoint.strategy_state,
        totals=RunTotals.from_checkpoint(checkpoint.totals),
        history=[round_record(row, path) for row in checkpoint.records],
        rng=checkpoint.rng,
        run_token=checkpoint.run_token,
    )


def round_record(row: Mapping[str, Any], path: Path) -> RoundRecord:
    """A checkpoint's record of one round, its fields those this version writes.

    Raises
    ------
    fedapp.errors.StateError
        Naming the checkpoint, the round and the fields it has that a record has not, or lacks.
    """
    fields = {f.name: f for f in dataclasses.fields(RoundRecord)}
    required = {name for name, f in fields.items() if f.default is MISSING and f.default_factory is MISSING}
    unknown, missing = sorted(set(row) - set(fields)), sorted(required - set(row))
    if unknown or missing:
        has = [f"has {', '.join(unknown)}"] if unknown else []
        what = " and ".join(has + ([f"lacks {', '.join(missing)}"] if missing else []))
        raise StateError(
            f"checkpoint {path}: the record of round {row.get('round', '?')} {what}, which a round record of "
            "this version does not: it was written by another program or version, so the run cannot resume from it"
        )
    return RoundRecord(**row)


def begin_run(config: RunConfig, recorder: RunRecorder | None) -> str:
    """A new token for a run that starts (clients bind their personal state to it:
    :meth:`fedapp.state.DiskStateStore.join_run`); its ``summary.json`` records where it began."""
    token = uuid.uuid4().hex[:16]
    _note_origin(config, recorder, token, f"initialisation (seed {config.seed})")
    return token


def resume_run(config: RunConfig, recorder: RunRecorder | None, point: ResumePoint, token: str) -> str:
    """The token of a resumed run: its checkpoint's, so that its clients' state is still theirs
    (``token``, a new one, for a checkpoint made before runs had tokens: that state is set aside)."""
    token = point.run_token or token
    _note_origin(config, recorder, token, f"this run's checkpoint after round {point.round}")
    return token


def _note_origin(config: RunConfig, recorder: RunRecorder | None, token: str, global_state: str) -> None:
    earlier = config.personal_state_from
    personal = f"run {earlier!r}, copied on each node" if earlier else "this run's own"
    if recorder is not None:
        recorder.summary_extra.update(
            {"run_token": token, "global_state_from": global_state, "personal_state_from": personal}
        )
