"""A grid's point is chosen on the clients' validation accuracy, never on the test accuracy, and
the choice is recorded with the figures it rested on (issue 62)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import yaml

from fedapp import sweep
from fedapp.errors import DataError
from fedapp.report.selection import Candidate, render_selection, select, validation_score
from fedapp.sweep import main, plan_sweep
from tests.unit.records import round_record


def write_run(run_dir: Path, val: list[float | None], test: list[float], config: dict | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for number, (val_acc, test_acc) in enumerate(zip(val, test, strict=True), start=1):
        extra = {} if val_acc is None else {"val_acc_mean": val_acc}
        lines.append(round_record(number, acc_mean=test_acc, extra=extra).to_json())
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config or {"method": "fedavg", "num-rounds": len(val)}))
    (run_dir / "summary.json").write_text(json.dumps({"rounds": len(val)}))
    return run_dir


def test_the_point_with_the_best_validation_accuracy_is_chosen_whatever_its_test_accuracy(tmp_path):
    low_val = write_run(tmp_path / "a", [0.5, 0.6], [0.9, 0.95])  # best on test, worse on validation
    high_val = write_run(tmp_path / "b", [0.7, 0.7], [0.1, 0.2])
    [selection] = select([Candidate("fedavg", {"lr": 0.1}, (low_val,)), Candidate("fedavg", {"lr": 0.01}, (high_val,))])
    assert selection.chosen.candidate.point == {"lr": 0.01}
    record = selection.as_dict()
    assert record["chosen"] == {"lr": 0.01}
    assert record["chosen_test_acc_per_run"] == [0.2]
    assert [point["val_score"] for point in record["points"]] == [0.6, 0.7]
    assert "0.95" not in json.dumps(record)  # the unchosen point's test accuracy is never read
    text = render_selection([selection])
    assert "not read" in text and "0.9500" not in text and "0.2000" in text


def test_the_score_averages_the_last_rounds_and_then_the_seeds_and_a_tie_keeps_grid_order(tmp_path):
    first = write_run(tmp_path / "s0", [0.1, 0.5, 0.7], [0.0] * 3)
    assert validation_score(first, 1) == pytest.approx(0.7)
    assert validation_score(first, 2) == pytest.approx(0.6)
    second = write_run(tmp_path / "s1", [0.1, 0.3, 0.5], [0.0] * 3)
    tie = write_run(tmp_path / "t", [0.0, 0.5, 0.6], [0.0] * 3)
    [selection] = select(
        [Candidate("m", {"x": 1}, (first, second)), Candidate("m", {"x": 2}, (tie,))], last_rounds=1
    )  # (0.7 + 0.5) / 2 = 0.6 = 0.6
    assert selection.chosen.candidate.point == {"x": 1}


def test_a_run_without_validation_figures_cannot_be_chosen_from_and_the_error_names_it(tmp_path):
    old = write_run(tmp_path / "old-run", [None, None], [0.5, 0.6])
    with pytest.raises(DataError, match=r"old-run: no validation accuracy \(val_acc_mean\) in its last 1 rounds"):
        validation_score(old)
    with pytest.raises(DataError, match="2 rounds recorded, the score averages the last 3"):
        validation_score(old, 3)


def test_the_sweep_selects_on_validation_records_the_choice_and_reports_the_chosen_point_only(
    tmp_path, monkeypatch, capsys
):
    results = tmp_path / "results"
    figures = {0.1: ([0.8], [0.3]), 0.01: ([0.6], [0.9])}  # lr: (validation, test) of its one round

    def fake_submit(prepared, env, **_):
        write_run(prepared.run_dir, *figures[prepared.config.lr], prepared.config.as_dict())
        return prepared.run_dir

    monkeypatch.setattr(sweep, "local_federation", contextlib.nullcontext)
    monkeypatch.setattr(sweep, "shared_ray", lambda env: contextlib.nullcontext({"RAY_ADDRESS": "10.0.0.1:6379"}))
    monkeypatch.setattr(sweep, "check_runs_data", lambda overrides, labels: None)  # a child process
    monkeypatch.setattr(sweep, "submit", fake_submit)
    argv = ["--results-dir", str(results), "--methods", "fedavg", "--seeds", "100", "--grid", "lr=[0.1, 0.01]"]
    assert main([*argv, "--run-config", "num-rounds=1", "--select"]) == 0
    out = capsys.readouterr().out
    assert "fedavg: chose {'lr': 0.1} (val acc 0.8000)" in out
    written = json.loads((results / "selection.json").read_text())
    assert written["written_by"] == "fedapp.sweep"
    [record] = written["selections"]
    assert record["chosen"] == {"lr": 0.1} and record["chosen_test_acc_per_run"] == [0.3]
    report = (results / "report.md").read_text()
    runs = plan_sweep({"num-rounds": 1}, methods=["fedavg"], seeds=[100], grid={"lr": [0.1, 0.01]}, results_dir=results)
    chosen, other = runs
    assert other.name not in report
    assert chosen.name in report and "0.9000" not in report  # the other point's test accuracy is not shown


def test_the_sweep_refuses_a_selection_over_no_rounds_before_anything_runs(tmp_path, capsys):
    argv = ["--results-dir", str(tmp_path / "r"), "--methods", "fedavg", "--select", "--select-last-rounds", "0"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "error: --select-last-rounds 0: must be at least 1"
    assert not (tmp_path / "r").exists()
