"""The README's tier commands select the three tiers: each collects, they are disjoint, and together they are the suite.

(Each test's tier marker comes from its folder: ``tests/conftest.py``; ``tests/unit/test_tiers.py`` checks it.)
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.paths import ROOT

TIER_COMMAND = re.compile(r"^python -m pytest -q (tests/(unit|integration|system))$", re.MULTILINE)
REPLAY = "python -m pytest -q --randomly-seed=N --randomly-dont-reorganize @.pytest_cache/d/test-order/gw0.txt"


@functools.cache  # the suite does not change during the run: it is collected once
def collected() -> frozenset[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return frozenset(line for line in done.stdout.splitlines() if "::" in line)


def test_the_readmes_tier_commands_split_the_suite_by_folder():
    """The README's three commands name the three folders that are pytest's ``testpaths``, in order, so
    together they select what the default run collects; the default run is collected once (a collection
    of the whole suite imports torch, Ray and Flower: about 8 s a time) and each of its tests lies in
    exactly one of the folders, none of them empty."""
    commands = TIER_COMMAND.findall((ROOT / "README.md").read_text())
    assert [tier for _, tier in commands] == ["unit", "integration", "system"], commands
    folders = [folder for folder, _ in commands]
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"] == folders
    everything = collected()
    in_folder = {folder: {node for node in everything if node.startswith(f"{folder}/")} for folder in folders}
    assert all(in_folder.values()), {folder: len(nodes) for folder, nodes in in_folder.items()}
    assert sum(len(nodes) for nodes in in_folder.values()) == len(everything)


def test_the_gpu_tier_is_one_skipped_line_without_cuda():
    """docs/getting-started.md's GPU tier command, as written, on a machine (or in a process)
    without a visible CUDA device: nothing runs, and the whole tier is one line that says why.
    pytest's exit status is 5 (no tests ran), so a GPU machine whose CUDA is hidden does not pass
    for one that ran the tier."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "getting-started.md").read_text(), re.DOTALL)
    (command,) = [block.strip() for block in blocks if "tests/gpu" in block]
    assert command == "python -m pytest -q tests/gpu"
    done = subprocess.run(
        [sys.executable, *command.split()[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-2000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped == [
        "SKIPPED [1] tests/gpu/test_on_gpu.py:28: no CUDA device visible: "
        "the GPU tier runs on a GPU machine (tests/gpu/run_on_device.sh)"
    ]
    assert done.stdout.rstrip().splitlines()[-1].startswith("1 skipped in ")
    assert "tests/gpu" not in collected()  # not in the default run: CI has no GPU


def test_the_gpu_machines_script_passes_shellcheck_and_runs_the_gpu_tier_as_written(tmp_path):
    script = ROOT / "tests" / "gpu" / "run_on_device.sh"
    assert os.access(script, os.X_OK)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    lint = subprocess.run([shellcheck, script], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    env = {**os.environ, "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", script, "gpu"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # Without a GPU the tier is its one skipped line and pytest's "no tests ran" status, recorded as such.
    assert (tmp_path / "summary.txt").read_text().startswith("gpu-tier: exit 5 in ")
    assert "no CUDA device visible" in (tmp_path / "gpu-tier.log").read_text()
    wrong = subprocess.run(["bash", script, "gpus"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert wrong.returncode == 2 and "unknown step gpus (gpu, unit, launch, pretrain)" in wrong.stdout


def test_readme_command_2_is_what_ci_runs():
    """``.ci/run`` runs the README's command 2 verbatim (its last line is that command)."""
    block = re.search(
        r"\*\*2\. Install and run the test suite:\*\*\n\n```bash\n(.*?)\n```", (ROOT / "README.md").read_text()
    )
    assert block, "README.md has no command 2 block"
    assert (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1] == block.group(1)
    assert "-n 2 --dist loadgroup" in block.group(1)


def pytest_in(cache: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest on this checkout with its cache (and so the order files) in ``cache``."""
    command = [sys.executable, "-m", "pytest", "-q", "-o", f"cache_dir={cache}", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_each_worker_writes_its_tests_in_order_and_the_file_replays_them_in_one_process(tmp_path):
    """Under ``-n 2 --dist loadgroup`` every test is in exactly one worker's order file
    (``tests/conftest.py``'s ``ORDER_FOLDER``, plain node ids); docs/getting-started.md's replay command, with
    the seed and the file filled in, runs the same tests in the same order in one process. (Each
    run here keeps its cache, and so its order files, in a folder of its own: the suite's own
    workers are writing theirs to the checkout's.)"""
    assert REPLAY in (ROOT / "docs" / "getting-started.md").read_text(), "docs/getting-started.md has no replay command"
    files = ("tests/system/test_docs.py", "tests/unit/test_log_filters.py")  # two groups, a second each
    seed = "--randomly-seed=20261205"
    done = pytest_in(tmp_path / "workers", "-n", "2", "--dist", "loadgroup", seed, *files)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    orders = {path.stem: path.read_text().splitlines() for path in (tmp_path / "workers").glob("d/test-order/*.txt")}
    assert set(orders) == {"gw0", "gw1"}, orders
    ran = [node for order in orders.values() for node in order]
    assert sorted(ran) == sorted(node for node in collected() if node.startswith(files)) and "@" not in "".join(ran)
    for worker, order in orders.items():
        if not order:
            continue
        (tmp_path / f"{worker}.txt").write_text("\n".join(order) + "\n")
        cache = tmp_path / f"replay-{worker}"
        # The README's command with the seed and this worker's file in place of N and gw0's path.
        again = pytest_in(cache, seed, "--randomly-dont-reorganize", f"@{tmp_path}/{worker}.txt")
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        assert (cache / "d" / "test-order" / "main.txt").read_text().splitlines() == order
