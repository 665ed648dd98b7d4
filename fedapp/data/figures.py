"""The figures runs and reports draw, built as matplotlib ``Figure`` objects before they are saved.

A run's curves (:func:`run_figures`: accuracy and loss per round, accuracy against the
megabytes communicated), the comparison report's panels (:func:`curves_figure` of
:class:`Panel`), and a partition's label distribution (:func:`label_distribution_figure`)
share one look: integer round ticks, a logarithmic MB axis, a shaded mean ± std band, a
labelled target line and a title naming the run's key settings.

Figures are made with ``matplotlib.figure.Figure`` itself, not pyplot: no backend is
switched and no global figure list grows, so a returned figure can be inspected (tests)
and is freed like any object. matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # matplotlib takes a while to import: only drawing needs it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: ``Panel.x_axis`` values: rounds get integer ticks, megabytes a logarithmic scale.
ROUND_AXIS, MB_AXIS, LINEAR_AXIS = "round", "mb", "linear"

#: What the MB panel says for a run that sent no training traffic (Standalone, local training).
SENT_NOTHING = "This run sent nothing (0 MB of training traffic):\nits clients train on their own.\n"


@dataclass(frozen=True)
class Curve:
    """One line of a panel.

    Attributes
    ----------
    xs, ys : Sequence[float]
        The points; a None or non-finite ``y`` leaves a gap.
    label : str
        Its legend entry.
    linestyle : str
        matplotlib's line style; solid lines get point markers.
    spread : Sequence[float] | None
        Half-width of a shaded band around ``ys`` (the clients' standard deviation); None: no band.
    color : str | None
        A matplotlib colour (one run keeps its colour across panels); None: the next of the cycle.
    """

    xs: Sequence[float]
    ys: Sequence[float | None]
    label: str
    linestyle: str = "-"
    spread: Sequence[float | None] | None = None
    color: str | None = None


@dataclass(frozen=True)
class Panel:
    """One set of axes.

    Attributes
    ----------
    title, xlabel, ylabel : str
        Its texts.
    curves : Sequence[Curve]
        Its lines.
    x_axis : str
        :data:`ROUND_AXIS` (integer ticks), :data:`MB_AXIS` (logarithmic; points at 0 MB
        cannot be shown there and are left out) or :data:`LINEAR_AXIS`.
    ylim : tuple[float, float] | None
        The y range (accuracy: 0..1; None: fitted to the data).
    target : float | None
        A labelled horizontal line at this accuracy (None: none).
    note : str
        Text written inside the panel: what it cannot show.
    """

    title: str
    xlabel: str
    curves: Sequence[Curve]
    x_axis: str = LINEAR_AXIS
    ylabel: str = "accuracy"
    ylim: tuple[float, float] | None = (0.0, 1.0)
    target: float | None = None
    note: str = ""


def as_panel(panel: Panel | tuple) -> Panel:
    """A :class:`Panel`, or the older ``(title, xlabel, curves)`` with ``(xs, ys, label, linestyle)``
    curves on linear axes, as a :class:`Panel`."""
    if isinstance(panel, Panel):
        return panel
    title, xlabel, curves = panel
    return Panel(title, xlabel, [Curve(*curve) for curve in curves])


def _floats(values: Sequence[float | None]) -> np.ndarray:
    return np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)


def _draw_curve(ax: Axes, curve: Curve, panel: Panel) -> None:
    xs, ys = _floats(curve.xs), _floats(curve.ys)
    shown = np.isfinite(xs) & ((xs > 0) if panel.x_axis == MB_AXIS else True)
    xs, ys = xs[shown], ys[shown]
    marker = "o" if curve.linestyle == "-" and len(xs) <= 60 else None
    style = {"linestyle": curve.linestyle, "marker": marker, "markersize": 3, "label": curve.label}
    (line,) = ax.plot(xs, ys, **style, **({} if curve.color is None else {"color": curve.color}))
    if curve.spread is not None:
        spread = _floats(curve.spread)[shown]
        low, high = ys - spread, ys + spread
        if panel.ylim is not None:
            low, high = np.clip(low, *panel.ylim), np.clip(high, *panel.ylim)
        ax.fill_between(xs, low, high, where=np.isfinite(low) & np.isfinite(high), color=line.get_color(), alpha=0.2)


def _has_point(line) -> bool:
    """Whether ``line`` has a point to draw (accuracy is nan where no client had a test example)."""
    return bool(np.any(np.isfinite(_floats(line.get_xdata())) & np.isfinite(_floats(line.get_ydata()))))


def draw_panel(ax: Axes, panel: Panel) -> None:
    """Draw ``panel`` on ``ax``: its curves, band, target line, note, axes and legend."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 - see the module docstring

    for curve in panel.curves:
        _draw_curve(ax, curve, panel)
    has_points = any(_has_point(line) for line in ax.get_lines())
    if panel.target is not None and math.isfinite(panel.target):
        ax.axhline(panel.target, color="0.35", linestyle="-.", linewidth=1, label=f"target {panel.target:g}")
    if panel.x_axis == ROUND_AXIS:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    elif panel.x_axis == MB_AXIS and has_points:
        ax.set_xscale("log")  # not without a point: matplotlib cannot place a log axis then
    if panel.note:  # in the middle of an empty panel, else along its bottom
        y, align = (0.03, "bottom") if panel.curves else (0.5, "center")
        ax.text(0.5, y, panel.note, transform=ax.transAxes, ha="center", va=align, fontsize=7, wrap=True)
    if not panel.curves:  # nothing placed on the x axis: its default 0..1 would mean nothing
        ax.set_xticks([])
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    ax.grid(alpha=0.3, which="both" if panel.x_axis == MB_AXIS else "major")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=7)
    ax.set_title(panel.title, fontsize=9)


