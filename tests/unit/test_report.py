"""fedapp.report: run folders written by the real RunRecorder, tabulated, plotted and checked against metrics.jsonl."""

from __future__ import annotations

import importlib.util
import json
import math
import runpy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedapp import report
from fedapp.config import resolve_run_config
from fedapp.errors import DataError
from fedapp.metrics import MB, RoundRecord, RunRecorder, read_metrics
from fedapp.report import ReportRow, describe_protocol, fmt_bytes, load_run, main, report_rows, write_report
from fedapp.report import cli as report_cli
from tests.paths import ROOT
from tests.unit.records import round_record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Config keys newer than some run folders; a run without them must still be described.
NEW_KEYS = {"clients-per-domain", "synthetic-domains", "held-out-domain", "base-to-novel"}

BASE_CONFIG: dict[str, Any] = {
    "method": "fedavg",
    "dataset": "digits",
    "partition": "dirichlet",
    "alpha": 0.3,
    "classes-per-client": 2,
    "shards-per-client": 2,
    "num-partitions": 10,
    "fraction-fit": 1.0,
    "shots-per-class": 0,
    "held-out-fraction": 0.0,
    "clients-per-domain": 1,
    "synthetic-domains": 0,
    "held-out-domain": -1,
    "base-to-novel": False,
    "target-accuracy": 0.6,
}


def record(
    rnd: int, acc: float, worst: float, std: float, bytes_total: int, seconds: float, mb: float, **extra: Any
) -> RoundRecord:
    return round_record(
        rnd,
        acc_mean=acc,
        acc_worst=worst,
        acc_std=std,
        clients_evaluated=8,
        train_loss=1.0 / rnd,
        clients_fit=8,
        bytes_up_per_client=bytes_total / 16,
        bytes_down_per_client=bytes_total / 16,
        bytes_round_total=bytes_total,
        mb_cumulative=mb,
        round_seconds=seconds,
        extra=dict(extra),
    )


def write_run(
    results: Path, name: str, config: dict[str, Any], records: list[RoundRecord], **summary_extra: Any
) -> Path:
    """A run folder written the way a real run writes it."""
    recorder = RunRecorder(results, name, config, float(config.get("target-accuracy", 0.8)))
    recorder.summary_extra.update(summary_extra)
    for rec in records:
        recorder.add(rec)
    return recorder.directory


def curve(accs: list[float], bytes_list: list[int], seconds: list[float], **extras_per_round: list[Any]):
    records, mb = [], 0.0
    for i, (acc, nbytes, sec) in enumerate(zip(accs, bytes_list, seconds, strict=True)):
        mb += nbytes / MB
        extra = {key: values[i] for key, values in extras_per_round.items()}
        records.append(record(i + 1, acc, acc - 0.2, 0.05 + 0.01 * i, nbytes, sec, mb, **extra))
    return records


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    return write_runs(tmp_path)


