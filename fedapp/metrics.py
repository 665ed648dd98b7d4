"""Per-round metrics, byte accounting and the files a run leaves behind.

A run writes ``<results-dir>/<run-name>/``: ``config.yaml`` (the resolved
configuration), ``metrics.jsonl`` (one JSON object per round), ``summary.json``
and two plots, accuracy against round and against megabytes communicated.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from fedapp.errors import StateError
from fedapp.jsonfile import dumps_json
from fedapp.runfolder import LOCK_FILE, STOPPED_RUN_GRACE_S, check_run_folder, lock_folder, release_folder

# A child of Flower's logger, so our lines appear wherever Flower's log goes.
log = logging.getLogger("flwr.fedapp")

MB = 1024 * 1024


def payload_bytes(tensors: Sequence[bytes]) -> int:
    """Bytes of the serialized arrays that travel in one message."""
    return sum(len(t) for t in tensors)


@dataclass(frozen=True)
class AccuracyStats:
    """Mean, worst and standard deviation of per-client accuracies."""

    mean: float
    worst: float
    std: float
    clients: int

    @classmethod
    def of(cls, accuracies: Sequence[float]) -> AccuracyStats:
        values = np.asarray([a for a in accuracies if math.isfinite(a)], dtype=np.float64)
        if values.size == 0:
            return cls(mean=float("nan"), worst=float("nan"), std=float("nan"), clients=0)
        return cls(
            mean=float(values.mean()), worst=float(values.min()), std=float(values.std()), clients=int(values.size)
        )


@dataclass
class RoundRecord:
    """Everything one round logs; one line of ``metrics.jsonl``."""

    round: int
    acc_mean: float
    acc_worst: float
    acc_std: float
    clients_evaluated: int
    global_acc: float | None
    train_loss: float
    clients_fit: int
    clients_failed: int
    bytes_up_per_client: float
    bytes_down_per_client: float
    bytes_round_total: int
    mb_cumulative: float
    round_seconds: float
    params_round_total: int = 0
    params_cumulative: int = 0
    train_flops_round: int = 0
    train_flops_cumulative: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        record = asdict(self)
        extra = record.pop("extra")
        record.update(extra)
        # A round without a value (no client evaluated, nothing aggregated) writes null, not NaN.
        return dumps_json(record, sort_keys=False)


def first_reaching(accuracies: Sequence[float], target: float) -> int | None:
    """Index of the first accuracy that reaches ``target`` (None if none does)."""
    return next((i for i, accuracy in enumerate(accuracies) if accuracy >= target), None)


def save_accuracy_figure(path: Path, panels: Sequence[Any], title: str = "", software: str | None = None) -> Path:
    """One PNG with a panel per entry of ``panels``: a :class:`fedapp.data.figures.Panel`
    (integer round ticks, a log MB axis, std bands, a target line), or ``(title, xlabel,
    curves)`` with ``(xs, ys, label, linestyle)`` curves on plain axes.

    The run's own plots and the comparison report (:mod:`fedapp.report`) draw with the same
    :func:`fedapp.data.figures.curves_figure`, so they look alike.
    """
    from fedapp.data.figures import as_panel, curves_figure, save_figure  # noqa: PLC0415 - matplotlib at the end only

    return save_figure(curves_figure([as_panel(panel) for panel in panels], title), path, software)


def progress_line(record: RoundRecord, num_rounds: int) -> str:
    """The one readable server log line per round."""
    glob = "" if record.global_acc is None else f" | global {record.global_acc:.3f}"
    failed = f" ({record.clients_failed} failed)" if record.clients_failed else ""
    held = record.extra.get("held_out_acc_mean")
    glob += "" if held is None else f" | held-out {held:.3f}"
    if missing := record.extra.get("eval_missing_clients"):  # the accuracies are a subset's: say whose are missing
        glob = f" (of {record.clients_evaluated} clients: {', '.join(missing)} missing)" + glob
    novel = record.extra.get("novel_acc_mean")
    glob += "" if novel is None else f" | novel {novel:.3f} HM {record.extra['harmonic_mean']:.3f}"
    return (
        f"round {record.round}/{num_rounds} | acc mean {record.acc_mean:.3f} worst {record.acc_worst:.3f}"
        f"{glob} | loss {record.train_loss:.3f} | fit {record.clients_fit}{failed} | "
        f"{record.mb_cumulative:.2f} MB | {record.round_seconds:.1f}s"
    )


class RunObserver(Protocol):
    """Something that follows a run as its recorder writes it (an experiment tracker,
    :mod:`fedapp.tracking`): the recorder calls these in order, once per run or round."""

    def log_round(self, record: RoundRecord) -> None:
        """A round has been appended to ``metrics.jsonl``."""
        ...

    def log_files(self, paths: Sequence[Path]) -> None:
        """The run ended; ``paths`` are its result files (summary, plots, models ...)."""
        ...

    def close(self) -> None:
        """Release what the observer holds (also when the run fails)."""
        ...


class RunRecorder:
    """Writes a run's results folder as rounds complete.

    A fresh run refuses a folder that already holds results (no run replaces another's), a
    resumed one a folder that does not exist; either is refused before anything is written. The
    folder is locked (``.lock``, ``flock``) while the recorder lives, so a second process writing
    the same run is refused at once instead of interleaving its rounds.
    """

    def __init__(
        self,
        results_dir: str | Path,
        run_name: str,
        config: dict[str, Any],
        target_accuracy: float,
        *,
        fresh: bool = True,
    ):
        self.directory = Path(results_dir).expanduser() / run_name
        check_run_folder(self.directory, resume=not fresh)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StateError(f"cannot create run folder {self.directory} ({err.strerror or err})") from err
        # A resume may follow a `flwr stop` whose ServerApp still holds the lock for a few seconds.
        lock_folder(self.directory, wait_s=0.0 if fresh else STOPPED_RUN_GRACE_S)
        self.config = dict(config)
        self.target_accuracy = target_accuracy
        self.records: list[RoundRecord] = []
        # Run-level fields a wrapper adds to summary.json (e.g. the privacy budget, fedapp.flower.privacy).
        self.summary_extra: dict[str, Any] = {}
        # Followers of the run (experiment trackers); metrics.jsonl stays the source of truth.
        self.observers: list[RunObserver] = []
        self.metrics_path = self.directory / "metrics.jsonl"
        if fresh:
            self._write_config()
            self.metrics_path.write_text("")
        # A resumed run writes its config once its checkpoint is accepted (restore): a refused
        # resume leaves the folder as it was.

    def _write_config(self) -> None:
        (self.directory / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=True))

    def close(self) -> None:
        """Release the folder's lock (also released when the process ends) and the observers."""
        for observer in self.observers:
            observer.close()
        release_folder(self.directory)

    def restore(self, records: list[RoundRecord]) -> None:
        """Continue a resumed run: exactly ``records`` so far, on disk and in memory."""
        self.records = list(records)
        self._write_config()
        self.metrics_path.write_text("".join(r.to_json() + "\n" for r in self.records))
        self.write_summary()

    def add(self, record: RoundRecord) -> None:
        self.records.append(record)
        with self.metrics_path.open("a") as handle:
            handle.write(record.to_json() + "\n")
        self.write_summary()
        for observer in self.observers:
            observer.log_round(record)

    def finish(self) -> list[Path]:
        """After the last round: draw the plots and hand every result file to the observers."""
        self.write_plots()
        files = sorted(path for path in self.directory.rglob("*") if path.is_file() and path.name != LOCK_FILE)
        for observer in self.observers:
            observer.log_files(files)
        return files

    def summary(self) -> dict[str, Any]:
        if not self.records:
            return {"rounds": 0, **self.summary_extra}
        last = self.records[-1]
        index = first_reaching([r.acc_mean for r in self.records], self.target_accuracy)
        reached = None if index is None else self.records[index]
        return {
            "rounds": len(self.records),
            "final_acc_mean": last.acc_mean,
            "final_acc_worst": last.acc_worst,
            "final_acc_std": last.acc_std,
            "final_global_acc": last.global_acc,
            # Clients that never trained, evaluated with the global state (None when there are none).
            "final_held_out_acc_mean": last.extra.get("held_out_acc_mean"),
            "final_held_out_acc_worst": last.extra.get("held_out_acc_worst"),
            # Base-to-novel: accuracy on classes no client trained on, and its harmonic mean with acc_mean.
            "final_novel_acc_mean": last.extra.get("novel_acc_mean"),
            "final_harmonic_mean": last.extra.get("harmonic_mean"),
            # partition = domain: mean accuracy of each domain's (training) clients.
            "final_domain_acc": last.extra.get("domain_acc"),
            "best_acc_mean": max(r.acc_mean for r in self.records),
            "total_mb": last.mb_cumulative,
            "total_eval_mb": last.extra.get("mb_eval_cumulative", 0.0),
            "total_seconds": sum(r.round_seconds for r in self.records),
            "mean_round_seconds": float(np.mean([r.round_seconds for r in self.records])),
            "target_accuracy": self.target_accuracy,
            "total_params_communicated": last.params_cumulative,
            "total_train_flops": last.train_flops_cumulative,
            "rounds_to_target": None if reached is None else reached.round,
            "mb_to_target": None if reached is None else reached.mb_cumulative,
            "params_to_target": None if reached is None else reached.params_cumulative,
            "train_flops_to_target": None if reached is None else reached.train_flops_cumulative,
            **self.summary_extra,
        }

    def write_summary(self) -> None:
        (self.directory / "summary.json").write_text(dumps_json(self.summary(), indent=2))

    def write_plots(self) -> list[Path]:
        """The run's figures as PNG files (:func:`fedapp.data.figures.run_figures`): accuracy
        (mean ± std, worst, global) and loss per round, and accuracy against MB communicated."""
        from fedapp.data.figures import run_figures, save_figure  # noqa: PLC0415 - matplotlib at the end only

        rows = [json.loads(record.to_json()) for record in self.records]
        figures = run_figures(rows, self.config, self.target_accuracy, self.directory.name)
        return [save_figure(figure, self.directory / name) for name, figure in figures.items()]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Load a ``metrics.jsonl`` file (for tests, reports and benchmarks)."""
    lines = Path(path).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def check_clients_trained(run_dir: Path) -> None:
    """Raise if a finished run's rounds trained no client at all (every fit failed, or none was
    sampled), or tested none (every test split empty).

    Such a run has metrics, but they measure the initial model, or nothing: it must not end as a success.
    """
    path = run_dir / "metrics.jsonl"
    rows = read_metrics(path) if path.is_file() else []
    if rows and not any(int(row.get("clients_fit", 0)) for row in rows):
        left_out = sorted({reason for row in rows for reason in row.get("left_out_reasons", [])})
        why = f" (left out: {'; '.join(left_out[:3])})" if left_out else ""
        raise StateError(
            f"no client trained in any of the {len(rows)} rounds of {run_dir.name}{why}: "
            "its metrics are of the untrained model; see the clients' errors in the log"
        )
    evaluated = [row["clients_evaluated"] for row in rows if "clients_evaluated" in row]
    if evaluated and not any(int(count or 0) for count in evaluated):
        raise StateError(
            f"no client was tested in any of the {len(rows)} rounds of {run_dir.name}: every evaluated client's "
            "test split was empty (see the warning before round 1), so the run has no accuracy; use fewer "
            "clients, a larger test share (local-split), a test pool (reserve-test or test-data-dir) or more data"
        )
