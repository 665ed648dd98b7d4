"""A markdown report and one figure comparing finished run folders.

Every run leaves ``<results-dir>/<run-name>/`` with ``config.yaml``, ``metrics.jsonl`` and
``summary.json`` (see :mod:`fedapp.metrics`). This module reads only those files, so it works on
runs from any machine and any version that wrote them (config keys added later are optional)::

    fedapp-report results/ --out report.md --figure report.png --target 0.8

The table has one row per run: protocol, final mean / worst / std client accuracy, the
generalization number the run measured (held-out clients, or base-to-novel), communication and
the rounds and seconds it took to reach the target accuracy; a second table gives per-domain
accuracy when runs recorded it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedapp.config import NOT_SETTINGS, same_setting_key, with_defaults
from fedapp.errors import DataError, FedAppError
from fedapp.metrics import first_reaching, read_metrics, save_accuracy_figure

# Columns every metrics.jsonl line has (fedapp.metrics.RoundRecord); the report needs them all.
REQUIRED_METRICS = ("round", "acc_mean", "acc_worst", "acc_std", "bytes_round_total", "mb_cumulative", "round_seconds")

NOT_REACHED = "not reached"
MISSING = "—"

# The figures of a run; the main table gives them per run, the seed table as mean ± std per setting.
FIGURE_COLUMNS = [
    "rounds",
    "mean acc",
    "worst acc",
    "std acc",
    "held-out / novel",
    "bytes/round",
    "total MB",
    "rounds to target",
    "s to target",
]
MAIN_HEADER = ["run", "method", "protocol", "shots", *FIGURE_COLUMNS]


# --- table helpers (also used by the benchmark scripts through benchmarks/compare.py) ---


def fmt_count(value: float | None) -> str:
    """1234567 -> '1.23M'; None -> 'not reached'."""
    if value is None:
        return NOT_REACHED
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table; cells are used as given (no escaping)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_bytes(value: float) -> str:
    """Bytes in base-1024 units, three significant digits: 512 -> '512 B', 12595 -> '12.3 kB'.

    Base 1024 so that '1.00 MB' here is the same megabyte as ``fedapp.metrics.MB`` (total MB column).
    """
    if not math.isfinite(value):
        return MISSING
    size = float(value)
    unit = "B"
    for next_unit in ("kB", "MB", "GB", "TB"):
        if round(size) < 1024:
            break
        size /= 1024
        unit = next_unit
    if unit == "B":
        return f"{size:.0f} B"
    decimals = 0 if size >= 100 else 1 if size >= 10 else 2
    return f"{size:.{decimals}f} {unit}"


def _fmt_acc(value: float | None) -> str:
    return MISSING if value is None or not math.isfinite(value) else f"{value:.4f}"


def _cell(text: str) -> str:
    """A markdown cell: a '|' or a line break in free text (run names, notes) would break the table."""
    return text.replace("|", "\\|").replace("\n", " ")


# --- protocol ---


def _flag(value: Any) -> bool:
    """A boolean config value; older or hand-written configs may hold it as a string."""
    if isinstance(value, str):
        return value.strip().lower() in {"true", "1", "yes", "on"}
    return bool(value)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def describe_protocol(config: Mapping[str, Any], domain_names: Sequence[str] = ()) -> str:
    """A short readable description of how a run split and evaluated its data.

    Parameters
    ----------
    config : Mapping[str, Any]
        The run's resolved config (``config.yaml``). Keys added after a run was made are read
        with their defaults, so older run folders describe themselves too.
    domain_names : Sequence[str]
        Names of the domains, in index order (``summary.json``'s ``domain_names``); used to name
        the left-out domain and to count real domains.

    Returns
    -------
    str
        E.g. ``dirichlet α=0.3``, ``pathological 2/client``,
        ``domain: 4 synthetic domains × 2 clients (Dirichlet α=0.3 within); leave-one-domain-out: blur``.
    """
    partition = str(config.get("partition", "dirichlet"))
    alpha = f"{float(config.get('alpha', 0.3)):g}"
    if partition == "dirichlet":
        text = f"dirichlet α={alpha}"
    elif partition == "pathological":
        text = f"pathological {int(config.get('classes-per-client', 2))}/client"
    elif partition == "shard":
        text = f"shard {int(config.get('shards-per-client', 2))}/client"
    elif partition == "domain":
        synthetic = int(config.get("synthetic-domains", 0))
        per_domain = int(config.get("clients-per-domain", 1))
        if synthetic:
            domains = _plural(synthetic, "synthetic domain")
        else:
            # Real domains are the dataset's subfolders: the summary names them; else infer the count.
            count = len(domain_names) or max(1, int(config.get("num-partitions", 1)) // per_domain)
            domains = _plural(count, "domain")
        text = f"domain: {domains} × {_plural(per_domain, 'client')}"
        if per_domain > 1:  # a domain's data is split among its clients by Dirichlet over labels
            text += f" (Dirichlet α={alpha} within)"
    else:
        text = partition

    fraction = float(config.get("held-out-fraction", 0.0))
    if fraction > 0:
        text += f"; held out {round(fraction * 100, 1):g}% of clients"
    held_domain = int(config.get("held-out-domain", -1))
    if held_domain >= 0:
        name = domain_names[held_domain] if held_domain < len(domain_names) else f"domain {held_domain}"
        text += f"; leave-one-domain-out: {name}"
    if _flag(config.get("base-to-novel", False)):
        text += "; base-to-novel"
    shots = int(config.get("shots-per-class", 0))
    if shots > 0:
        text += f"; {shots} shots/class"
    return text


# --- one run ---


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
        Rounds recorded in ``metrics.jsonl``.
    acc_mean, acc_worst, acc_std : float
        Mean, worst and standard deviation of per-client accuracy in the last round.
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
    curve_rounds: tuple[int, ...] = ()
    curve_acc_mean: tuple[float, ...] = ()
    curve_mb: tuple[float, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)


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
        missing = [key for key in REQUIRED_METRICS if line.get(key) is None]
        if missing:
            raise DataError(f"run folder {run_dir}: metrics.jsonl line {number} lacks {', '.join(missing)}")
    return lines


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
    if not run_dir.is_dir():
        raise DataError(f"{run_dir} is not a folder (expected a run folder with config.yaml and metrics.jsonl)")
    missing = [name for name in ("metrics.jsonl", "config.yaml") if not (run_dir / name).is_file()]
    if missing:
        raise DataError(f"run folder {run_dir}: no {' and no '.join(missing)} (is it a run folder?)")
    config = _read_mapping(run_dir / "config.yaml", yaml.safe_load, "config.yaml")
    summary_path = run_dir / "summary.json"
    summary = _read_mapping(summary_path, json.loads, "summary.json") if summary_path.is_file() else {}
    lines = _read_lines(run_dir)

    if target is None:
        # Older configs may lack the key; the summary records the target the run used.
        configured = config.get("target-accuracy", summary.get("target_accuracy"))
        target = None if configured is None else float(configured)
    last = lines[-1]
    acc = [float(line["acc_mean"]) for line in lines]
    reached = None if target is None else first_reaching(acc, target)

    held = _latest(lines, "held_out_acc_mean")
    novel = _latest(lines, "novel_acc_mean")
    harmonic = _latest(lines, "harmonic_mean")
    if _flag(config.get("base-to-novel", False)) or novel is not None:
        generalization = f"base {_fmt_acc(float(last['acc_mean']))} / novel {_fmt_acc(novel)} / HM {_fmt_acc(harmonic)}"
    elif held is not None:
        generalization = f"held-out {_fmt_acc(held)}"
    elif summary.get("held_out_note"):
        generalization = f"n/a: {summary['held_out_note']}"
    else:
        generalization = MISSING
    domain_acc = _latest(lines, "domain_acc") or {}

    return ReportRow(
        run=run_dir.resolve().name,  # '.' names the folder it is
        path=run_dir,
        method=str(config.get("method", "?")),
        protocol=describe_protocol(config, [str(n) for n in summary.get("domain_names", ())]),
        shots=int(config.get("shots-per-class", 0)),
        rounds=len(lines),
        acc_mean=float(last["acc_mean"]),
        acc_worst=float(last["acc_worst"]),
        acc_std=float(last["acc_std"]),
        generalization=generalization,
        held_out_acc_mean=held,
        novel_acc_mean=novel,
        harmonic_mean=harmonic,
        bytes_per_round=sum(float(line["bytes_round_total"]) for line in lines) / len(lines),
        total_mb=float(last["mb_cumulative"]),
        target=target,
        rounds_to_target=None if reached is None else int(lines[reached]["round"]),
        seconds_to_target=None
        if reached is None
        else sum(float(line["round_seconds"]) for line in lines[: reached + 1]),
        mb_to_target=None if reached is None else float(lines[reached]["mb_cumulative"]),
        flops_to_target=None if reached is None else _number(lines[reached].get("train_flops_cumulative")),
        # A domain none of whose clients was evaluated may hold null: shown as '—'.
        domain_acc={str(name): float("nan" if value is None else value) for name, value in domain_acc.items()},
        curve_rounds=tuple(int(line["round"]) for line in lines),
        curve_acc_mean=tuple(acc),
        curve_mb=tuple(float(line["mb_cumulative"]) for line in lines),
        config=config,
    )


def report_rows(run_dirs: Iterable[Path], target: float | None = None) -> list[ReportRow]:
    """:func:`load_run` of each run folder, in the order given."""
    return [load_run(Path(run_dir), target) for run_dir in run_dirs]


def expand_run_dirs(paths: Iterable[Path]) -> list[Path]:
    """Run folders named by ``paths``: a run folder itself, or each run folder directly inside one (sorted).

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
        children = sorted(child for child in path.iterdir() if (child / "metrics.jsonl").is_file())
        if not children:
            raise DataError(f"{path} has no metrics.jsonl and no run folders inside (is it a results folder?)")
        found.extend(children)
    return found


# --- seeds ---

# Keys that say where and under what name a run is stored, or which seed it drew: runs that
# differ only in these are repetitions of one setting.

# The seed table adds the cost to the target as the pFedLoRA paper counts it: communication and training FLOPs.
SEED_HEADER = ["setting", "seeds", *FIGURE_COLUMNS, "MB to target", "train FLOPs to target"]


@dataclass(frozen=True)
class SeedGroup:
    """Runs whose configs differ only in :data:`NOT_SETTINGS` (repetitions over seeds).

    Attributes
    ----------
    setting : str
        The method and the keys that tell this group from the others in the report.
    runs : tuple[ReportRow, ...]
        The group's runs, in report order.
    """

    setting: str
    runs: tuple[ReportRow, ...]

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(int(row.config.get("seed", 0)) for row in self.runs)


def _setting_key(row: ReportRow) -> str:
    if not row.config:  # an old run folder: nothing to compare, so it stands alone
        return f"run:{row.path}"
    return same_setting_key(row.config)


def group_by_seed(rows: Sequence[ReportRow]) -> list[SeedGroup]:
    """Group runs that differ only in seed (and name/folder), in order of first appearance."""
    grouped: dict[str, list[ReportRow]] = {}
    for row in rows:
        grouped.setdefault(_setting_key(row), []).append(row)
    firsts = [with_defaults(members[0].config) for members in grouped.values() if members[0].config]
    varying = sorted(
        key
        for key in {k for config in firsts for k in config} - NOT_SETTINGS - {"method"}
        if len({json.dumps(config.get(key), default=str) for config in firsts}) > 1
    )
    groups = []
    for members in grouped.values():
        config = members[0].config
        filled = with_defaults(config)
        label = ", ".join([members[0].method, *(f"{key}={filled.get(key)}" for key in varying)])
        groups.append(SeedGroup(setting=label if config else members[0].run, runs=tuple(members)))
    return groups


def mean_std(values: Sequence[float | None]) -> tuple[float, float, int] | None:
    """Mean, sample standard deviation (n - 1; 0 for one value) and count of the finite values."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return None
    mean = sum(finite) / len(finite)
    var = sum((v - mean) ** 2 for v in finite) / (len(finite) - 1) if len(finite) > 1 else 0.0
    return mean, math.sqrt(var), len(finite)


def fmt_mean_std(values: Sequence[float | None], digits: int = 4) -> str:
    """``0.8123 ± 0.0100`` over the finite values; ``—`` when there are none."""
    stats = mean_std(values)
    if stats is None:
        return MISSING
    mean, std, count = stats
    return f"{mean:.{digits}f}" if count == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _group_generalization(runs: Sequence[ReportRow]) -> str:
    if any(row.novel_acc_mean is not None for row in runs):
        return (
            f"base {fmt_mean_std([r.acc_mean for r in runs])} / novel {fmt_mean_std([r.novel_acc_mean for r in runs])}"
            f" / HM {fmt_mean_std([r.harmonic_mean for r in runs])}"
        )
    if any(row.held_out_acc_mean is not None for row in runs):
        return f"held-out {fmt_mean_std([r.held_out_acc_mean for r in runs])}"
    return MISSING


def _group_to_target(runs: Sequence[ReportRow], values: Sequence[float | None], digits: int, fmt: Any = None) -> str:
    """Mean ± std of ``values`` over the runs that reached the target (reached/runs); ``fmt``
    formats a number (default: ``digits`` decimals)."""
    if all(row.target is None for row in runs):
        return MISSING
    reached = [value for value, row in zip(values, runs, strict=True) if row.rounds_to_target is not None]
    if not reached:
        return f"{NOT_REACHED} (0/{len(runs)})"
    if fmt is None:
        return f"{fmt_mean_std(reached, digits)} ({len(reached)}/{len(runs)})"
    stats = mean_std(reached)
    if stats is None:  # reached, but the runs did not record this figure
        return MISSING
    mean, std, _ = stats
    spread = "" if len(reached) == 1 else f" ± {fmt(std)}"
    return f"{fmt(mean)}{spread} ({len(reached)}/{len(runs)})"


def render_seed_table(groups: Sequence[SeedGroup]) -> str:
    """One row per :class:`SeedGroup`: every figure of the main table as mean ± std over its seeds."""
    body = []
    for group in groups:
        runs = group.runs
        rounds = sorted({row.rounds for row in runs})
        body.append(
            [
                _cell(group.setting),
                f"{len(runs)} ({', '.join(map(str, group.seeds))})",
                "/".join(map(str, rounds)),
                fmt_mean_std([r.acc_mean for r in runs]),
                fmt_mean_std([r.acc_worst for r in runs]),
                fmt_mean_std([r.acc_std for r in runs]),
                _cell(_group_generalization(runs)),
                fmt_bytes(sum(r.bytes_per_round for r in runs) / len(runs)),
                fmt_mean_std([r.total_mb for r in runs], 2),
                _group_to_target(runs, [r.rounds_to_target for r in runs], 1),
                _group_to_target(runs, [r.seconds_to_target for r in runs], 1),
                _group_to_target(runs, [r.mb_to_target for r in runs], 2),
                _group_to_target(runs, [r.flops_to_target for r in runs], 0, fmt_count),
            ]
        )
    return markdown_table(SEED_HEADER, body)


# --- the report ---


def _to_target(row: ReportRow) -> tuple[str, str]:
    if row.target is None:
        return MISSING, MISSING
    if row.rounds_to_target is None or row.seconds_to_target is None:
        return NOT_REACHED, NOT_REACHED
    return str(row.rounds_to_target), f"{row.seconds_to_target:.1f}"


def render_markdown(rows: Sequence[ReportRow], figure: str | None = None) -> str:
    """The report's markdown: title, target line, main table, per-domain table, figure link."""
    body = []
    for row in rows:
        rounds_to, seconds_to = _to_target(row)
        body.append(
            [
                _cell(row.run),
                _cell(row.method),
                _cell(row.protocol),
                "all" if row.shots == 0 else str(row.shots),
                str(row.rounds),
                _fmt_acc(row.acc_mean),
                _fmt_acc(row.acc_worst),
                _fmt_acc(row.acc_std),
                _cell(row.generalization),
                fmt_bytes(row.bytes_per_round),
                f"{row.total_mb:.2f}",
                rounds_to,
                seconds_to,
            ]
        )
    targets = sorted({row.target for row in rows if row.target is not None})
    if len(targets) == 1:
        target_line = f"Target: mean client accuracy ≥ {targets[0]:.4f}."
    elif targets:
        target_line = "Target: each run's own target-accuracy (" + ", ".join(f"{t:.4f}" for t in targets) + ")."
    else:
        target_line = "Target: none given and none in the runs' configs."
    parts = [
        f"# Federated run report ({_plural(len(rows), 'run')})",
        "",
        "Accuracies are of the last round (mean / worst / std over evaluated clients); bytes/round is the mean "
        f"training traffic (up + down) per round, in base-1024 units like total MB. {target_line}",
        "",
        markdown_table(MAIN_HEADER, body),
    ]

    groups = group_by_seed(rows)
    if any(len(group.runs) > 1 for group in groups):
        parts += [
            "",
            "## Mean ± std over seeds",
            "",
            "Runs whose configs differ only in seed (and name or folder) form one row: mean ± sample standard "
            "deviation over them; 'to target' columns average the runs that reached it (reached/runs).",
            "",
            render_seed_table(groups),
        ]

    with_domains = [row for row in rows if row.domain_acc]
    if with_domains:
        domains: list[str] = []
        for row in with_domains:  # columns in the order the runs name their domains
            domains += [name for name in row.domain_acc if name not in domains]
        domain_body = [
            [_cell(row.run)] + [_fmt_acc(row.domain_acc.get(name)) for name in domains] for row in with_domains
        ]
        parts += [
            "",
            "## Accuracy per domain (last round)",
            "",
            markdown_table(["run", *map(_cell, domains)], domain_body),
        ]
    if figure:
        parts += ["", f"![mean accuracy vs round and vs MB]({figure})"]
    return "\n".join(parts) + "\n"


def write_figure(rows: Sequence[ReportRow], path: Path) -> Path:
    """One PNG, two panels: mean client accuracy against round and against cumulative MB, a line per run."""
    by_round = [(row.curve_rounds, row.curve_acc_mean, row.run, "-") for row in rows]
    by_mb = [(row.curve_mb, row.curve_acc_mean, row.run, "-") for row in rows]
    return save_accuracy_figure(
        path,
        [
            ("mean accuracy vs round", "round", by_round),
            ("mean accuracy vs communication", "MB communicated (cumulative)", by_mb),
        ],
    )


def write_report(run_dirs: Iterable[Path], out: Path, figure: Path | None, target: float | None) -> str:
    """Write the markdown report of ``run_dirs`` to ``out`` (and the figure, unless ``figure`` is None).

    Parameters
    ----------
    run_dirs : Iterable[Path]
        Run folders (see :func:`expand_run_dirs` for folders of run folders).
    out : Path
        The markdown file to write; its folder is created.
    figure : Path | None
        The PNG to write; the markdown links it relative to ``out``'s folder.
    target : float | None
        Mean accuracy to time the runs to; None: each run's own ``target-accuracy``.

    Returns
    -------
    str
        The markdown written.
    """
    rows = report_rows(run_dirs, target)
    out = Path(out)
    link = None
    if figure is not None:
        figure = write_figure(rows, Path(figure))
        link = Path(os.path.relpath(figure.resolve(), out.resolve().parent)).as_posix()
    markdown = render_markdown(rows, link)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown)
    return markdown


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``fedapp-report RUN_DIR [RUN_DIR ...] [--out F] [--figure F] [--target ACC]``."""
    parser = argparse.ArgumentParser(
        prog="fedapp-report", description="Tabulate and plot finished run folders (config.yaml + metrics.jsonl)."
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run folders, or folders of run folders")
    parser.add_argument("--out", type=Path, default=Path("report.md"), help="markdown file (default: report.md)")
    parser.add_argument("--figure", default="report.png", help='PNG file (default: report.png; "" skips it)')
    parser.add_argument("--target", type=float, help="mean accuracy to time runs to (default: each run's own)")
    args = parser.parse_args(argv)
    if args.target is not None and not 0.0 <= args.target <= 1.0:
        parser.error(f"--target {args.target} is not an accuracy in [0, 1]")
    try:
        markdown = write_report(
            expand_run_dirs(args.run_dirs), args.out, Path(args.figure) if args.figure else None, args.target
        )
    except (FedAppError, OSError) as error:
        print(f"fedapp-report: error: {error}", file=sys.stderr)
        return 2
    print(markdown, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
