"""The MLflow tracker: one MLflow run per run folder, holding the resolved configuration as
params, every round's numbers as metrics (step = round) and the run's files as artifacts.

By default the tracking store is ``sqlite:///<results-dir>/mlflow.db`` with artifacts in
``<results-dir>/mlartifacts/`` (MLflow 3 refuses new work in its file store, and its default
artifact root is ``./mlruns`` in the working directory, outside the folders the user chose);
``tracking-uri`` names any other store, a shared server included. A resumed run continues the
MLflow run tagged with its run folder. Logging a round or a file never stops the run:
``metrics.jsonl`` stays the source of truth, and a store that fails mid-run costs a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from mlflow.entities import Metric, Param, Run, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH
from sqlalchemy.exc import SQLAlchemyError

from fedapp.errors import ConfigError
from fedapp.metrics import RoundRecord
from fedapp.tracking.scalars import TrackedRun, config_params, round_scalars

log = logging.getLogger("flwr.fedapp")

#: Every run of this app goes to one experiment, so runs of different methods compare side by side
#: (each run's ``method``, ``dataset`` ... are params).
EXPERIMENT_NAME = "fedapp"
#: The tag naming a run's folder (absolute), by which a resumed run finds its MLflow run.
RUN_FOLDER_TAG = "fedapp.run_folder"
#: The configuration keys a resume changed (``resume`` at least): MLflow params cannot change.
RESUMED_WITH_TAG = "fedapp.resumed_with"
#: Run files not logged: the checkpoint is this app's resume state (the whole server state, often
#: the largest file), not a result; the exported models under ``models/`` are what others load.
NOT_LOGGED = frozenset({"checkpoint.npz"})

#: What MLflow's client raises when its store fails (requests' errors are OSErrors; a SQL store
#: that cannot be opened raises SQLAlchemy's own, after MLflow's retries).
STORE_ERRORS = (MlflowException, OSError, SQLAlchemyError)


def default_tracking_uri(results_dir: str | Path) -> str:
    """``sqlite:///<absolute results-dir>/mlflow.db``: the store inside the folder the user chose."""
    return f"sqlite:///{Path(results_dir).expanduser().absolute() / 'mlflow.db'}"


