"""A run's plots as a researcher reads them: whole-round ticks, a log MB axis, a mean ± std band,
the global model's accuracy, a loss panel, the target line and a title with the key settings;
a run that sent nothing says so. The figures are inspected before they are saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import PolyCollection

from fedapp.data.figures import SENT_NOTHING, Panel, curves_figure, run_figures, settings_title
from fedapp.metrics import MB, RoundRecord, RunRecorder, read_metrics, save_accuracy_figure
from tests.unit.records import round_record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONFIG = {
    "method": "fedavg",
    "dataset": "digits",
    "partition": "dirichlet",
    "alpha": 0.3,
    "num-partitions": 10,
    "num-rounds": 3,
    "seed": 7,
}


def a_record(round_: int, mb: float, *, global_acc: float | None = 0.5, **extra: Any) -> RoundRecord:
    return round_record(
        round_,
        acc_mean=0.2 * round_,
        acc_worst=0.1 * round_,
        acc_std=0.05,
        clients_evaluated=10,
        global_acc=global_acc,
        train_loss=2.0 / round_,
        clients_fit=10,
        bytes_up_per_client=0.0,
        bytes_down_per_client=0.0,
        bytes_round_total=int(mb * MB),
        mb_cumulative=mb * round_,
        extra=dict(extra),
    )


def recorded_rows(tmp_path: Path, name: str, records: list[RoundRecord], config: dict[str, Any]) -> Path:
    """A run folder written by the real recorder (its plots included)."""
    recorder = RunRecorder(tmp_path, name, config, 0.55)
    try:
        for record in records:
            recorder.add(record)
        recorder.write_plots()
    finally:
        recorder.close()
    return recorder.directory


def shown_tick_labels(ax) -> list[str]:
    low, high = ax.get_xlim()
    return [label.get_text() for label in ax.get_xticklabels() if low <= label.get_position()[0] <= high]


@pytest.fixture(scope="module")
def fedavg_figures(tmp_path_factory):
    # Three rounds of a few kB each: on a linear MB axis they would all sit at x = 0.
    folder = recorded_rows(
        tmp_path_factory.mktemp("runs"), "fedavg-s7", [a_record(r, 0.004) for r in (1, 2, 3)], CONFIG
    )
    rows = read_metrics(folder / "metrics.jsonl")
    figures = run_figures(rows, CONFIG, 0.55, folder.name)
    for figure in figures.values():
        figure.canvas.draw()
    return folder, figures


def test_the_round_axis_has_whole_rounds_and_the_mb_axis_is_logarithmic(fedavg_figures):
    _, figures = fedavg_figures
    accuracy, loss = figures["accuracy_vs_round.png"].axes
    (by_mb,) = figures["accuracy_vs_mb.png"].axes
    assert shown_tick_labels(accuracy) == shown_tick_labels(loss) == ["1", "2", "3"]
    assert accuracy.get_xscale() == "linear" and by_mb.get_xscale() == "log"
    assert list(by_mb.get_lines()[0].get_xdata()) == pytest.approx([0.004, 0.008, 0.012])


def test_accuracy_has_a_std_band_the_global_model_and_the_target_line(fedavg_figures):
    _, figures = fedavg_figures
    accuracy = figures["accuracy_vs_round.png"].axes[0]
    (by_mb,) = figures["accuracy_vs_mb.png"].axes
    for ax in (accuracy, by_mb):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines) == ["mean client acc ± std", "worst client acc", "global model acc", "target 0.55"]
        assert list(lines["target 0.55"].get_ydata()) == [0.55, 0.55]
        assert list(lines["global model acc"].get_ydata()) == [0.5, 0.5, 0.5]
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == 1
        # The band spans mean ± std: 0.2 - 0.05 at round 1 up to 0.6 + 0.05 at round 3.
        ys = bands[0].get_paths()[0].vertices[:, 1]
        assert (ys.min(), ys.max()) == (pytest.approx(0.15), pytest.approx(0.65))


def test_a_loss_panel_shows_the_training_loss(fedavg_figures):
    _, figures = fedavg_figures
    loss = figures["accuracy_vs_round.png"].axes[1]
    assert loss.get_ylabel() == "loss"
    (train,) = loss.get_lines()
    assert list(train.get_ydata()) == pytest.approx([2.0, 1.0, 2.0 / 3])


def test_the_title_names_the_run_and_its_key_settings(fedavg_figures):
    _, figures = fedavg_figures
    for figure in figures.values():
        title = figure.get_suptitle()
        assert title.startswith("fedavg-s7\n")
        assert title.endswith("fedavg, digits, dirichlet α=0.3, 10 clients, 3 rounds, seed 7")


def test_the_files_are_written_by_the_recorder(fedavg_figures):
    folder, _ = fedavg_figures
    for name in ("accuracy_vs_round.png", "accuracy_vs_mb.png"):
        assert (folder / name).read_bytes().startswith(PNG_MAGIC)


def test_a_run_that_sent_nothing_says_so_instead_of_an_empty_plot(tmp_path):
    config = {**CONFIG, "method": "standalone"}
    folder = recorded_rows(tmp_path, "alone", [a_record(r, 0.0, global_acc=None) for r in (1, 2)], config)
    figures = run_figures(read_metrics(folder / "metrics.jsonl"), config, 0.55, "alone")
    (by_mb,) = figures["accuracy_vs_mb.png"].axes
    (note,) = by_mb.texts
    assert by_mb.get_lines() == [] and note.get_text().startswith("This run sent nothing (0 MB")
    assert note.get_text() == SENT_NOTHING + "Accuracy per round: accuracy_vs_round.png"
    accuracy = figures["accuracy_vs_round.png"].axes[0]
    assert "global model acc" not in [line.get_label() for line in accuracy.get_lines()]  # no global model
    assert (folder / "accuracy_vs_mb.png").read_bytes().startswith(PNG_MAGIC)


def test_held_out_accuracy_and_a_recorded_evaluation_loss_are_drawn():
    rows = [
        {"round": r, "acc_mean": 0.5, "acc_worst": 0.4, "acc_std": 0.1, "global_acc": None, "train_loss": 1.0}
        | {"mb_cumulative": 1.0 * r, "held_out_acc_mean": 0.3, "eval_loss": 1.5}
        for r in (1, 2)
    ]
    figure = run_figures(rows, {"method": "fedavg"}, None, "r")["accuracy_vs_round.png"]
    accuracy, loss = figure.axes
    assert [line.get_label() for line in accuracy.get_lines()][-1] == "held-out clients"
    assert [line.get_label() for line in loss.get_lines()] == ["train loss (clients' mean)", "test loss"]
    assert figure.get_suptitle() == "r\nfedavg"
    assert run_figures([], CONFIG, 0.5, "empty") == {}


@pytest.mark.parametrize(
    ("overrides", "text"),
    [
        ({"partition": "iid"}, "iid"),
        ({"partition": "pathological", "classes-per-client": 2}, "pathological 2 classes/client"),
        ({"partition": "shard", "shards-per-client": 3}, "shard 3 shards/client"),
        ({"partition": "domain", "clients-per-domain": 2}, "domain × 2 clients (α=0.3)"),
    ],
)
def test_the_title_gives_the_partition_settings_that_matter(overrides, text):
    assert settings_title({**CONFIG, **overrides}) == f"fedavg, digits, {text}, 10 clients, 3 rounds, seed 7"


def test_older_tuple_panels_still_save(tmp_path):
    curves = [([1, 2], [0.1, 0.2], "a", "-"), ([1, 2], [0.3, None], "b", "--")]
    path = save_accuracy_figure(tmp_path / "sub" / "fig.png", [("t", "round", curves)], title="x")
    assert path.read_bytes().startswith(PNG_MAGIC)
    figure = curves_figure([Panel("t", "round", [])])
    assert figure.axes[0].get_legend() is None  # nothing to explain: no empty legend box


def test_a_run_without_any_accuracy_still_writes_its_figures(tmp_path):
    """Clients with empty test splits (5 images each at 10,000 clients of CIFAR-10) report no
    accuracy: every accuracy is nan, and the log-scaled MB axis has no point to place."""
    nan = float("nan")
    records = [round_record(r, acc_mean=nan, acc_worst=nan, acc_std=nan, mb_cumulative=15.7 * r) for r in (1, 2, 3)]
    folder = recorded_rows(tmp_path, "no-accuracy", records, CONFIG)
    for name in ("accuracy_vs_round.png", "accuracy_vs_mb.png"):
        assert (folder / name).read_bytes().startswith(PNG_MAGIC)
