"""Reading run folders: one :class:`ReportRow` per folder, from its config, metrics and summary.

A run folder is what :class:`fedapp.metrics.RunRecorder` leaves: ``config.yaml``,
``metrics.jsonl`` and (when the run ended) ``summary.json``. Config keys added after a run
was made are optional, so run folders from any version read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedapp.errors import DataError
from fedapp.metrics import first_reaching, read_metrics
from fedapp.report.protocol import config_flag, describe_protocol
from fedapp.report.tables import MISSING, fmt_acc
from fedapp.runfolder import is_set_aside

# Columns every metrics.jsonl line has (fedapp.metrics.RoundRecord); the report needs them all.
ACCURACY_METRICS = ("acc_mean", "acc_worst", "acc_std")
REQUIRED_METRICS = ("round", "acc_mean", "acc_worst", "acc_std", "bytes_round_total", "mb_cumulative", "round_seconds")


@dataclass(frozen=True)
class ReportRow:
    """What the report shows of one run folder.

    Attributes
    ----------
    run : str
        The run folder's name.
    path : Path
        The run folder.
    method, protocol : str
        ``config.yaml``'s method, and :func:`describe_protocol` of the run.
    shots : int
        Training samples per class and client (0 = all).
    rounds : int
        Rounds completed: the last round ``metrics.jsonl`` records.
    num_rounds : int | None
        Rounds the run was configured for (``num-rounds``; None when its config lacks the key).
    acc_mean, acc_worst, acc_std : float
        Mean, worst and standard deviation of per-client accuracy in the last round.
    val_acc_mean : float | None
        Mean per-client accuracy on the clients' validation data in the last round (None when the
        run recorded none: no validation share, or a run made before clients scored it).
    generalization : str
        The 'held-out / novel' cell: ``base … / novel … / HM …``, ``held-out …``, ``n/a: <note>`` or ``—``.
    held_out_acc_mean, novel_acc_mean, harmonic_mean : float | None
        The numbers the generalization text shows (latest round that has them); None when absent.
    bytes_per_round : float
        Mean of ``bytes_round_total`` (training bytes up + down) over the rounds.
    total_mb : float
        ``mb_cumulative`` of the last round.
    target : float | None
        The mean accuracy the run is timed to; None when neither given nor in the run's config.
    rounds_to_target : int | None
        The first round whose ``acc_mean`` reached ``target``; None if none did.
    seconds_to_target : float | None
        Sum of ``round_seconds`` of the rounds up to and including that round.
    mb_to_target, flops_to_target : float | None
        ``mb_cumulative`` and ``train_flops_cumulative`` (all clients' training FLOPs) at that round;
        None if the target was not reached or the run did not record them.
    domain_acc : Mapping[str, float]
        Domain name -> mean accuracy of its evaluated clients, from the latest round that has it.
    client_acc : Mapping[str, float]
        Partition id -> that client's accuracy in the last round (``client_acc``; empty when not recorded).
    mechanism : Mapping[str, float]
        The figures of :data:`MECHANISM_FIGURES` the run recorded, from the latest round that has each.
    curve_rounds, curve_acc_mean, curve_mb : tuple
        Per-round round number, mean accuracy and cumulative MB, for the figure.
    config : Mapping[str, Any]
        The run's ``config.yaml`` (what :func:`group_by_seed` compares).
    """

    run: str
    path: Path
    method: str
    protocol: str
    shots: int
    rounds: int
    acc_mean: float
    acc_worst: float
    acc_std: float
    generalization: str
    held_out_acc_mean: float | None
    novel_acc_mean: float | None
    harmonic_mean: float | None
    bytes_per_round: float
    total_mb: float
    target: float | None
    rounds_to_target: int | None
    seconds_to_target: float | None
    mb_to_target: float | None = None
    flops_to_target: float | None = None
    domain_acc: Mapping[str, float] = field(default_factory=dict)
    client_acc: Mapping[str, float] = field(default_factory=dict)
    curve_rounds: tuple[int, ...] = ()
    curve_acc_mean: tuple[float, ...] = ()
    curve_mb: tuple[float, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    num_rounds: int | None = None
    mechanism: Mapping[str, float] = field(default_factory=dict)
    val_acc_mean: float | None = None


MECHANISM_FIGURES: tuple[str, ...] = (
    # SDFed: the loss's terms and what refinement removes.
    "fit_sdfed_ce",
    "fit_sdfed_retention",
    "fit_sdfed_separation",
    "fit_projector_removed_energy",
    # FedD2P: how sharp a_c and g_c are, and the devices' remaining distillation gap.
    "a_true_class_mass",
    "a_entropy",
    "g_true_class_mass",
    "g_entropy",
    "fit_distillation_kl",
    # PEP-FedPT: what the round moved, and how the mixing weighs the classes.
    "fit_class_prompt_change",
    "fit_head_change",
    "fit_mix_entropy",
    "fit_mix_top_is_label",
    "eval_mix_entropy",
    "eval_mix_top_is_label",
    # pFedLoRA: every reading of its inference.
    "eval_head_accuracy",
    "eval_adapter_accuracy",
    "eval_combined_accuracy",
)
"""The per-round figures that show a seed method's mechanism at work (the methods' pages say
what each means); the report lists the last value of those a run recorded."""


def _latest(lines: Sequence[Mapping[str, Any]], key: str) -> Any:
    """The value of ``key`` in the latest line that has a usable one (evaluation can skip rounds)."""
    for line in reversed(lines):
        value = line.get(key)
        if isinstance(value, dict) and value:
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _number(value: Any) -> float | None:
    """A finite number, or None (older runs lack the FLOPs fields)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _read_mapping(path: Path, loader: Any, what: str) -> dict[str, Any]:
    try:
        data = loader(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise DataError(f"run folder {path.parent}: cannot read {what} ({error})") from error
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DataError(f"run folder {path.parent}: {what} holds a {type(data).__name__}, not a mapping")
    return data


def _read_lines(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    try:
        lines = read_metrics(path)
    except (OSError, ValueError) as error:
        raise DataError(f"run folder {run_dir}: cannot read metrics.jsonl ({error})") from error
    if not lines:
        raise DataError(f"run folder {run_dir}: metrics.jsonl is empty (the run recorded no round)")
    for number, line in enumerate(lines, start=1):
        if not isinstance(line, dict):
            raise DataError(f"run folder {run_dir}: metrics.jsonl line {number} is not a JSON object")
        missing = [key for key in REQUIRED_METRICS if key not in line]
        if missing:
            raise DataError(f"run folder {run_dir}: metrics.jsonl line {number} lacks {', '.join(missing)}")
        for key in REQUIRED_METRICS:
            if line[key] is None and key in ACCURACY_METRICS:
                line[key] = math.nan  # null: a round in which no client was evaluated
            value = line[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DataError(f"run folder {run_dir}: metrics.jsonl line {number}: {key} = {value!r} is not a number")
    return lines


def _read_run_folder(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The run's ``config.yaml``, ``summary.json`` (empty when absent) and ``metrics.jsonl`` lines."""
    if not run_dir.is_dir():
        raise DataError(f"{run_dir} is not a folder (expected a run folder with config.yaml and metrics.jsonl)")
    missing = [name for name in ("metrics.jsonl", "config.yaml") if not (run_dir / name).is_file()]
    if missing:
        raise DataError(f"run folder {run_dir}: no {' and no '.join(missing)} (is it a run folder?)")
    config = _read_mapping(run_dir / "config.yaml", yaml.safe_load, "config.yaml")
    summary_path = run_dir / "summary.json"
    summary = _read_mapping(summary_path, json.loads, "summary.json") if summary_path.is_file() else {}
    return config, summary, _read_lines(run_dir)


def _own_target(config: Mapping[str, Any], summary: Mapping[str, Any]) -> float | None:
    """The target accuracy the run itself used, if it recorded one."""
    # Older configs may lack the key; the summary records the target the run used.
    configured = config.get("target-accuracy", summary.get("target_accuracy"))
    return None if configured is None else float(configured)


def _generalization(
    config: Mapping[str, Any], summary: Mapping[str, Any], lines: Sequence[Mapping[str, Any]]
) -> tuple[str, float | None, float | None, float | None]:
    """The 'held-out / novel' cell and the held-out, novel and harmonic-mean accuracies it shows."""
    held = _latest(lines, "held_out_acc_mean")
    novel = _latest(lines, "novel_acc_mean")
    harmonic = _latest(lines, "harmonic_mean")
    if config_flag(config.get("base-to-novel", False)) or novel is not None:
        text = f"base {fmt_acc(float(lines[-1]['acc_mean']))} / novel {fmt_acc(novel)} / HM {fmt_acc(harmonic)}"
    elif held is not None:
        text = f"held-out {fmt_acc(held)}"
    elif summary.get("held_out_note"):
        text = f"n/a: {summary['held_out_note']}"
    else:
        text = MISSING
    return text, held, novel, harmonic


def _cost_to_target(
    lines: Sequence[Mapping[str, Any]], reached: int | None
) -> tuple[int | None, float | None, float | None, float | None]:
    """Round, seconds, cumulative MB and training FLOPs at line ``reached`` (all None when not reached)."""
    if reached is None:
        return None, None, None, None
    line = lines[reached]
    seconds = sum(float(earlier["round_seconds"]) for earlier in lines[: reached + 1])
    return int(line["round"]), seconds, float(line["mb_cumulative"]), _number(line.get("train_flops_cumulative"))


def load_run(run_dir: Path, target: float | None = None) -> ReportRow:
    """Read one run folder into a :class:`ReportRow`.

    Parameters
    ----------
    run_dir : Path
        A folder holding ``config.yaml`` and a non-empty ``metrics.jsonl`` (``summary.json`` is optional).
    target : float | None
        Mean accuracy to time the run to; default the run's own ``target-accuracy``.

    Raises
    ------
    DataError
        ``run_dir`` is not a folder, lacks ``metrics.jsonl`` or ``config.yaml``, or they are empty or unreadable.
    """
    run_dir = Path(run_dir)
    config, summary, lines = _read_run_folder(run_dir)
    if target is None:
        target = _own_target(config, summary)
    last = lines[-1]
    acc = [float(line["acc_mean"]) for line in lines]
    reached = None if target is None else first_reaching(acc, target)
    rounds_to, seconds_to, mb_to, flops_to = _cost_to_target(lines, reached)
    generalization, held, novel, harmonic = _generalization(config, summary, lines)
    domain_acc = _latest(lines, "domain_acc") or {}
    return ReportRow(
        run=run_dir.resolve().name,  # '.' names the folder it is
        path=run_dir,
        method=str(config.get("method", "?")),
        protocol=describe_protocol(config, [str(n) for n in summary.get("domain_names", ())]),
        shots=int(config.get("shots-per-class", 0)),
        rounds=int(last["round"]),
        num_rounds=None if config.get("num-rounds") is None else int(config["num-rounds"]),
        acc_mean=float(last["acc_mean"]),
        val_acc_mean=_number(last.get("val_acc_mean")),
        acc_worst=float(last["acc_worst"]),
        acc_std=float(last["acc_std"]),
        generalization=generalization,
        held_out_acc_mean=held,
        novel_acc_mean=novel,
        harmonic_mean=harmonic,
        bytes_per_round=sum(float(line["bytes_round_total"]) for line in lines) / len(lines),
        total_mb=float(last["mb_cumulative"]),
        target=target,
        rounds_to_target=rounds_to,
        seconds_to_target=seconds_to,
        mb_to_target=mb_to,
        flops_to_target=flops_to,
        # A domain none of whose clients was evaluated may hold null: shown as '—'.
        domain_acc={str(name): float("nan" if value is None else value) for name, value in domain_acc.items()},
        client_acc={str(name): float(value) for name, value in (last.get("client_acc") or {}).items()},
        curve_rounds=tuple(int(line["round"]) for line in lines),
        curve_acc_mean=tuple(acc),
        curve_mb=tuple(float(line["mb_cumulative"]) for line in lines),
        config=config,
        mechanism={key: value for key in MECHANISM_FIGURES if (value := _latest(lines, key)) is not None},
    )


def report_rows(run_dirs: Iterable[Path], target: float | None = None) -> list[ReportRow]:
    """:func:`load_run` of each run folder, in the order given."""
    return [load_run(Path(run_dir), target) for run_dir in run_dirs]


def expand_run_dirs(paths: Iterable[Path]) -> list[Path]:
    """Run folders named by ``paths``: a run folder itself, or each run folder directly inside one (sorted).

    Inside a folder, attempts a sweep moved aside (``<name>.incomplete-<n>``, see
    :func:`fedapp.runfolder.set_aside`) are left out: the run they attempted is in the folder under
    its own name, and counting both would count its seed twice. Named directly, one is reported.

    Raises
    ------
    DataError
        A path is not a folder, or is neither a run folder nor holds any.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise DataError(f"{path} is not a folder (expected a run folder or a folder of run folders)")
        if (path / "metrics.jsonl").exists():
            found.append(path)
            continue
        children = sorted(
            child for child in path.iterdir() if (child / "metrics.jsonl").is_file() and not is_set_aside(child)
        )
        if not children:
            raise DataError(f"{path} has no metrics.jsonl and no run folders inside (is it a results folder?)")
        found.extend(children)
    return found
