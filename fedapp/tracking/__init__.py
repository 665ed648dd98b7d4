"""Experiment trackers (MLflow, TensorBoard) that follow a run's recorder.

A tracker is a :class:`~fedapp.metrics.RunObserver`: the recorder hands it every
round's record and, after the last round, the run's files; ``metrics.jsonl`` stays
the source of truth. Each tracker's package (the ``[tracking]`` extra) is imported
only when a run asks for that tracker, so a run without one never pays for it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fedapp.config import RunConfig
from fedapp.errors import ConfigError
from fedapp.metrics import RunObserver

#: The package each tracker needs (the ``[tracking]`` extra installs them).
TRACKER_PACKAGES = {"mlflow": "mlflow", "tensorboard": "tensorboard"}


def check_tracker_installed(config: RunConfig) -> None:
    """Refuse a tracker whose package is missing, in one line naming the extra to install.

    Only the server side logs to a tracker, so this is checked where the server starts
    (:func:`fedapp.server_app.build_strategy`, the launcher) and not by the run-config rules
    every client also runs: an edge device needs no tracker. Looked up without importing the
    package (MLflow takes seconds to import).

    Raises
    ------
    fedapp.errors.ConfigError
        If ``config.tracker`` names a tracker whose package is not importable.
    """
    package = TRACKER_PACKAGES.get(config.tracker)
    if package is not None and importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"config key 'tracker' = {config.tracker!r} needs the {package} package, which is not installed: "
            "pip install -e '.[tracking]'"
        )


def open_tracker(config: RunConfig, run_dir: Path) -> RunObserver | None:
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
    check_tracker_installed(config)
    if config.tracker == "mlflow":
        from fedapp.tracking.mlflow import MlflowTracker  # noqa: PLC0415 - mlflow only when asked for

        return MlflowTracker.open(config, run_dir)
    if config.tracker == "tensorboard":
        from fedapp.tracking.tensorboard import TensorBoardTracker  # noqa: PLC0415 - tensorboard only when asked for

        return TensorBoardTracker(config, run_dir)
    return None
