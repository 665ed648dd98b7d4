"""Experiment trackers (MLflow, TensorBoard) that follow a run's recorder.

A tracker is a :class:`~fedapp.metrics.RunObserver`: the recorder hands it every
round's record and, after the last round, the run's files; ``metrics.jsonl`` stays
the source of truth. Each tracker's package (the ``[tracking]`` extra) is imported
only when a run asks for that tracker, so a run without one never pays for it.
"""

from __future__ import annotations

from pathlib import Path

from fedapp.extras import TRACKERS, require
from fedapp.metrics import RunObserver
from fedapp.tracking.scalars import TrackedRun


def open_tracker(config: TrackedRun, run_dir: Path) -> RunObserver | None:
    """The tracker ``config.tracker`` names, opened for the run written to ``run_dir``.

    Parameters
    ----------
    config
        The run's configuration (``tracker``, ``tracking-uri``, ``results-dir``, ``resume``).
    run_dir
        The run folder (``results-dir/run-name``), which already exists.

    Returns
    -------
    RunObserver or None
        An MLflow run (:class:`fedapp.tracking.mlflow.MlflowTracker`), a TensorBoard writer
        (:class:`fedapp.tracking.tensorboard.TensorBoardTracker`), or None for ``tracker = "none"``.

    Raises
    ------
    fedapp.errors.ConfigError
        If the tracker's package is missing, or MLflow cannot open its run at the tracking URI.
    """
    if config.tracker in TRACKERS:
        require(TRACKERS[config.tracker], f"config key 'tracker' = {config.tracker!r}")
    if config.tracker == "mlflow":
        from fedapp.tracking.mlflow import MlflowTracker  # noqa: PLC0415 - mlflow only when asked for

        return MlflowTracker.open(config, run_dir)
    if config.tracker == "tensorboard":
        from fedapp.tracking.tensorboard import TensorBoardTracker  # noqa: PLC0415 - tensorboard only when asked for

        return TensorBoardTracker(config, run_dir)
    return None
