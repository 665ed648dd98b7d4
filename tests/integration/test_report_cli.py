"""``python -m fedapp.report`` in its own process, on run folders written by the real RunRecorder."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_report import PNG_MAGIC, write_runs


def test_python_dash_m_runs_the_report(tmp_path):
    runs = write_runs(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "fedapp.report", str(runs["held"].parent)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "report.md").read_text() == done.stdout
    assert (tmp_path / "report.png").read_bytes().startswith(PNG_MAGIC)