def write_runs(tmp_path: Path) -> dict[str, Path]:
    """Three runs: held-out clients (reaches the target), base-to-novel with domains (never reaches it),
    and a method that cannot serve held-out clients (summary note; an old config without the new keys)."""
    results = tmp_path / "results"
    held = write_run(
        results,
        "a-heldout",
        {**BASE_CONFIG, "held-out-fraction": 0.2, "num-rounds": 4},
        curve(
            [0.30, 0.55, 0.65, 0.70],
            [12_595, 12_595, 12_600, 12_610],
            [2.5, 1.25, 1.5, 1.0],
            held_out_acc_mean=[0.2, 0.4, 0.5, 0.61],
            held_out_acc_worst=[0.1, 0.3, 0.4, 0.5],
            held_out_clients=[2, 2, 2, 2],
        ),
    )
    b2n = write_run(
        results,
        "b-base-to-novel",
        {
            **BASE_CONFIG,
            "method": "promptfl",
            "partition": "domain",
            "synthetic-domains": 3,
            "clients-per-domain": 2,
            "num-partitions": 6,
            "held-out-domain": 1,
            "base-to-novel": True,
            "shots-per-class": 16,
            "target-accuracy": 0.95,
            "num-rounds": 5,  # stopped after 3
        },
        curve(
            [0.5, 0.7, 0.8],
            [1_520_000, 1_520_000, 1_520_000],
            [3.0, 2.0, 2.0],
            novel_acc_mean=[0.3, 0.4, 0.455],
            harmonic_mean=[0.375, 0.509, 0.583],
            domain_acc=[{"grayscale": 0.5}, {"grayscale": 0.6, "noise": 0.7}, {"grayscale": 0.81, "noise": 0.79}],
        ),
        domain_names=["grayscale", "blur", "noise"],
    )
    old_config = {k: v for k, v in BASE_CONFIG.items() if k not in NEW_KEYS}
    note = write_run(
        results,
        "c-local-note",
        {**old_config, "method": "local", "partition": "pathological", "held-out-fraction": 0.3},
        curve([0.61, 0.62], [0, 0], [0.5, 0.5]),
        held_out_note="local models serve only clients that trained | no global state",
    )
    return {"held": held, "b2n": b2n, "note": note}


def expected_from_metrics(run_dir: Path, target: float) -> dict[str, Any]:
    """The report's numbers, computed directly from the folder's metrics.jsonl."""
    lines = read_metrics(run_dir / "metrics.jsonl")
    reached = [i for i, line in enumerate(lines) if line["acc_mean"] >= target]
    first = reached[0] if reached else None
    return {
        "acc_mean": lines[-1]["acc_mean"],
        "acc_worst": lines[-1]["acc_worst"],
        "acc_std": lines[-1]["acc_std"],
        "bytes_per_round": sum(line["bytes_round_total"] for line in lines) / len(lines),
        "total_mb": lines[-1]["mb_cumulative"],
        "rounds_to_target": None if first is None else lines[first]["round"],
        "seconds_to_target": None if first is None else sum(line["round_seconds"] for line in lines[: first + 1]),
        "rounds": lines[-1]["round"],
    }


