"""The code is ruff-clean and keeps the layer rule's import contracts (the Dockerfiles'
hadolint check is in test_docker.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.lint_imports import installed_layout, lint_imports
from tests.paths import ROOT


def test_ruff_is_clean():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ----- the layer rule: import contracts ([tool.importlinter] in pyproject.toml) -----

CONTRACTS = {
    "layers": (
        "fedapp: entry points > strategies | clients > Flower layer > client data > Flower-free core, every module "
        "in one layer"
    ),
    "core": "the core imports neither Flower nor the strategies and clients",
    "values": "the core takes values or small protocols, never the run configuration",
    "cycles": "no import cycles among sibling modules, lazy imports included",
}


def broken_contracts(output: str) -> set[str]:
    # Long contract names wrap: join the report's lines before matching.
    flat = " ".join(output.split())
    return {key for key, name in CONTRACTS.items() if f"{name} BROKEN" in flat}


def test_the_import_contracts_hold():
    done = subprocess.run(
        [sys.executable, "-m", "tests.lint_imports"], cwd=ROOT, capture_output=True, text=True, check=False, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


LAZY = "\n\ndef _violation():\n    {}  # noqa\n"
VIOLATIONS = {
    "the core imports Flower": ("fedapp/catalog.py", "\nimport flwr  # noqa\n", "core"),
    "the core lazily imports a strategy": (
        "fedapp/config/rules.py",
        LAZY.format("import fedapp.strategies.fedavg"),
        "core",
    ),
    "a client imports a strategy": (
        "fedapp/clients/fedavg.py",
        "\nimport fedapp.strategies.fedavg  # noqa\n",
        "layers",
    ),
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
    # Issue 64: a core module takes values, not the run configuration.
    "a core module takes the run configuration": (
        "fedapp/secagg.py",
        "\nfrom typing import TYPE_CHECKING  # noqa\nif TYPE_CHECKING:\n    import fedapp.config  # noqa\n",
        "values",
    ),
    "the core reaches the client data": ("fedapp/training.py", LAZY.format("import fedapp.clientdata"), "layers"),
    "a new core module outside every layer": ("fedapp/unlayered.py", '"""Not in any layer."""\n', "layers"),
}


@pytest.mark.parametrize("violation", list(VIOLATIONS))
def test_a_deliberate_violation_breaks_its_contract(tmp_path, violation):
    installed_layout(ROOT, tmp_path)
    assert lint_imports(tmp_path).returncode == 0  # the copy holds, as the repository does
    path, added, contract = VIOLATIONS[violation]
    target = tmp_path / path
    target.write_text((target.read_text() if target.exists() else "") + added)
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    # the contract named breaks (a violation may break others too: an edge upwards is also indirect)
    assert contract in broken_contracts(done.stdout), done.stdout
