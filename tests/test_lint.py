"""The code is ruff-clean and every Dockerfile passes hadolint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", sorted((ROOT / "docker").glob("Dockerfile*")), ids=lambda p: p.name)
def test_dockerfiles_pass_hadolint(dockerfile):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is a dev dependency (pip install -e '.[dev]')"
    done = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