def table(markdown: str, first_cell: str) -> dict[str, dict[str, str]]:
    """The markdown table whose header starts with ``first_cell``: {row's first cell: {column: cell}}."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_cell} |"))
    block = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        block.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    header, body = block[0], block[2:]
    return {row[0]: dict(zip(header, row, strict=True)) for row in body}


def assert_row_matches(row: ReportRow, run_dir: Path, target: float) -> dict[str, Any]:
    expected = expected_from_metrics(run_dir, target)
    for key, value in expected.items():
        actual = getattr(row, key)
        if value is None:
            assert actual is None, key
        else:
            assert actual == pytest.approx(value), key
    return expected


# --- numbers ---


def test_rows_equal_what_metrics_jsonl_says_with_each_runs_own_target(runs):
    rows = report_rows([runs["held"], runs["b2n"], runs["note"]])
    held, b2n, note = rows

    assert [r.run for r in rows] == ["a-heldout", "b-base-to-novel", "c-local-note"]
    expected = assert_row_matches(held, runs["held"], 0.6)
    assert (held.rounds_to_target, held.seconds_to_target) == (3, pytest.approx(2.5 + 1.25 + 1.5))
    assert expected["bytes_per_round"] == pytest.approx((12_595 * 2 + 12_600 + 12_610) / 4)
    assert held.generalization == "held-out 0.6100"
    assert held.held_out_acc_mean == pytest.approx(0.61)
    assert held.novel_acc_mean is None and held.harmonic_mean is None and dict(held.domain_acc) == {}

    assert_row_matches(b2n, runs["b2n"], 0.95)
    assert b2n.target == 0.95 and b2n.rounds_to_target is None and b2n.seconds_to_target is None  # never reached
    assert b2n.generalization == "base 0.8000 / novel 0.4550 / HM 0.5830"
    assert (b2n.novel_acc_mean, b2n.harmonic_mean) == (pytest.approx(0.455), pytest.approx(0.583))
    assert dict(b2n.domain_acc) == {"grayscale": 0.81, "noise": 0.79}  # the last round's
    assert b2n.shots == 16 and b2n.method == "promptfl"
    assert b2n.protocol == (
        "domain: 3 synthetic domains × 2 clients (Dirichlet α=0.3 within); leave-one-domain-out: blur; "
        "base-to-novel; 16 shots/class"
    )

    assert_row_matches(note, runs["note"], 0.6)
    assert note.rounds_to_target == 1 and note.seconds_to_target == pytest.approx(0.5)
    assert note.generalization == "n/a: local models serve only clients that trained | no global state"
    assert note.protocol == "pathological 2/client; held out 30% of clients"  # config without the new keys
    assert note.bytes_per_round == 0


def test_an_explicit_target_overrides_each_runs_own(runs):
    for target in (0.0, 0.68, 0.99):
        for run_dir in runs.values():
            row = load_run(run_dir, target)
            assert row.target == target
            assert_row_matches(row, run_dir, target)


def test_markdown_shows_every_number_formatted(runs, tmp_path):
    dirs = [runs["held"], runs["b2n"], runs["note"]]
    markdown = write_report(dirs, tmp_path / "out" / "report.md", None, None)
    assert (tmp_path / "out" / "report.md").read_text() == markdown
    assert markdown.startswith("# ")
    main_table = table(markdown, "run")
    assert list(main_table) == ["a-heldout", "b-base-to-novel", "c-local-note"]
    assert list(next(iter(main_table.values()))) == report.MAIN_HEADER

    for run_dir, target in ((runs["held"], 0.6), (runs["b2n"], 0.95), (runs["note"], 0.6)):
        expected = expected_from_metrics(run_dir, target)
        cells = main_table[run_dir.name]
        assert cells["mean acc"] == f"{expected['acc_mean']:.4f}"
        assert cells["worst acc"] == f"{expected['acc_worst']:.4f}"
        assert cells["std acc"] == f"{expected['acc_std']:.4f}"
        assert cells["bytes/round"] == fmt_bytes(expected["bytes_per_round"])
        assert cells["total MB"] == f"{expected['total_mb']:.2f}"
        if expected["rounds_to_target"] is None:
            assert cells["rounds to target"] == cells["s to target"] == "not reached"
        else:
            assert cells["rounds to target"] == str(expected["rounds_to_target"])
            assert cells["s to target"] == f"{expected['seconds_to_target']:.1f}"

    held, b2n, note = (main_table[d.name] for d in dirs)
    # Rounds completed / configured; a config without num-rounds shows the count alone.
    assert (held["rounds"], b2n["rounds"], note["rounds"]) == ("4/4", "3/5", "2")
    assert "Rounds are completed / configured (num-rounds)." in markdown
    assert held["bytes/round"] == "12.3 kB" and held["s to target"] == "5.2"  # 5.25 s
    assert (
        held["held-out / novel"] == "held-out 0.6100" and held["protocol"] == "dirichlet α=0.3; held out 20% of clients"
    )
    assert b2n["bytes/round"] == "1.45 MB" and b2n["shots"] == "16" and held["shots"] == "all"
    assert b2n["held-out / novel"] == "base 0.8000 / novel 0.4550 / HM 0.5830"
    # The note's '|' is escaped so the table keeps its columns.
    assert "n/a: local models serve only clients that trained \\| no global state" in markdown
    assert note["bytes/round"] == "0 B"

    domains = table(markdown, "run | grayscale")
    assert list(domains) == ["b-base-to-novel"]  # only runs that recorded per-domain accuracy
    assert domains["b-base-to-novel"] == {"run": "b-base-to-novel", "grayscale": "0.8100", "noise": "0.7900"}


def test_no_domain_table_without_domain_accuracies(runs, tmp_path):
    markdown = write_report([runs["held"]], tmp_path / "report.md", None, 0.5)
    assert "per domain" not in markdown
    assert table(markdown, "run")["a-heldout"]["rounds to target"] == "2"


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0 B"), (512, "512 B"), (1023.4, "1023 B"), (2048, "2.00 kB"), (12_595, "12.3 kB"), (1_520_000, "1.45 MB")],
)
def test_bytes_are_shown_in_base_1024_units(value, text):
    assert fmt_bytes(value) == text
    assert fmt_bytes(3 * MB) == "3.00 MB"  # the same MB as the total MB column


# --- protocol ---


@pytest.mark.parametrize(
    ("overrides", "names", "text"),
    [
        ({"partition": "iid"}, (), "iid"),
        ({"partition": "dirichlet", "alpha": 0.3}, (), "dirichlet α=0.3"),
        ({"partition": "pathological", "classes-per-client": 2}, (), "pathological 2/client"),
        ({"partition": "shard", "shards-per-client": 3}, (), "shard 3/client"),
        (
            {"partition": "domain", "synthetic-domains": 4, "clients-per-domain": 2, "num-partitions": 8},
            (),
            "domain: 4 synthetic domains × 2 clients (Dirichlet α=0.3 within)",
        ),
        (
            {"dataset": "domains", "partition": "domain", "num-partitions": 3},
            ("photo", "sketch", "cartoon"),
            "domain: 3 domains × 1 client",
        ),
        (
            {"partition": "domain", "synthetic-domains": 3, "num-partitions": 3, "held-out-domain": 1},
            ("grayscale", "blur", "noise"),
            "domain: 3 synthetic domains × 1 client; leave-one-domain-out: blur",
        ),
        (
            {"partition": "domain", "synthetic-domains": 3, "num-partitions": 3, "held-out-domain": 2},
            (),
            "domain: 3 synthetic domains × 1 client; leave-one-domain-out: domain 2",
        ),
        (
            {"partition": "iid", "held-out-fraction": 0.2, "base-to-novel": True, "shots-per-class": 16},
            (),
            "iid; held out 20% of clients; base-to-novel; 16 shots/class",
        ),
    ],
)
def test_describe_protocol(overrides, names, text):
    assert describe_protocol({**BASE_CONFIG, **overrides}, names) == text


def test_describe_protocol_reads_old_configs_with_defaults():
    assert describe_protocol({"partition": "dirichlet", "alpha": 0.5}) == "dirichlet α=0.5"
    assert describe_protocol({"partition": "iid", "base-to-novel": "true"}) == "iid; base-to-novel"


# --- command line ---


def test_cli_writes_markdown_and_a_two_panel_png(runs, tmp_path, capsys):
    out, figure = tmp_path / "r" / "report.md", tmp_path / "r" / "report.png"
    code = main([str(runs["held"]), str(runs["b2n"]), "--out", str(out), "--figure", str(figure), "--target", "0.68"])
    assert code == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    assert figure.read_bytes().startswith(PNG_MAGIC) and figure.stat().st_size > 1000
    assert "![mean accuracy vs round and vs MB](report.png)" in printed  # linked relative to the report
    cells = table(printed, "run")
    assert cells["a-heldout"]["rounds to target"] == "4" and cells["b-base-to-novel"]["rounds to target"] == "2"


def test_the_report_figure_has_integer_rounds_a_log_mb_axis_and_names_the_runs_that_sent_nothing(runs):
    from fedapp.data.figures import curves_figure  # noqa: PLC0415 - matplotlib only for this test

    rows = report_rows([runs["held"], runs["b2n"], runs["note"]], target=0.68)
    figure = curves_figure(report.figure_panels(rows))
    figure.canvas.draw()
    by_round, by_mb = figure.axes
    low, high = by_round.get_xlim()
    shown = [label.get_text() for label in by_round.get_xticklabels() if low <= label.get_position()[0] <= high]
    assert shown == ["1", "2", "3", "4"]  # whole rounds only
    assert by_round.get_xscale() == "linear" and by_mb.get_xscale() == "log"
    # c-local-note sent 0 MB: it cannot sit on a log axis, and the panel says so.
    assert [line.get_label() for line in by_mb.get_lines()] == ["a-heldout", "b-base-to-novel", "target 0.68"]
    assert [text.get_text() for text in by_mb.texts] == ["sent nothing (0 MB), not shown: c-local-note"]
    assert list(by_mb.get_lines()[-1].get_ydata()) == [0.68, 0.68]
    mixed = curves_figure(report.figure_panels(report_rows([runs["note"], runs["held"], runs["b2n"]])))
    assert all(not line.get_label().startswith("target") for ax in mixed.axes for line in ax.get_lines())  # 2 targets
    # A run keeps its colour in both panels, though the one before it is missing from the MB panel.
    colours = [{line.get_label(): line.get_color() for line in ax.get_lines()} for ax in mixed.axes]
    assert colours[1] == {run: colours[0][run] for run in ("a-heldout", "b-base-to-novel")}


def test_cli_expands_a_results_folder_and_skips_the_figure_on_request(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (runs["held"].parent / "not-a-run").mkdir()  # a stray folder inside is ignored
    assert main([str(runs["held"].parent), "--figure", ""]) == 0
    assert list(table(capsys.readouterr().out, "run")) == ["a-heldout", "b-base-to-novel", "c-local-note"]
    assert (tmp_path / "report.md").is_file()
    assert not (tmp_path / "report.png").exists()


def test_python_dash_m_runs_the_same_command_line(runs, tmp_path, capsys, monkeypatch):
    """``python -m fedapp.report`` runs the package's ``__main__``, which is ``fedapp-report``."""
    out = tmp_path / "m.md"
    monkeypatch.setattr(sys, "argv", ["fedapp.report", str(runs["held"].parent), "--out", str(out), "--figure", ""])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("fedapp.report", run_name="__main__")
    assert exited.value.code == 0
    assert capsys.readouterr().out == out.read_text()
    assert list(table(out.read_text(), "run")) == ["a-heldout", "b-base-to-novel", "c-local-note"]