def curves_figure(panels: Sequence[Panel], title: str = "") -> Figure:
    """A figure with one panel per entry of ``panels``, side by side, under ``title``."""
    from matplotlib.figure import Figure  # noqa: PLC0415 - see the module docstring

    lines = title.count("\n") + 1 if title else 0
    figure = Figure(figsize=(5.2 * len(panels), 3.6 + 0.25 * lines), dpi=100, layout="constrained")
    for ax, panel in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        draw_panel(ax, panel)
    if title:
        figure.suptitle(title, fontsize=9)
    return figure


def save_figure(figure: Figure, path: Path, software: str | None = None) -> Path:
    """Write ``figure`` to ``path`` (PNG by its suffix; the folder is created); returns ``path``.
    ``software`` names the tool in the PNG's metadata (what lets it rewrite the file later)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, metadata=None if software is None else {"Software": software})
    return path


def partition_text(config: Mapping[str, Any]) -> str:
    """How the data was split, shortly: ``dirichlet α=0.3``, ``pathological 2 classes/client`` ..."""
    partition = str(config.get("partition", ""))
    if partition == "dirichlet":
        return f"dirichlet α={float(config.get('alpha', 0.3)):g}"
    if partition == "pathological":
        return f"pathological {config.get('classes-per-client', '?')} classes/client"
    if partition == "shard":
        return f"shard {config.get('shards-per-client', '?')} shards/client"
    if partition == "domain" and int(config.get("clients-per-domain", 1)) > 1:
        return f"domain × {config['clients-per-domain']} clients (α={float(config.get('alpha', 0.3)):g})"
    return partition


def settings_title(config: Mapping[str, Any]) -> str:
    """The run's key settings in one line: method, dataset, partition, clients, rounds and seed
    (those the configuration holds)."""
    parts = [str(config[key]) for key in ("method", "dataset") if key in config]
    parts.append(partition_text(config))
    for key, unit in (("num-partitions", "clients"), ("num-rounds", "rounds")):
        if key in config:
            parts.append(f"{config[key]} {unit}")
    if "seed" in config:
        parts.append(f"seed {config['seed']}")
    return ", ".join(part for part in parts if part)


def _column(rows: Sequence[Mapping[str, Any]], key: str) -> list[float | None]:
    return [row.get(key) for row in rows]


def accuracy_curves(rows: Sequence[Mapping[str, Any]], xs: Sequence[float]) -> list[Curve]:
    """The accuracies of a run's rows against ``xs``: mean ± std, worst, and where recorded
    the global model's and the held-out clients'."""
    curves = [
        Curve(xs, _column(rows, "acc_mean"), "mean client acc ± std", "-", _column(rows, "acc_std")),
        Curve(xs, _column(rows, "acc_worst"), "worst client acc", "--"),
    ]
    for key, label, style in (("global_acc", "global model acc", ":"), ("held_out_acc_mean", "held-out clients", "-.")):
        if any(row.get(key) is not None for row in rows):
            curves.append(Curve(xs, _column(rows, key), label, style))
    return curves


def loss_curves(rows: Sequence[Mapping[str, Any]], xs: Sequence[float]) -> list[Curve]:
    """The training loss per round and, where recorded, the evaluation loss."""
    curves = [Curve(xs, _column(rows, "train_loss"), "train loss (clients' mean)")]
    if any(row.get("eval_loss") is not None for row in rows):
        curves.append(Curve(xs, _column(rows, "eval_loss"), "test loss", "--"))
    return curves


def run_figures(
    rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any], target: float | None, run_name: str
) -> dict[str, Figure]:
    """A run's figures, by file name: ``accuracy_vs_round.png`` (accuracy and loss per round)
    and ``accuracy_vs_mb.png`` (accuracy against cumulative training MB, on a log axis).

    Parameters
    ----------
    rows : Sequence[Mapping[str, Any]]
        The run's ``metrics.jsonl`` lines (:class:`fedapp.metrics.RoundRecord`); none: no figures.
    config : Mapping[str, Any]
        The run's configuration (its key settings make the title).
    target : float | None
        The target accuracy (``target-accuracy``), drawn as a line; None: no line.
    run_name : str
        The run's name, the title's first line.
    """
    if not rows:
        return {}
    title = f"{run_name}\n{settings_title(config)}"
    rounds = [int(row["round"]) for row in rows]
    by_round = [
        Panel("accuracy per round", "round", accuracy_curves(rows, rounds), ROUND_AXIS, target=target),
        Panel("loss per round", "round", loss_curves(rows, rounds), ROUND_AXIS, ylabel="loss", ylim=None),
    ]
    mb = [float(row["mb_cumulative"]) for row in rows]
    xlabel = "MB communicated (training, cumulative; log scale)"
    if max(mb) > 0:
        by_mb = Panel("accuracy vs communication", xlabel, accuracy_curves(rows, mb), MB_AXIS, target=target)
    else:
        note = SENT_NOTHING + "Accuracy per round: accuracy_vs_round.png"
        by_mb = Panel("accuracy vs communication", "MB communicated", [], LINEAR_AXIS, note=note)
    return {
        "accuracy_vs_round.png": curves_figure(by_round, title),
        "accuracy_vs_mb.png": curves_figure([by_mb], title),
    }


def label_distribution_figure(
    counts_by_split: Mapping[str, np.ndarray], class_names: Sequence[str], partition_ids: Sequence[int], title: str
) -> Figure:
    """One panel per split: stacked bars, one per client, of how many samples of each class it
    holds (flwr-datasets' ``plot_label_distributions`` look, drawn from counts: our partitions
    are index arrays, not a flwr-datasets partitioner over a Hugging Face dataset).

    Each ``counts_by_split`` value is ``(clients, classes)``: clients in the order of
    ``partition_ids``, classes in the order of ``class_names``.
    """
    from matplotlib import colormaps  # noqa: PLC0415 - see the module docstring
    from matplotlib.figure import Figure  # noqa: PLC0415

    num_classes, num_clients = len(class_names), len(partition_ids)
    palette = colormaps["tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else "RdYlGn"]
    colours = [palette(i if num_classes <= 20 else i / max(1, num_classes - 1)) for i in range(num_classes)]
    size = (min(16.0, 4 + 0.35 * num_clients), 0.6 + 2.6 * len(counts_by_split))
    figure = Figure(figsize=size, dpi=100, layout="constrained")
    axes = figure.subplots(len(counts_by_split), 1, squeeze=False)[:, 0]
    positions = np.arange(num_clients)
    for ax, (split, counts) in zip(axes, counts_by_split.items(), strict=True):
        bottom = np.zeros(num_clients)
        for index, name in enumerate(class_names):
            ax.bar(positions, counts[:, index], bottom=bottom, color=colours[index], label=name, width=0.8)
            bottom += counts[:, index]
        ax.set_ylim(0, max(1.0, float(bottom.max())) * 1.05)  # stacked bars' edges would pin the top to the frame
        ax.set_xticks(positions, [str(pid) for pid in partition_ids], fontsize=7 if num_clients > 20 else 9)
        ax.set_ylabel(f"{split} samples")
        ax.set_title(f"{split} split", fontsize=9)
    axes[-1].set_xlabel("client (partition id)")
    if num_classes <= 20:  # beyond that a legend hides the bars; partition.json has the numbers
        axes[0].legend(title="class", fontsize=7, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.suptitle(title, fontsize=9)
    return figure
