"""One command per family (``python benchmarks/claims.py run``): the selection on its own seed by
validation accuracy, then the claims' settings at the chosen point on the reported seeds, records
copied as each step ends and never run twice (issue 62). The sweeps are stood in for by one that
writes run folders with known figures, so the queue's logic runs in a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedapp import sweep
from fedapp.launch import parse_overrides
from tests.paths import load_script

claims = load_script("claims")

SPEC = {
    "family": "t",
    "title": "Test family",
    "paper": "none",
    "preset": "conf/fedavg-digits.yaml",
    "records": "records/family-t",
    "score": {"last-rounds": 2},
    "selection": "on seed 100 by validation",
    "select": {"seed": 100, "group": "iid", "grids": {"fedavg": {"lr": [0.1, 0.01]}}},
    "groups": {"iid": {"partition": "iid"}},
    "settings": {"FedAvg": {"method": "fedavg", "lr": "chosen"}, "Standalone": {"method": "standalone"}},
    "claims": [{"claim": "FedAvg beats Standalone", "a": "FedAvg", "b": "Standalone", "headline": True}],
}
# lr: (validation, test) accuracy of every round; the better validation point is the worse on test.
FIGURES = {0.1: (0.8, 0.3), 0.01: (0.6, 0.9)}


def fake_sweep(calls: list[list[str]]):
    """A sweep that plans as the real one does and writes each run's records (the seed moves the
    test accuracy a little, so that the paired differences have a spread)."""

    def main(argv: list[str]) -> int:
        calls.append(argv)
        args = sweep._parser().parse_args(argv)
        base = {**parse_overrides([args.run_config[0]]), "preset": args.preset, "num-rounds": 3}
        runs = sweep.plan_sweep(
            base,
            methods=args.methods.split(","),
            seeds=[int(s) for s in args.seeds.split(",")],
            grid=sweep.parse_grid(args.grid),
            results_dir=args.results_dir,
        )
        for run in runs:
            config = run.prepared.config
            val, test = FIGURES.get(config.lr, (0.5, 0.5)) if config.method == "fedavg" else (0.4, 0.4)
            test += 0.001 * config.seed * (1 if config.method == "fedavg" else -1)
            run.prepared.run_dir.mkdir(parents=True, exist_ok=True)
            lines = [{"round": r, "acc_mean": test, "val_acc_mean": val, "round_seconds": 40.0} for r in (1, 2, 3)]
            (run.prepared.run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
            (run.prepared.run_dir / "config.yaml").write_text(yaml.safe_dump(config.as_dict()))
            (run.prepared.run_dir / "summary.json").write_text(json.dumps({"rounds": 3, "final_acc_mean": test}))
        if args.select:
            finished = [run.prepared.run_dir for run in runs]
            sweep.write_selection(runs, finished, args.results_dir, args.select_last_rounds)
        return 0

    return main


@pytest.fixture
def family(tmp_path: Path):
    (tmp_path / "family-t.yaml").write_text(yaml.safe_dump(SPEC))
    return claims.load_family(tmp_path / "family-t.yaml")


def test_the_queue_selects_on_validation_then_runs_the_chosen_point_on_the_reported_seeds(
    family, tmp_path, monkeypatch, capsys
):
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep, "main", fake_sweep(calls))
    results = tmp_path / "results"
    assert claims.run_family(family, results, "", 1, dry_run=False) == 0
    selection = json.loads((family.selection_dir / "selection.json").read_text())["selections"]
    assert [entry["chosen"] for entry in selection] == [{"lr": 0.1}]  # validation 0.8 over 0.6, test aside
    assert "--select" in calls[0] and "100" in calls[0]
    # 0.1 was chosen at the grid's top edge: the grid went on to 1.0 (the same ratio), chosen again inside.
    selecting = [call for call in calls if "--select" in call]
    assert [call[call.index("--grid") + 1] for call in selecting] == ["lr=[0.1, 0.01]", "lr=[0.01, 0.1, 1.0]"]
    assert "on to {'lr': [0.01, 0.1, 1.0]}" in capsys.readouterr().out
    settings = [call for call in calls if "--select" not in call]
    assert len(settings) == 2 and all(call[call.index("--seeds") + 1] == "0,1,2,3,4" for call in settings)
    assert "lr=0.1" in settings[0][settings[0].index("--run-config") + 1]  # the chosen point, not the test's best
    reported = sorted(path.name for path in family.records.iterdir() if path.name != "selection")
    assert len(reported) == 10 and all(not name.endswith("-s100") for name in reported)
    assert len(list(family.selection_dir.glob("*/summary.json"))) == 3
    # The tables: the chosen point's runs, paired over the five seeds, by the rule.
    block = claims.family_block(family)
    [selection_row] = [line for line in block.splitlines() if line.startswith("| fedavg |")]
    assert "**lr=0.1: 0.8000**" in selection_row and "lr=0.01: " in selection_row
    # What the 13 recorded runs took, 3 rounds of 40 s each: 2 minutes a run, 26 minutes in all.
    [costs_row] = claims.costs_block([family]).splitlines()[2:]
    assert costs_row.endswith("| 13 | 2 | 0.4 |"), costs_row
    # The chosen point is the worse on test (0.30 against Standalone's 0.40): the verdict says so.
    assert "FedAvg beats Standalone (headline)" in block and "**reversed**" in block
    assert "0.9" not in selection_row  # no test figure of the other points: their validation scores only


def test_started_again_the_queue_runs_nothing_its_records_hold(family, tmp_path, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep, "main", fake_sweep(calls))
    claims.run_family(family, tmp_path / "results", "", 1, dry_run=False)
    # A new machine: the sweeps' results are gone, the records are in the repository.
    planned = []

    def planning_sweep(argv: list[str]) -> int:
        args = sweep._parser().parse_args(argv)
        base = {**parse_overrides([args.run_config[0]]), "preset": args.preset, "num-rounds": 3}
        seeds = [int(s) for s in args.seeds.split(",")]
        grid = sweep.parse_grid(args.grid)
        runs = sweep.plan_sweep(base, methods=[args.methods], seeds=seeds, grid=grid, results_dir=args.results_dir)
        planned.extend(run for run in runs if not sweep._finished(run))
        return 0

    monkeypatch.setattr(sweep, "main", planning_sweep)
    assert claims.run_family(family, tmp_path / "elsewhere", "", 1, dry_run=False) == 0
    assert planned == []


def test_a_dry_run_prints_the_selection_and_says_what_waits_for_it(family, tmp_path, capsys):
    assert claims.run_family(family, tmp_path / "results", "", 1, dry_run=True) == 0
    out = capsys.readouterr().out
    assert "select fedavg: python -m fedapp.sweep" in out and "--select-last-rounds 2" in out
    assert "FedAvg (iid): waits for the selection" in out
    assert "Standalone (iid): python -m fedapp.sweep" in out
    assert not family.records.exists()


def test_a_family_none_of_whose_runs_has_landed_has_a_page_block_without_figures(family):
    # A fresh clone has no folder for it (git keeps no empty folders): that is no records, not an error.
    assert not family.records.exists()
    block = claims.family_block(family)
    assert "Records: no reported run yet (they land in" in block
    assert "Claims without records yet" in block and "FedAvg beats Standalone" in block


def test_a_spec_whose_claim_names_an_unknown_setting_is_refused_naming_the_file(tmp_path):
    spec = {**SPEC, "claims": [{"claim": "x", "a": "FedAvg", "b": "FedProx"}]}
    (tmp_path / "family-t.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(claims.ClaimsError, match=r"family-t.yaml: claim 'x' names 'FedProx'"):
        claims.load_family(tmp_path / "family-t.yaml")


def test_the_command_line_names_an_unknown_family(capsys):
    assert claims.main(["run", "--family", "z", "--dry-run"]) == 2
    assert "error: no family z in" in capsys.readouterr().err