def _bad_folders(tmp_path: Path) -> list[tuple[Path, str]]:
    missing = tmp_path / "does-not-exist"
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    empty_folder = tmp_path / "empty"
    empty_folder.mkdir()
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "metrics.jsonl").write_text('{"round": 1}\n')
    empty_metrics = write_run(tmp_path / "bad", "empty-metrics", BASE_CONFIG, [])
    broken = write_run(tmp_path / "bad", "broken", BASE_CONFIG, [])
    (broken / "metrics.jsonl").write_text("{not json\n")
    return [
        (missing, "is not a folder"),
        (a_file, "is not a folder"),
        (empty_folder, "no metrics.jsonl"),
        (no_config, "no config.yaml"),
        (empty_metrics, "metrics.jsonl is empty"),
        (broken, "cannot read metrics.jsonl"),
    ]


def test_bad_folders_exit_2_naming_the_folder(runs, tmp_path, capsys):
    for folder, problem in _bad_folders(tmp_path):
        assert main([str(runs["held"]), str(folder), "--out", str(tmp_path / "r.md"), "--figure", ""]) == 2, folder
        captured = capsys.readouterr()
        assert str(folder) in captured.err and problem in captured.err, captured.err
        assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "r.md").exists()


def test_bad_folders_raise_data_error_from_the_api(tmp_path):
    for folder, problem in _bad_folders(tmp_path):
        with pytest.raises(DataError, match=problem):
            load_run(folder)


