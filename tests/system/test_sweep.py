"""`python -m fedapp.sweep` through flwr run: stopped mid-sweep, started again, it finishes what is left."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from fedapp.launch import stop_processes, superlink_pids
from fedapp.metrics import read_metrics
from tests.paths import ROOT, takes_ctrl_c
from tests.system.federation import wait_for

README_COMMAND = re.compile(r"^python -m fedapp\.sweep --results-dir results/sweep-demo .*$", re.MULTILINE)
PAIRED_COMMAND = re.compile(r"^fedapp-report results/sweep-demo .*--paired-against .*$", re.MULTILINE)


def test_an_interrupted_sweep_skips_finished_runs_and_resumes_the_interrupted_one(tmp_path: Path, request) -> None:
    results = tmp_path / "results" / "sweep-demo"
    # The sweep's Flower home is a temporary folder: put it where this test can find its SuperLink.
    # Short, since Ray's sockets live under it too and socket paths are limited to 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="sweep-"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    env = {**os.environ, "TMPDIR": str(tmp), "FLWR_TELEMETRY_ENABLED": "0"}
    # The command in docs/protocols.md, verbatim, in a fresh folder.
    docs = (ROOT / "docs" / "protocols.md").read_text()
    command = [sys.executable, *shlex.split(README_COMMAND.search(docs).group(0))[1:]]
    plan = subprocess.run([*command, "--dry-run"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert "4 runs" in plan.stdout
    first, second = plan.stdout.split()[-4:-2]  # fedavg's two seeds
    assert first.endswith("-s0") and second.endswith("-s1") and first[:-3] == second[:-3]

    printed = tmp_path / "sweep.out"
    sweep = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=printed.open("w"),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=takes_ctrl_c,  # noqa: PLW1509 - one signal disposition, set before exec
    )
    try:
        # Stop it once the first run is done and the second has checkpointed a round.
        wait_for(
            lambda: (results / first / "summary.json").exists() and (results / second / "checkpoint.npz").exists(),
            "first run finished and second run checkpointed",
            timeout=300,
            interval=0.2,
        )
        # Ctrl-C: one line, no traceback (issue 42), and nothing left running.
        sweep.send_signal(signal.SIGINT)
        _, err = sweep.communicate(timeout=60)
        assert sweep.returncode == 128 + signal.SIGINT, err[-2000:]
        assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: interrupted; finished runs")
        assert superlink_pids(tmp) == [], "the sweep left its SuperLink running"
        # Its 4 runs joined one Ray (fedapp.launch.ray_head), which stopped with the sweep: no process of
        # the sweep's Flower home is left, Ray's own included (they run with its FLWR_HOME).
        assert "4 runs share one Ray (RAY_ADDRESS=" in printed.read_text()
        wait_for(lambda: not processes_under(tmp), "the sweep's processes to end", timeout=30, interval=0.5)
    finally:
        sweep.kill()
        stop_processes(superlink_pids(tmp))
    assert json.loads((results / second / "summary.json").read_text())["rounds"] < 4
    finished_before = (results / first / "summary.json").stat().st_mtime_ns

    again = subprocess.run(command, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"{first}: finished before, skipped" in again.stdout
    assert f"{second}: resuming from its checkpoint" in again.stdout, again.stdout
    assert (results / first / "summary.json").stat().st_mtime_ns == finished_before
    assert [row["round"] for row in read_metrics(results / second / "metrics.jsonl")] == [1, 2, 3, 4]
    report = (results / "report.md").read_text()
    assert "## Mean ± std over seeds" in report and report.count("| 2 (0, 1) |") == 2
    assert superlink_pids(tmp) == []

    # The paired comparison the same page shows, verbatim, on the sweep's results.
    paired = shlex.split(PAIRED_COMMAND.search(docs).group(0))
    report_cli = Path(sys.executable).parent / paired[0]
    subprocess.run([str(report_cli), *paired[1:]], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300)
    section = (tmp_path / "paired.md").read_text().split("## Paired over seeds, against standalone")[1]
    fedavg_row = next(line for line in section.splitlines() if line.startswith("| fedavg"))
    assert "| 2 (0, 1) |" in fedavg_row and " of 2 |" in fedavg_row


def processes_under(folder: Path) -> list[str]:
    """The command lines of the processes whose ``FLWR_HOME`` lies in ``folder``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if process.environ().get("FLWR_HOME", "").startswith(str(folder)):
                found.append(" ".join(process.info["cmdline"] or []))
    return found


SELECT_COMMAND = re.compile(r"^python -m fedapp\.sweep --results-dir results/select-demo .*$", re.MULTILINE)


def test_the_documented_selection_chooses_on_validation_and_reports_the_chosen_point_only(tmp_path: Path, request):
    """docs/protocols.md's --select command, verbatim: each point's validation figures and the choice
    recorded, the report holding the chosen point's run alone (issue 62)."""
    tmp = Path(tempfile.mkdtemp(prefix="select-"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    env = {**os.environ, "TMPDIR": str(tmp), "FLWR_TELEMETRY_ENABLED": "0"}
    docs = (ROOT / "docs" / "protocols.md").read_text()
    command = [sys.executable, *shlex.split(SELECT_COMMAND.search(docs).group(0))[1:]]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = tmp_path / "results" / "select-demo"
    [record] = json.loads((results / "selection.json").read_text())["selections"]
    scores = {point["point"]["lr"]: point["val_score"] for point in record["points"]}
    assert set(scores) == {0.1, 0.01} and record["chosen"] == {"lr": max(scores, key=scores.get)}
    for point in record["points"]:
        [run] = point["runs"]
        last = read_metrics(results / run / "metrics.jsonl")[-1]
        assert point["val_per_run"] == [last["val_acc_mean"]]  # the figure the choice rests on, as recorded
    chosen_run = next(p["runs"][0] for p in record["points"] if p["point"] == record["chosen"])
    other_run = next(p["runs"][0] for p in record["points"] if p["point"] != record["chosen"])
    report = (results / "report.md").read_text()
    assert f"| {chosen_run} |" in report and other_run not in report
    assert f"chose {record['chosen']}" in done.stdout
    assert superlink_pids(tmp) == []
