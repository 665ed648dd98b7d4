"""The import contracts on the installed layout: ``python -m tests.lint_imports``.

The repository keeps ``strategies/`` and ``clients/`` at its top; installed they are
``fedapp.strategies`` and ``fedapp.clients``. Import-linter reads packages from disk, so the
contracts run on a copy laid out as the wheel is, with the repository's ``pyproject.toml``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.paths import ROOT

LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))
# Where each installed package's files live in the repository ([tool.setuptools.package-dir]).
MAPPED_FOLDERS = {"fedapp": "fedapp", "fedapp/strategies": "strategies", "fedapp/clients": "clients"}


def installed_layout(root: Path, dest: Path) -> Path:
    """Copy ``root``'s packages into ``dest`` as the wheel lays them out, with its pyproject.toml."""
    for target, folder in MAPPED_FOLDERS.items():
        shutil.copytree(root / folder, dest / target, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "pyproject.toml", dest)
    return dest


def lint_imports(layout: Path) -> subprocess.CompletedProcess:
    """Run the contracts on an installed layout; its packages go ahead of the installed (editable) ones."""
    env = {**os.environ, "PYTHONPATH": str(layout)}
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=layout, env=env, capture_output=True, text=True, check=False, timeout=120
    )


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="fedapp-lint-") as tmp:
        done = lint_imports(installed_layout(ROOT, Path(tmp)))
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