def test_the_benchmarks_still_import_the_table_helpers_from_compare(monkeypatch):
    spec = importlib.util.spec_from_file_location("compare", ROOT / "benchmarks" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "compare", compare)  # its dataclass looks its module up while executing
    spec.loader.exec_module(compare)
    assert compare.markdown_table is report.markdown_table and compare.fmt_count is report.fmt_count
    assert compare.markdown_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
    assert [compare.fmt_count(v) for v in (None, 999, 1234, 1_234_567, 5e12)] == [
        "not reached",
        "999",
        "1.23k",
        "1.23M",
        "5.00T",
    ]


def test_runs_differing_only_in_seed_aggregate_to_mean_and_sample_std(tmp_path: Path) -> None:
    runs = [
        write_run(
            tmp_path,
            f"fedavg-s{seed}",
            {**BASE_CONFIG, "seed": seed, "run-name": f"fedavg-s{seed}", "num-rounds": 3},
            curve(accs, [1000] * 3, [1.0] * 3, train_flops_cumulative=flops),
        )
        for seed, accs, flops in ((0, [0.5, 0.6, 0.70], [1e9, 2e9, 3e9]), (1, [0.5, 0.65, 0.80], [1e9, 4e9, 5e9]))
    ]
    other = write_run(
        tmp_path,
        "fedavg-lr",
        {**BASE_CONFIG, "seed": 0, "alpha": 1.0, "num-rounds": 3},
        curve([0.4, 0.5, 0.9], [1000] * 3, [1.0] * 3),
    )
    rows = report_rows([*runs, other], target=0.6)
    groups = report.group_by_seed(rows)
    assert [len(g.runs) for g in groups] == [2, 1] and groups[0].seeds == (0, 1)
    # The label names the key that tells the groups apart.
    assert groups[0].setting == "fedavg, alpha=0.3" and groups[1].setting == "fedavg, alpha=1.0"
    mean, std, count = report.mean_std([r.acc_mean for r in groups[0].runs])
    assert (count, mean) == (2, pytest.approx(0.75)) and std == pytest.approx(0.0707107, abs=1e-6)

    markdown = report.render_markdown(rows)
    seed_table = markdown.split("## Mean ± std over seeds")[1]
    cells = [line.split("|")[1:-1] for line in seed_table.splitlines() if line.startswith("| fedavg")]
    first = dict(zip(report.SEED_HEADER, (c.strip() for c in cells[0]), strict=True))
    assert first["seeds"] == "2 (0, 1)" and first["rounds"] == "3/3"
    assert first["mean acc"] == "0.7500 ± 0.0707"
    # Round 2 reaches 0.6 in both seeds: two of two reached, 2.0 ± 0.0 rounds.
    assert first["rounds to target"] == "2.0 ± 0.0 (2/2)"
    # Cost to the target as pFedLoRA counts it: the cumulative MB and training FLOPs of that round.
    assert first["MB to target"] == f"{2000 / MB:.2f} ± 0.00 (2/2)"
    assert first["train FLOPs to target"] == "3.00G ± 1.41G (2/2)"
    assert dict(zip(report.SEED_HEADER, (c.strip() for c in cells[1]), strict=True))["mean acc"] == "0.9000"
    # The main table has a rounds column.
    assert "| rounds |" in markdown.split("## Mean")[0]


