"""docs/deployment.md's ServerApp of your own, made and run exactly as the page says.

The section "Using our strategies in your own ServerApp" holds the files of a
``flwr new``-style app (fenced blocks whose ``title`` names the file) and the
commands a user types (its ``bash`` blocks: make the folders, ``flwr run`` the
app, stop the local SuperLink). The test makes the app in a fresh folder (each
file goes into a folder the page's first command made, nothing else is created
there), runs every block verbatim in a bash of its own with a fresh home and
Flower home, and checks that the Message-API run trained and evaluated both
rounds, that nothing Flower marks deprecated was used, and that the page's stop
command stopped the SuperLink ``flwr run`` left behind (every process it started
is stopped by PID afterwards anyway). The page's legacy-API module is imported
and its ``server_fn`` called on the page's run config.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType

import tomllib
from flwr.app import Context, RecordDict
from flwr.serverapp import ServerApp

from fedapp.launch import free_port, stop_processes
from fedapp.launch.processes import superlink_pids
from fedapp.strategies import PFedLoRAStrategy
from tests.paths import ROOT
from tests.system.test_docs_trial import descendants, run_block, section_bash_blocks, wait_until_gone

HEADING = "## Using our strategies in your own ServerApp"
# A file the user creates: a fenced block whose title is its path, e.g. ```toml title="my-fed/pyproject.toml"
FILE_BLOCK = re.compile(r'^```[a-z]+ title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# What the page's ServerApp prints after the run, one line per round.
PRINTED_ROUND = re.compile(r"^round (\d+): mean client accuracy (\d+\.\d{3})$", re.MULTILINE)
ROUNDS = [1, 2]


def section(markdown: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level (its subsections included)."""
    start = markdown.index(heading + "\n")
    level = heading.split(" ", 1)[0]
    following = markdown.find(f"\n{level} ", start + len(heading))
    return markdown[start : following if following >= 0 else len(markdown)]


def page_files(text: str) -> dict[str, str]:
    """The files the section tells the user to create, by their path from where the user starts."""
    files = dict(FILE_BLOCK.findall(text))
    assert len(files) == len(FILE_BLOCK.findall(text)), "two blocks name the same file"
    return files


def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's shell on a fresh machine: an empty home, a fresh Flower home (created by ``flwr``), this
    project's venv first on ``PATH``, and a local SuperLink on ports of its own (another test's cannot
    answer for it)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    env.update(
        HOME=str(home),
        FLWR_HOME=str(tmp_path / "flwr-home"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
    )
    return env


def deprecation_lines(output: str) -> list[str]:
    """Lines of ``output`` where Flower says something is deprecated (Ray's own notices left out)."""
    return [line for line in output.splitlines() if "deprecat" in line.lower() and "ray" not in line.lower()]


class Collected(logging.Handler):
    """Keeps every record it is handed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def import_quietly(path: Path) -> tuple[ModuleType, list[str]]:
    """Import the module at ``path``; also return what Flower logged or warned as deprecated meanwhile
    (Flower says so in a warning on its ``flwr`` logger, e.g. for a ``Driver`` argument)."""
    handler = Collected()
    flower = logging.getLogger("flwr")
    flower.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            spec = importlib.util.spec_from_file_location(f"page_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    finally:
        flower.removeHandler(handler)
    # Python warnings count when Flower or the page's module raised them (not other libraries' imports).
    ours = [w for w in caught if "flwr" in Path(w.filename).parts or Path(w.filename) == path]
    said = [record.getMessage() for record in handler.records] + [str(w.message) for w in ours]
    return module, [line for line in said if "deprecat" in line.lower()]


def test_the_pages_own_server_app_runs_with_flwr_run_as_written(tmp_path):
    text = section((ROOT / "docs" / "deployment.md").read_text(), HEADING)
    blocks = section_bash_blocks(text, HEADING)
    assert len(blocks) == 3, f"the section should hold: make the folders, run, stop; found {len(blocks)} blocks"
    make, run, stop = blocks
    files = page_files(text)
    assert {"my-fed/pyproject.toml", "my-fed/my_fed/server_app.py", "my-fed/my_fed/legacy_app.py"} <= set(files)

    work = tmp_path / "work"
    work.mkdir()
    env = user_env(tmp_path)
    flwr_home = Path(env["FLWR_HOME"])
    started: list[int] = []
    try:
        done = run_block(make, tmp_path / "make.sh", work, env, [], timeout=60)
        assert done.returncode == 0, done.stderr
        for name, content in files.items():
            target = work / name
            assert target.parent.is_dir(), f"the page never makes {target.parent.relative_to(work)} for {name}"
            target.write_text(content)
        project = tomllib.loads((work / "my-fed/pyproject.toml").read_text())
        assert project["project"]["dependencies"] == ["fedapp"], "the app depends on this project by its name"

        done = run_block(run, tmp_path / "run.sh", work, env, [], timeout=600)
        started = superlink_pids(flwr_home)
        seen = done.stdout + done.stderr
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in flwr_home.rglob("*.log"))
        assert done.returncode == 0, f"{seen[-4000:]}\n{logs}"
        printed = [(int(rnd), float(acc)) for rnd, acc in PRINTED_ROUND.findall(seen)]
        assert [rnd for rnd, _ in printed] == ROUNDS, f"the ServerApp did not print both rounds:\n{seen[-4000:]}"
        assert all(0.0 <= acc <= 1.0 for _, acc in printed), printed
        # The run went through MessageStrategy (the Message API), and our recorder saw both rounds.
        assert "PFedLoRAStrategy(method='pfedlora') on Flower's Message API" in seen
        assert "done: round 2/2" in seen
        assert deprecation_lines(seen) == [], deprecation_lines(seen)
        # The output the page shows is the form the ServerApp prints.
        (shown,) = [b for b in TEXT_BLOCK.findall(text) if "mean client accuracy" in b]
        assert [int(rnd) for rnd, _ in PRINTED_ROUND.findall(shown)] == ROUNDS, shown
        assert not (Path(env["HOME"]) / ".flwr").exists(), "the user's own Flower home was written"

        assert len(started) == 1, f"expected the one local SuperLink of this Flower home, found {started}"
        tree = descendants(started)
        done = run_block(stop, tmp_path / "stop.sh", work, env, [], timeout=60)
        assert done.returncode == 0, done.stderr
        assert wait_until_gone(tree) == [], "the page's stop command left the local SuperLink (or its SuperExec)"
    finally:
        stop_processes(started + superlink_pids(flwr_home))


def test_the_pages_legacy_server_app_builds_our_strategy_from_the_pages_run_config(tmp_path):
    text = section((ROOT / "docs" / "deployment.md").read_text(), HEADING)
    files = page_files(text)
    path = tmp_path / "legacy_app.py"
    path.write_text(files["my-fed/my_fed/legacy_app.py"])
    module, deprecated = import_quietly(path)
    assert deprecated == [], deprecated
    assert isinstance(module.server_fn_app, ServerApp) and isinstance(module.workflow_app, ServerApp)

    run_config = tomllib.loads(files["my-fed/pyproject.toml"])["tool"]["flwr"]["app"]["config"]
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    components = module.server_fn(context)
    assert isinstance(components.strategy, PFedLoRAStrategy)
    # num-server-rounds reached the legacy schedule through our config.
    assert components.config.num_rounds == run_config["num-server-rounds"] == 2
    assert components.strategy.config.client_models == "cnn-1,cnn-3"
