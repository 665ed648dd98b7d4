"""Installing the project adds one namespace, ``fedapp`` (issue 64): the wheel holds it alone, with the
repository's ``strategies/`` and ``clients/`` inside it, and a user's folder with its own
``strategies.py`` and ``clients/`` imports ours beside its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.lint_imports import MAPPED_FOLDERS
from tests.paths import ROOT

USER_CHECK = (
    "import sys\n"
    "import fedapp.builtin_methods\n"  # our table first: the catalog is built on first use, not on its import
    "import fedapp, strategies, clients\n"
    "from fedapp import registry\n"
    "from fedapp.strategies import SDFedStrategy\n"
    "assert registry.strategy_class('sdfed') is SDFedStrategy\n"
    "assert registry.client_class('fedavg').__module__ == 'fedapp.clients.fedavg'\n"
    "assert strategies.MyStrategy and clients.USER_CLIENTS == []\n"
    "print(fedapp.__file__)\n"
    "print(sorted(type(f).__name__ for f in sys.meta_path))\n"
)


def test_the_wheel_installs_fedapp_alone_and_a_user_s_own_strategies_module_beside_it(tmp_path):
    source = tmp_path / "source"
    for folder in MAPPED_FOLDERS.values():
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    build = subprocess.run(
        [*pip_wheel, "-w", str(tmp_path / "dist"), "."],
        cwd=source, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("fedapp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"fedapp", wheel.name.split("-py3")[0] + ".dist-info"}
    # Every module of the three folders is in the wheel, where the installed layout puts it.
    for target, folder in MAPPED_FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            assert f"{target}/{path.relative_to(ROOT / folder).as_posix()}" in names, path

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    user = tmp_path / "myapp"
    (user / "clients").mkdir(parents=True)
    (user / "strategies.py").write_text("class MyStrategy:\n    pass\n")
    (user / "clients" / "__init__.py").write_text("USER_CLIENTS = []\n")
    done = subprocess.run(
        [sys.executable, "-c", USER_CHECK], cwd=user, env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    installed, finders = done.stdout.splitlines()[-2:]
    assert Path(installed).parent == site / "fedapp"
    assert "_CheckoutFolders" not in finders  # the wheel's layout needs no mapping