def test_a_results_folder_leaves_out_attempts_a_sweep_moved_aside(tmp_path, capsys):
    """An attempt the sweep set aside (``<name>.incomplete-1``) repeats its run's seed: listed from
    the folder it would count that seed twice in the mean over seeds."""
    config = {**BASE_CONFIG, "num-rounds": 3}
    for name, seed, accs in (("fedavg-s0", 0, [0.5, 0.6, 0.7]), ("fedavg-s1", 1, [0.5, 0.6, 0.9])):
        write_run(
            tmp_path / "sweep", name, {**config, "seed": seed, "run-name": name}, curve(accs, [10] * 3, [1.0] * 3)
        )
    aside = write_run(
        tmp_path / "sweep",
        "fedavg-s0.incomplete-1",
        {**config, "seed": 0, "run-name": "fedavg-s0"},
        curve([0.1], [10], [1.0]),
    )
    out = tmp_path / "r.md"
    assert main([str(tmp_path / "sweep"), "--out", str(out), "--figure", ""]) == 0
    capsys.readouterr()
    assert list(table(out.read_text(), "run")) == ["fedavg-s0", "fedavg-s1"]
    seed_row = next(line for line in out.read_text().split("over seeds")[1].splitlines() if line.startswith("| fedavg"))
    assert "| 2 (0, 1) |" in seed_row and "| 0.8000 ± 0.1414 |" in seed_row
    # Named on its own, the attempt is reported (a user asked for it).
    assert report.expand_run_dirs([aside]) == [aside]
    # Only the sweep's own suffix marks an attempt: a run that merely says "incomplete" is a run.
    named = write_run(
        tmp_path / "sweep", "fedavg.incomplete-draft", {**config, "alpha": 1.0}, curve([0.4], [10], [1.0])
    )
    assert named in report.expand_run_dirs([tmp_path / "sweep"])


