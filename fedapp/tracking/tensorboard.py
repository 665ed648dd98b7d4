"""The TensorBoard tracker: event files in the run folder's ``tensorboard/``, one scalar per
round's number (step = round) and the resolved configuration as a text table.

``tensorboard --logdir <results-dir>`` shows every run, each under its run name.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from fedapp.metrics import RoundRecord
from fedapp.tracking.scalars import TrackedRun, config_params, round_scalars

#: The run folder's subfolder holding the event files.
EVENTS_FOLDER = "tensorboard"

#: Tags of the headline numbers, grouped the way TensorBoard shows them; any other number
#: of the record is ``metrics/<its metrics.jsonl name>``.
TAGS = {
    "acc_mean": "accuracy/mean",
    "acc_worst": "accuracy/worst",
    "acc_std": "accuracy/std",
    "global_acc": "accuracy/global",
    "held_out_acc_mean": "accuracy/held_out_mean",
    "novel_acc_mean": "accuracy/novel_mean",
    "harmonic_mean": "accuracy/harmonic_mean",
    "train_loss": "loss/train",
    "mb_cumulative": "communication/mb_cumulative",
    "mb_eval_cumulative": "communication/mb_eval_cumulative",
    "params_cumulative": "communication/params_cumulative",
    "train_flops_cumulative": "compute/train_flops_cumulative",
    "round_seconds": "time/round_seconds",
    "clients_fit": "clients/fit",
    "clients_failed": "clients/failed",
    "clients_evaluated": "clients/evaluated",
}


def scalar_tag(name: str) -> str:
    """The TensorBoard tag of a record's number named ``name``."""
    if name.startswith("domain_acc/"):
        return "accuracy/domain/" + name.removeprefix("domain_acc/")
    return TAGS.get(name, f"metrics/{name}")


def config_markdown(config: TrackedRun) -> str:
    """The resolved configuration as a Markdown table (TensorBoard's text tab renders it)."""
    rows = [f"| {key} | {value} |" for key, value in config_params(config).items()]
    return "\n".join(["| key | value |", "| --- | --- |", *rows])


class TensorBoardTracker:
    """Follows one run in TensorBoard event files (a :class:`~fedapp.metrics.RunObserver`).

    Each round's scalars are flushed at once, so TensorBoard shows a run while it trains; a
    resumed run adds an event file beside the first one and its rounds continue the same curves.
    """

    def __init__(self, config: TrackedRun, run_dir: Path) -> None:
        self.directory = run_dir / EVENTS_FOLDER
        self.writer: SummaryWriter | None = SummaryWriter(log_dir=str(self.directory))
        if not config.resume:  # a resumed run's folder already holds its configuration
            self.writer.add_text("config", config_markdown(config), global_step=0)
            self.writer.flush()

    def log_round(self, record: RoundRecord) -> None:
        """Write the round's numbers (:func:`~fedapp.tracking.scalars.round_scalars`) at step = round."""
        if self.writer is None:
            return
        for name, value in round_scalars(record).items():
            self.writer.add_scalar(scalar_tag(name), value, global_step=record.round)
        self.writer.flush()

    def log_files(self, paths: Sequence[Path]) -> None:
        """The run ended: the event files are complete (the run's other files stay in its folder)."""
        self.close()

    def close(self) -> None:
        """Flush and close the event file (once)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
