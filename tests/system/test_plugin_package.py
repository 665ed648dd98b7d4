"""A method in a package of its own (issue 64): ``examples/fedper``, installed beside fedapp as a user
installs a plug-in, is found through its ``fedapp.methods`` entry point alone, runs in the launcher
from a user's folder and is planned by the sweep; nothing in fedapp names it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import yaml

from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "fedper"

USER_CHECK = (
    # The plug-in first: its MethodSpec comes from fedapp.catalog, which must not load the entry points
    # (the plug-in's own among them) while either is half imported.
    "import fedapp_fedper\n"
    "from fedapp.catalog import CATALOG, CATALOG_PROBLEMS\n"
    "assert CATALOG_PROBLEMS == {}, CATALOG_PROBLEMS\n"
    "from fedapp.registry import client_class, strategy_class\n"
    "assert list(CATALOG)[-1] == 'fedper', list(CATALOG)\n"
    "assert strategy_class('fedper').__module__ == 'fedapp_fedper.strategy'\n"
    "assert client_class('fedper').__module__ == 'fedapp_fedper.client'\n"
)


def test_installed_beside_fedapp_it_runs_in_the_launcher_and_the_sweep_plans_it(tmp_path):
    # Installed as a user installs it (from a copy: a build writes into the folder it builds).
    source = shutil.copytree(EXAMPLE, tmp_path / "fedper", ignore=shutil.ignore_patterns("__pycache__"))
    site = tmp_path / "site"
    pip_install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
    install = subprocess.run(
        [*pip_install, "--target", str(site), str(source)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site)}
    user = tmp_path / "user"
    user.mkdir()
    check = subprocess.run(
        [sys.executable, "-c", USER_CHECK], cwd=user, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert check.returncode == 0, check.stderr[-3000:]
    results = tmp_path / "results"
    run_config = f'num-rounds=2 num-partitions=2 local-epochs=1 results-dir="{results}"'
    preset = str(source / "conf" / "fedper-digits.yaml")
    # The plug-in's own key, refused in one line before anything starts when it cannot run ...
    refused = subprocess.run(
        [sys.executable, "-m", "fedapp.launch", "--preset", preset, "--run-config", "fedper-personal-layers=5"],
        cwd=user, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and not results.exists()
    assert "config key 'fedper-personal-layers' = 5 leaves no layer of 'cnn-1' to share" in refused.stderr
    # ... and set like any of fedapp's keys (Flower refuses a key the app's pyproject.toml does not declare).
    run_config += " fedper-personal-layers=2"
    launch = subprocess.run(
        [sys.executable, "-m", "fedapp.launch", "--preset", preset, "--num-clients", "2", "--run-config", run_config],
        cwd=user, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert launch.returncode == 0, (launch.stdout + launch.stderr)[-3000:]
    (run_dir,) = results.iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients_fit"] for r in records] == [2, 2]
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (written["method"], written["fedper-personal-layers"]) == ("fedper", 2)
    plan = subprocess.run(
        [sys.executable, "-m", "fedapp.sweep", "--preset", preset, "--methods", "fedper,fedavg", "--seeds", "0,1",
         "--results-dir", str(tmp_path / "sweep"), "--run-config", "fedper-personal-layers=2", "--dry-run"],
        cwd=user, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert plan.returncode == 0, (plan.stdout + plan.stderr)[-3000:]
    assert "fedper" in plan.stdout and "4 runs" in plan.stdout, plan.stdout[-3000:]