def test_a_run_made_before_a_key_existed_groups_with_runs_at_its_default(tmp_path):
    old_config = {key: value for key, value in BASE_CONFIG.items() if key != "aggregation"}
    runs = [
        write_run(tmp_path, "old-s0", {**old_config, "seed": 0}, curve([0.5], [10], [1.0])),
        write_run(tmp_path, "new-s1", {**BASE_CONFIG, "seed": 1, "aggregation": "mean"}, curve([0.7], [10], [1.0])),
        write_run(
            tmp_path, "median-s0", {**BASE_CONFIG, "seed": 0, "aggregation": "median"}, curve([0.6], [10], [1.0])
        ),
    ]
    groups = report.group_by_seed(report_rows(runs))
    assert [(g.setting, g.seeds) for g in groups] == [
        ("fedavg, aggregation=mean", (0, 1)),
        ("fedavg, aggregation=median", (0,)),
    ]


def test_runs_differing_only_in_where_clients_keep_state_are_seeds_of_one_setting(tmp_path):
    """``state`` and ``state-dir`` do not change what a run computes (a simulation test shows it), so a
    seed run with its clients' state on disk repeats one in memory; before, they stood apart."""
    on_disk = {**BASE_CONFIG, "state": "disk", "state-dir": "/nodes/state"}
    runs = [
        write_run(tmp_path, "memory-s0", {**BASE_CONFIG, "seed": 0}, curve([0.5], [10], [1.0])),
        write_run(tmp_path, "disk-s1", {**on_disk, "seed": 1}, curve([0.7], [10], [1.0])),
        write_run(tmp_path, "median-s0", {**on_disk, "seed": 0, "aggregation": "median"}, curve([0.6], [10], [1.0])),
    ]
    groups = report.group_by_seed(report_rows(runs))
    assert [(g.setting, g.seeds) for g in groups] == [
        ("fedavg, aggregation=mean", (0, 1)),
        ("fedavg, aggregation=median", (0,)),
    ]
    # The run folder still tells the backends apart (the sweep resumes only a run whose state is on disk).
    names = {state: resolve_run_config({"state": state}).resolved_run_name for state in ("memory", "disk")}
    assert names["memory"] != names["disk"]


def test_no_seed_table_when_no_setting_repeats(tmp_path: Path) -> None:
    run = write_run(tmp_path, "one", {**BASE_CONFIG, "seed": 0}, curve([0.5, 0.6], [10, 10], [1.0, 1.0]))
    assert "over seeds" not in report.render_markdown(report_rows([run]))


def test_the_report_lists_the_mechanism_figures_a_run_recorded(runs, tmp_path):
    """The seed methods' per-round figures (issue 41) reach the report: the last value of each a run
    recorded, in a table of their own; a run without any is left out of it."""
    sdfed = write_run(
        tmp_path / "results",
        "c-sdfed",
        {**BASE_CONFIG, "method": "sdfed"},
        curve(
            [0.4, 0.5],
            [1000, 1000],
            [1.0, 1.0],
            fit_sdfed_separation=[0.3, 0.125],
            fit_projector_removed_energy=[0.007, None],
        ),
    )
    markdown = write_report([runs["held"], sdfed], tmp_path / "report.md", None, 0.5)
    figures = table(markdown, "run | fit_sdfed_separation")
    assert list(figures) == ["c-sdfed"]
    assert figures["c-sdfed"] == {
        "run": "c-sdfed",
        "fit_sdfed_separation": "0.125",
        "fit_projector_removed_energy": "0.007",
    }
    assert "The methods' mechanisms" not in write_report([runs["held"]], tmp_path / "plain.md", None, 0.5)


