"""`python -m fedapp.sweep` through flwr run: stopped mid-sweep, started again, it finishes what is left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from fedapp.launch import stop_processes, superlink_pids
from fedapp.metrics import read_metrics
from tests.system.federation import wait_for


def test_an_interrupted_sweep_skips_finished_runs_and_resumes_the_interrupted_one(tmp_path: Path, request) -> None:
    results = tmp_path / "sweep"
    # The sweep's Flower home is a temporary folder: put it where this test can find its SuperLink.
    # Short, since Ray's sockets live under it too and socket paths are limited to 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="sweep-"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    env = {**os.environ, "TMPDIR": str(tmp), "FLWR_TELEMETRY_ENABLED": "0"}
    command = [sys.executable, "-m", "fedapp.sweep", "--results-dir", str(results), "--seeds", "0,1"]
    command += ["--run-config", 'num-rounds=6 num-partitions=2 local-epochs=1 model="cnn-5"']
    plan = subprocess.run([*command, "--dry-run"], env=env, capture_output=True, text=True, check=True)
    first, second = plan.stdout.split()[-2:]
    assert first.endswith("-s0") and second.endswith("-s1") and first[:-3] == second[:-3]

    sweep = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Stop it once the first run is done and the second has checkpointed a round.
        wait_for(
            lambda: (results / first / "summary.json").exists() and (results / second / "checkpoint.npz").exists(),
            "first run finished and second run checkpointed",
            timeout=300,
            interval=0.2,
        )
        sweep.send_signal(signal.SIGTERM)
        assert sweep.wait(timeout=60) == 128 + signal.SIGTERM
        assert superlink_pids(tmp) == [], "the sweep left its SuperLink running"
    finally:
        sweep.kill()
        stop_processes(superlink_pids(tmp))
    assert json.loads((results / second / "summary.json").read_text())["rounds"] < 6
    finished_before = (results / first / "summary.json").stat().st_mtime_ns

    again = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"{first}: finished before, skipped" in again.stdout
    assert f"{second}: resuming from its checkpoint" in again.stdout, again.stdout
    assert (results / first / "summary.json").stat().st_mtime_ns == finished_before
    assert [row["round"] for row in read_metrics(results / second / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    report = (results / "report.md").read_text()
    assert "## Mean ± std over seeds" in report and "| 2 (0, 1) |" in report
    assert superlink_pids(tmp) == []
