"""The code is ruff-clean and keeps the layer rule's import contracts (the Dockerfiles'
hadolint check is in test_docker.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT


def test_ruff_is_clean():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ----- the layer rule: import contracts ([tool.importlinter] in pyproject.toml) -----

LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))
CONTRACTS = {
    "layers": "fedapp: entry points > Flower layer > Flower-free core, every module in one layer",
    "sides": "strategies and clients sit between the entry points and the Flower layer, never importing each other",
    "core": "the core imports neither Flower nor the strategies and clients",
    "cycles": "no import cycles among sibling modules, lazy imports included",
}


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH puts `root`'s packages ahead of the installed (editable) ones.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, check=False, timeout=120
    )


def broken_contracts(output: str) -> set[str]:
    # Long contract names wrap: join the report's lines before matching.
    flat = " ".join(output.split())
    return {key for key, name in CONTRACTS.items() if f"{name} BROKEN" in flat}


def test_the_import_contracts_hold():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


LAZY = "\n\ndef _violation():\n    {}  # noqa\n"
VIOLATIONS = {
    "the core imports Flower": ("fedapp/catalog.py", "\nimport flwr  # noqa\n", "core"),
    "the core lazily imports a strategy": ("fedapp/config/rules.py", LAZY.format("import strategies.fedavg"), "core"),
    "a client imports a strategy": ("clients/fedavg.py", "\nimport strategies.fedavg  # noqa\n", "sides"),
    "the Flower layer imports an entry point": (
        "fedapp/flower/driver.py",
        LAZY.format("import fedapp.server_app"),
        "layers",
    ),
    "a lazy import closes a cycle": ("fedapp/errors.py", LAZY.format("import fedapp.config"), "cycles"),
    # Issue 43's circles were of this kind: a module naming, for annotations only, a type of one that imports it.
    "an annotation-only import closes a cycle": (
        "fedapp/catalog.py",
        "\nfrom typing import TYPE_CHECKING  # noqa\nif TYPE_CHECKING:\n    import fedapp.config  # noqa\n",
        "cycles",
    ),
    "a new core module outside every layer": ("fedapp/unlayered.py", '"""Not in any layer."""\n', "layers"),
}


@pytest.mark.parametrize("violation", list(VIOLATIONS))
def test_a_deliberate_violation_breaks_its_contract(tmp_path, violation):
    for package in ("fedapp", "strategies", "clients"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert lint_imports(tmp_path).returncode == 0  # the copy holds, as the repository does
    path, added, contract = VIOLATIONS[violation]
    target = tmp_path / path
    target.write_text((target.read_text() if target.exists() else "") + added)
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    # the contract named breaks (a violation may break others too: an edge upwards is also indirect)
    assert contract in broken_contracts(done.stdout), done.stdout