def test_a_report_never_overwrites_a_run_file_and_checks_its_outputs_before_writing(runs, tmp_path, capsys):
    """Issue 42: ``--out RUN/metrics.jsonl`` once exited 0 leaving markdown where the metrics were."""
    run = runs["held"]
    before = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "config.yaml")}
    for out, problem in [
        (run / "metrics.jsonl", "would overwrite metrics.jsonl of run folder"),
        (run / "config.yaml", "would overwrite config.yaml of run folder"),
        (tmp_path, "is a folder: name a file in it"),
        (run / "metrics.jsonl" / "r.md", "metrics.jsonl is a file, not a folder"),
    ]:
        assert main([str(run), "--out", str(out)]) == 2, out
        captured = capsys.readouterr()
        assert problem in captured.err and "Traceback" not in captured.err and captured.out == "", captured.err
    assert main([str(run), "--out", str(tmp_path / "r.md"), "--figure", str(run / "metrics.jsonl")]) == 2
    assert "--figure" in capsys.readouterr().err
    assert main([str(run), "--out", str(tmp_path / "same"), "--figure", str(tmp_path / "same")]) == 2
    assert "both name" in capsys.readouterr().err
    assert {name: (run / name).read_bytes() for name in before} == before
    assert not list(tmp_path.glob("*.png")) and not (tmp_path / "r.md").exists()  # nothing written by a refusal
    # A new file inside a run folder is fine; the figure goes beside --out, not into the working directory.
    assert main([str(run), "--out", str(run / "report.md")]) == 0
    assert (run / "report.md").is_file() and (run / "report.png").read_bytes().startswith(PNG_MAGIC)
    capsys.readouterr()
    assert main([str(run), "--out", str(tmp_path / "results" / "cmp.md")]) == 0
    assert (tmp_path / "results" / "cmp.png").is_file() and not (tmp_path / "report.png").exists()


def test_a_metrics_value_that_is_not_a_number_is_named_in_one_line(runs, tmp_path, capsys):
    run = runs["held"]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["acc_mean"] = "high"
    (run / "metrics.jsonl").write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    assert main([str(run), "--out", str(tmp_path / "r.md"), "--figure", ""]) == 2
    err = capsys.readouterr().err
    assert f"run folder {run}: metrics.jsonl line 2: acc_mean = 'high' is not a number" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_json_files_hold_no_nan_and_a_round_without_accuracy_reads_back(runs, tmp_path):
    """Issue 42: summary.json held a bare NaN, which is not JSON (strict readers refuse the file)."""
    from fedapp.jsonfile import dumps_json  # noqa: PLC0415

    text = dumps_json({"a": float("nan"), "b": [1.0, float("inf"), np.float32("nan")], "c": {"d": -math.inf}, "e": 2})
    assert json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON")) == {
        "a": None,
        "b": [1.0, None, None],
        "c": {"d": None},
        "e": 2,
    }
    run = runs["held"]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row.update({"acc_mean": None, "acc_worst": None, "acc_std": None})  # round 1: no client evaluated
    (run / "metrics.jsonl").write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    loaded = load_run(run)
    assert math.isnan(loaded.curve_acc_mean[0]) and loaded.acc_mean == json.loads(lines[-1])["acc_mean"]


def test_an_interrupted_report_is_one_line(runs, tmp_path, capsys, monkeypatch):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_cli, "write_report", interrupted)
    assert main([str(runs["held"]), "--out", str(tmp_path / "r.md"), "--figure", ""]) == 130
    assert capsys.readouterr().err == "fedapp-report: interrupted\n"
