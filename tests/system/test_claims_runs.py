"""The claims' tables: complete records, every table of benchmarks/CLAIMS.md and the README equal to
what ``python benchmarks/claims.py tables`` makes of them, and each verdict the rule's (issue 62)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.paths import BENCHMARKS, ROOT, load_script

RECORDS = ROOT / "claims" / "records"
COMMAND = re.compile(r"^fedapp-report claims/records/\S+ .*$", re.MULTILINE)
claims = load_script("claims")


def run_folders() -> list[Path]:
    return sorted(path.parent for path in RECORDS.rglob("summary.json"))


@pytest.mark.parametrize("run", run_folders(), ids=lambda path: str(path.relative_to(RECORDS)))
def test_a_record_holds_every_round_of_its_run_and_its_summary_agrees(run: Path) -> None:
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl", "summary.json"]
    config = yaml.safe_load((run / "config.yaml").read_text())
    summary = json.loads((run / "summary.json").read_text())
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [line["round"] for line in rounds] == list(range(1, config["num-rounds"] + 1))
    assert summary["rounds"] == config["num-rounds"]
    assert summary["final_acc_mean"] == rounds[-1]["acc_mean"]
    assert run.name.startswith(f"{config['method']}-") and run.name.endswith(f"-s{config['seed']}")


def test_the_pages_tables_are_what_the_command_makes_of_the_records() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "claims.py"), "tables", "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "up to date: nothing changed" in result.stdout


def test_a_figure_typed_into_a_page_is_caught(tmp_path: Path, monkeypatch, capsys) -> None:
    pages = {name: tmp_path / path.name for name, path in claims.PAGES.items()}
    for name, path in claims.PAGES.items():
        shutil.copy(path, pages[name])
    text = pages["claims"].read_text()
    figure = re.search(r"\| (0\.\d{4}) \|", text.split("<!-- claims:family-c -->")[1]).group(1)
    pages["claims"].write_text(text.replace(f"| {figure} |", "| 0.9999 |", 1))
    monkeypatch.setattr(claims, "PAGES", pages)
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    assert claims.main(["tables", "--check"]) == 1
    assert "CLAIMS.md differ from the records' tables" in capsys.readouterr().err
    assert claims.main(["tables", "--write"]) == 0
    assert claims.main(["tables", "--check"]) == 0


def test_every_verdict_on_the_page_follows_its_interval() -> None:
    """The rule stated before the tables: holds when the interval is above 0, reversed below, not
    resolved across it; the rule is stated before the first table."""
    text = claims.PAGES["claims"].read_text()
    assert text.index("## The rule, stated before the runs") < text.index("<!-- claims:family-")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "**" in line and " [" in line]
    assert rows, "no claim row with an interval on the page"
    for row in rows:
        interval = re.search(r"\[([^\]]+)\]", row).group(1).replace("−", "-").replace("×", "")
        low, high = (float(x) for x in interval.split(", "))
        origin = 1.0 if "b/a ×" in row else 0.0
        verdict = re.search(r"\*\*([a-z ]+)\*\*", row).group(1)
        expected = "holds" if low > origin else "reversed" if high < origin else "not resolved"
        assert verdict == expected, row


def test_claims_md_is_a_page_a_reader_reads_in_two_minutes() -> None:
    text = claims.PAGES["claims"].read_text()
    assert len(text.encode()) <= 30_000
    assert "## Where our setting departs from the papers'" in text
    assert "momentum 0.9 ours" in text


def test_a_selection_seed_record_in_a_reported_folder_is_refused(tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "claims" / "family-b.yaml").read_text())
    source = next(path for path in run_folders() if path.parent.name == "family-b")
    shutil.copytree(source, tmp_path / "records" / source.name)
    config = yaml.safe_load((tmp_path / "records" / source.name / "config.yaml").read_text())
    (tmp_path / "records" / source.name / "config.yaml").write_text(yaml.safe_dump({**config, "seed": 100}))
    spec.update(records="records", select={"seed": 100, "group": "pathological", "grids": {}})
    (tmp_path / "family-b.yaml").write_text(yaml.safe_dump(spec, allow_unicode=True))
    family = claims.load_family(tmp_path / "family-b.yaml")
    with pytest.raises(claims.ClaimsError, match="seed 100 chose the settings; no table may report it"):
        claims.family_block(family)


def test_the_records_readme_commands_tabulate_every_record(tmp_path: Path) -> None:
    commands = [shlex.split(match.group(0)) for match in COMMAND.finditer((RECORDS / "README.md").read_text())]
    assert commands, "no fedapp-report command in claims/records/README.md"
    shutil.copytree(RECORDS, tmp_path / "claims" / "records")
    report_cli = Path(sys.executable).parent / commands[0][0]
    for command in commands:
        subprocess.run([str(report_cli), *command[1:]], cwd=tmp_path, check=True, capture_output=True, timeout=300)
        table = (tmp_path / command[command.index("--out") + 1]).read_text()
        family = Path(command[1]).name
        missing = [run.name for run in run_folders() if run.parent.name == family and f"| {run.name} |" not in table]
        assert not missing, missing
