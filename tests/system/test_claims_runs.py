"""The run records that benchmarks/CLAIMS.md cites: complete, consistent, and tabulated by their README's command."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedapp import report
from tests.paths import BENCHMARKS

RECORDS = BENCHMARKS / "claims-runs"
COMMAND = re.compile(r"^fedapp-report benchmarks/claims-runs/\S+ .*$", re.MULTILINE)


def run_folders() -> list[Path]:
    return sorted(path.parent for path in RECORDS.glob("*/*/summary.json"))


@pytest.mark.parametrize("run", run_folders(), ids=lambda path: f"{path.parent.name}/{path.name}")
def test_a_record_holds_every_round_of_its_run_and_its_summary_agrees(run: Path) -> None:
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl", "summary.json"]
    config = yaml.safe_load((run / "config.yaml").read_text())
    summary = json.loads((run / "summary.json").read_text())
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [line["round"] for line in rounds] == list(range(1, config["num-rounds"] + 1))
    assert summary["rounds"] == config["num-rounds"]
    assert summary["final_acc_mean"] == rounds[-1]["acc_mean"]
    assert run.name.startswith(f"{config['method']}-") and run.name.endswith(f"-s{config['seed']}")


def test_the_readme_commands_tabulate_every_record(tmp_path: Path) -> None:
    assert run_folders(), "no run records under benchmarks/claims-runs"
    commands = [shlex.split(match.group(0)) for match in COMMAND.finditer((RECORDS / "README.md").read_text())]
    assert commands, "no fedapp-report command in benchmarks/claims-runs/README.md"
    # The commands in the README, verbatim, from a copy of the records (the report writes beside its cwd).
    shutil.copytree(RECORDS, tmp_path / "benchmarks" / "claims-runs")
    report_cli = Path(sys.executable).parent / commands[0][0]
    for command in commands:
        subprocess.run([str(report_cli), *command[1:]], cwd=tmp_path, check=True, capture_output=True, timeout=300)
        table = (tmp_path / command[command.index("--out") + 1]).read_text()
        family = Path(command[1]).name
        missing = [run.name for run in run_folders() if run.parent.name == family and f"| {run.name} |" not in table]
        assert not missing, missing
        if "--paired-against" in command:
            assert "## Paired over seeds, against " in table


def test_the_family_c_tables_pair_seeds_as_the_report_does() -> None:
    """CLAIMS' one-machine Family C tables come from benchmarks/claims_family_c.py; its round-10
    differences and client counts must be the report's paired ones (FedD2P against B1 at α = 0.1)."""
    script = subprocess.run(
        [sys.executable, str(BENCHMARKS / "claims_family_c.py")],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    alpha01 = script.split("α = 10, round 10:")[0]
    cells = next(line for line in alpha01.splitlines() if line.startswith("| FedD2P − B1 (standalone) |")).split("|")
    groups = report.group_by_seed(report.report_rows(report.expand_run_dirs([RECORDS / "family-c"])))
    reference = report.select_reference(groups, "standalone alpha=0.1 num-rounds=10")
    table = report.render_paired_table(groups, reference)
    row = next(
        line
        for line in table.splitlines()
        if line.startswith("| fedd2p, alpha=0.1, d2p-distil-temperature=0.0, d2p-generator=attention, num-rounds=10 |")
    )
    paired = dict(zip(report.PAIRED_HEADER, [cell.strip() for cell in row.split("|")[1:-1]], strict=True))
    assert cells[3].strip().replace("−", "-") == paired["mean ± std"]
    assert cells[6].strip() == paired["clients higher / lower / equal"]


def test_each_family_c_claim_verdict_follows_its_paired_figures() -> None:
    """``--claims`` gives each paper claim the verdict its own paired figures call for: holds only
    when every seed is above at round 10 and over rounds 8-10, reversed only when every seed is below."""
    script = subprocess.run(
        [sys.executable, str(BENCHMARKS / "claims_family_c.py"), "--claims"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    rows = [line.split("|")[1:-1] for line in script.splitlines() if line.startswith("| FedD2P beats")]
    assert {row[1].strip() for row in rows} == {"0.1", "10"}
    for row in rows:
        seeds_higher, seeds = (int(n) for n in row[5].split(" of "))
        at10 = float(row[3].split("±")[0].replace("−", "-"))
        if "holds**" in row[7] and "not" not in row[7]:
            assert seeds_higher == seeds and at10 > 0
        elif "reversed" in row[7]:
            assert seeds_higher == 0 and at10 < 0
        else:
            assert "no consistent order" in row[7]


def test_the_family_c_script_names_a_missing_records_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-records"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "claims_family_c.py"), "--claims", str(missing)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert f"no folder of run records at {missing}" in result.stderr


def test_a_claim_whose_seeds_agree_at_round_10_but_not_over_rounds_8_to_10_has_no_consistent_order() -> None:
    """The rule reads both figures: FedD2P − B1 at α = 0.1 is below in every seed at round 10, but
    one seed is above over rounds 8-10, so it is neither held nor reversed."""
    spec = importlib.util.spec_from_file_location("claims_family_c", BENCHMARKS / "claims_family_c.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.verdict([-0.0708, -0.0266, -0.0310], [-0.0508, -0.0231, 0.0006]).endswith(
        "no consistent order (seeds or rounds 8-10 disagree)"
    )
    assert script.verdict([-0.0708, -0.0266, -0.0310], [-0.0508, -0.0231, -0.0006]) == "**does not hold**: reversed"
    assert script.verdict([0.0016, 0.0404, 0.0166], [0.0067, 0.0470, 0.0199]) == "**holds**"
    assert script.verdict([0.0016, 0.0404, 0.0166], [0.0067, -0.0470, 0.0199]).startswith("**does not hold**: no")
