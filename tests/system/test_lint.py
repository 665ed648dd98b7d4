"""The code is ruff-clean (the Dockerfiles' hadolint check is in test_docker.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import ROOT


def test_ruff_is_clean():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