def artifact_location(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store's database file
    (``mlartifacts/``), else where the tracking server decides (None)."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    database = Path(tracking_uri.removeprefix(prefix)).expanduser().absolute()
    return (database.parent / "mlartifacts").as_uri()


def experiment_id(client: MlflowClient, tracking_uri: str) -> str:
    """The id of :data:`EXPERIMENT_NAME` in the store, created when it is missing."""
    experiment = client.get_experiment_by_name(EXPERIMENT_NAME)
    if experiment is not None:
        return experiment.experiment_id
    return client.create_experiment(EXPERIMENT_NAME, artifact_location=artifact_location(tracking_uri))


def run_of_folder(client: MlflowClient, experiment: str, run_folder: str) -> Run | None:
    """The newest MLflow run tagged with ``run_folder`` (None if there is none, or if the path holds
    both kinds of quote: MLflow's filter language has no escape for a quote inside a string)."""
    quote = "'" if "'" not in run_folder else '"'
    if quote in run_folder:
        return None
    runs = client.search_runs(
        [experiment],
        filter_string=f"tags.`{RUN_FOLDER_TAG}` = {quote}{run_folder}{quote}",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return runs[0] if runs else None


class MlflowTracker:
    """Follows one run in MLflow (a :class:`~fedapp.metrics.RunObserver`); made by :meth:`open`.

    The MLflow run is ``RUNNING`` while rounds are logged, ``FINISHED`` once the run's files are
    logged after the last round, and ``FAILED`` if the tracker is closed before that. A resumed
    run's MLflow run is set running again only when a round is logged, so a resume that has
    nothing left to run, or is refused, leaves it as it was.
    """

    def __init__(self, client: MlflowClient, run_id: str, run_dir: Path, *, running: bool) -> None:
        self.client = client
        self.run_id = run_id
        self.run_dir = run_dir
        self.running = running

    @classmethod
    def open(cls, config: TrackedRun, run_dir: Path) -> MlflowTracker:
        """The MLflow run of ``run_dir``: a new one named after the run (its configuration logged as
        params), or with ``resume`` the one tagged with this folder (a new one if there is none).

        Raises
        ------
        fedapp.errors.ConfigError
            If the tracking store cannot be opened or written (naming the URI and MLflow's reason).
        """
        tracking_uri = config.tracking_uri or default_tracking_uri(config.results_dir)
        run_folder = str(run_dir.expanduser().resolve())
        params = config_params(config)
        try:
            client = MlflowClient(tracking_uri=tracking_uri)
            experiment = experiment_id(client, tracking_uri)
            previous = run_of_folder(client, experiment, run_folder) if config.resume else None
            if previous is not None:
                _log_changed_params(client, previous, params)
                run = previous
            else:
                run = client.create_run(
                    experiment,
                    run_name=config.resolved_run_name,
                    tags={RUN_FOLDER_TAG: run_folder, "fedapp.method": config.method, "fedapp.dataset": config.dataset},
                )
                _log_params(client, run.info.run_id, params)
        except STORE_ERRORS as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            key = "tracking-uri" if config.tracking_uri else "tracker"  # the key that chose this store
            raise ConfigError(
                f"config key {key!r} = {config[key]!r}: MLflow cannot open a run at {tracking_uri} ({reason})"
            ) from err
        how = "continuing" if previous is not None else "new"
        log.info("mlflow: %s run %s in experiment %r at %s", how, run.info.run_id, EXPERIMENT_NAME, tracking_uri)
        return cls(client, run.info.run_id, run_dir, running=previous is None)

    def _guarded(self, what: str, action: Callable[[], object]) -> None:
        try:
            action()
        except STORE_ERRORS as err:
            log.warning("mlflow: could not log %s (%s); metrics.jsonl holds it", what, err)

    def _set_running(self) -> None:
        if not self.running:
            self.running = True
            self._guarded("that the run resumed", lambda: self.client.update_run(self.run_id, status="RUNNING"))

    def log_round(self, record: RoundRecord) -> None:
        """Log the round's numbers (:func:`~fedapp.tracking.scalars.round_scalars`) at step = round."""
        self._set_running()
        now = get_current_time_millis()
        metrics = [Metric(name, value, now, record.round) for name, value in round_scalars(record).items()]
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            batch = metrics[start : start + MAX_METRICS_PER_BATCH]
            self._guarded(f"round {record.round}", lambda b=batch: self.client.log_batch(self.run_id, metrics=b))

    def log_files(self, paths: Sequence[Path]) -> None:
        """Log the run's files as artifacts, in their folders relative to the run folder (all but
        :data:`NOT_LOGGED`, and none from outside it), then end the MLflow run as FINISHED."""
        self._set_running()
        root = self.run_dir.resolve()
        for path in paths:
            if not path.resolve().is_relative_to(root) or path.name in NOT_LOGGED:
                continue
            relative = path.resolve().relative_to(root)
            folder = relative.parent.as_posix()
            self._guarded(
                str(relative),
                lambda p=path, f=folder: self.client.log_artifact(self.run_id, str(p), None if f == "." else f),
            )
        self._end(RunStatus.to_string(RunStatus.FINISHED))

    def close(self) -> None:
        """End the MLflow run as FAILED if it is still running (the run stopped before its end)."""
        self._end(RunStatus.to_string(RunStatus.FAILED))

    def _end(self, status: str) -> None:
        if self.running:
            self.running = False
            self._guarded(f"the run's end ({status})", lambda: self.client.set_terminated(self.run_id, status))


def _log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    items = [Param(key, value) for key, value in params.items()]
    for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=items[start : start + MAX_PARAMS_TAGS_PER_BATCH])


def _log_changed_params(client: MlflowClient, previous: Run, params: dict[str, str]) -> None:
    """Log the keys the resumed run's params lack; name the keys whose value changed in a tag,
    since MLflow refuses to change a param."""
    logged = previous.data.params
    _log_params(client, previous.info.run_id, {k: v for k, v in params.items() if k not in logged})
    changed = [f"{key}={value}" for key, value in params.items() if key in logged and logged[key] != value]
    if changed:
        client.set_tag(previous.info.run_id, RESUMED_WITH_TAG, ", ".join(changed))
