"""A tool writes only files it created or wrote itself (issue 63): each file a report or sweep
writes carries its tool's mark, and an existing file without it is refused, wherever it is, before
anything is written, in one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

from fedapp.report.cli import main as report_main
from fedapp.runfolder import mark_markdown, written_by
from fedapp.sweep import main as sweep_main
from tests.unit.records import round_record


def run_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"method": "fedavg", "num-rounds": 1, "seed": 0}))
    (path / "metrics.jsonl").write_text(round_record(1).to_json() + "\n")
    (path / "summary.json").write_text(json.dumps({"rounds": 1}))
    return path


def test_a_report_never_overwrites_another_runs_files(tmp_path: Path, capsys):
    reported = run_folder(tmp_path / "results" / "A")
    other = tmp_path / "results" / "B"
    other.mkdir()
    for name in ("checkpoint.npz", "metrics.jsonl"):
        (other / name).write_bytes(b"B's own bytes")
        assert report_main([str(reported), "--out", str(other / name), "--figure", ""]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"fedapp-report: error: --out {other / name} exists and was not written by fedapp-report: it is not "
            "overwritten; name a file that does not exist yet, or move that one away"
        )
        assert (other / name).read_bytes() == b"B's own bytes"


def test_a_report_rewrites_its_own_report_and_figure_and_refuses_a_users_figure(tmp_path: Path, capsys):
    reported = run_folder(tmp_path / "A")
    out, figure = tmp_path / "report.md", tmp_path / "report.png"
    for _ in range(2):  # the second time over its own files
        assert report_main([str(reported), "--out", str(out), "--figure", str(figure)]) == 0
    assert written_by(out, "fedapp-report") and written_by(figure, "fedapp-report")
    capsys.readouterr()
    Image.new("RGB", (4, 4)).save(tmp_path / "photo.png")
    assert report_main([str(reported), "--out", str(tmp_path / "new.md"), "--figure", str(tmp_path / "photo.png")]) == 2
    assert "--figure" in capsys.readouterr().err and not (tmp_path / "new.md").exists()


def test_a_mark_is_the_last_line_the_png_text_or_the_json_field(tmp_path: Path):
    (tmp_path / "a.md").write_text(mark_markdown("# A report", "fedapp-report"))
    assert written_by(tmp_path / "a.md", "fedapp-report") and not written_by(tmp_path / "a.md", "fedapp.sweep")
    (tmp_path / "quoted.md").write_text(mark_markdown("x", "fedapp-report") + "my notes below it\n")
    assert not written_by(tmp_path / "quoted.md", "fedapp-report")
    (tmp_path / "s.json").write_text(json.dumps({"written_by": "fedapp.sweep"}))
    (tmp_path / "list.json").write_text("[1, 2]")
    assert written_by(tmp_path / "s.json", "fedapp.sweep") and not written_by(tmp_path / "list.json", "fedapp.sweep")
    (tmp_path / "binary.md").write_bytes(b"\xff\xfe")
    assert not written_by(tmp_path / "binary.md", "fedapp-report")


@pytest.mark.parametrize("name", ["report.md", "report.png", "selection.json", "selection.md"])
def test_a_sweep_refuses_a_results_folder_holding_a_file_it_would_overwrite_before_any_run(
    tmp_path: Path, capsys, name
):
    results = tmp_path / "results"
    results.mkdir()
    (results / name).write_bytes(b"a user's file")
    argv = ["--results-dir", str(results), "--methods", "fedavg", "--select", "--dry-run"]
    assert sweep_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the sweep's ") and f"{results / name} exists and was not written by" in err
    assert (results / name).read_bytes() == b"a user's file"
    assert sorted(p.name for p in results.iterdir()) == [name]


def test_a_second_sweep_into_a_results_folder_another_sweep_holds_is_refused(tmp_path: Path, monkeypatch, capsys):
    """Issue 63: two sweeps into one results folder at once each wrote a report listing half the runs."""
    import contextlib  # noqa: PLC0415

    from fedapp import sweep  # noqa: PLC0415
    from fedapp.runfolder import lock_results_folder  # noqa: PLC0415

    submitted = []
    monkeypatch.setattr(sweep, "local_federation", contextlib.nullcontext)
    monkeypatch.setattr(sweep, "check_runs_data", lambda overrides, labels: None)  # a child process
    monkeypatch.setattr(
        sweep, "submit", lambda prepared, env, **_: submitted.append(prepared) or run_folder(prepared.run_dir)
    )
    results = tmp_path / "results"
    argv = ["--results-dir", str(results), "--methods", "fedavg"]
    with lock_results_folder(results):  # the first sweep, still running
        assert sweep_main(argv) == 2
        assert capsys.readouterr().err.strip() == (
            f"error: results folder {results} is being written by another sweep: wait for it to end, "
            "or choose another --results-dir"
        )
        assert submitted == []
    assert sweep_main(argv) == 0 and len(submitted) == 1  # once it ended, the folder is free
