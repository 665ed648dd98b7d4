"""The documentation's own commands for a local Flower federation, run as written.

``docs/deployment.md``'s quick local trial: its first block twice in a row, in a
fresh home directory (no ``~/.flwr``) and a fresh copy of the app, then its
teardown block, each block in a bash of its own as a user's separate terminals
would run them. ``docs/getting-started.md``'s command that stops the local
SuperLink ``flwr run`` leaves behind. Both must stop exactly what they started:
a process whose command line merely names ``flower-superlink`` survives.

The trial's ports are the documented ones (9092, 9094, 9095; Flower's local
SuperLink uses 39091): with root the blocks run in a network namespace of their
own, so nothing on the host's loopback can collide with them; elsewhere they run
on the host when those ports are free, and are skipped when one is taken.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from fedapp.launch import stop_processes
from fedapp.metrics import read_metrics
from tests.paths import ROOT
from tests.system import netns as hosts

TRIAL_HEADING = "## On one machine, for a quick local trial"
TRIAL_PORTS = (9092, 9094, 9095)
LOCAL_SUPERLINK_PORT = 39091  # Flower's default for the SuperLink that `flwr run` starts
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
# What Flower packs into the app bundle (a copy keeps the test's files out of the checkout).
APP_FILES = ("pyproject.toml", ".gitignore", "README.md", "LICENSE", "fedapp", "strategies", "clients", "conf")


def section_bash_blocks(markdown: str, heading: str) -> list[str]:
    """The ``bash`` code blocks of the section under ``heading`` (up to the next heading of its level)."""
    start = markdown.index(heading + "\n")
    level = heading.split(" ", 1)[0]
    following = markdown.find(f"\n{level} ", start + len(heading))
    return BASH_BLOCK.findall(markdown[start : following if following >= 0 else len(markdown)])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, already dead but not yet reaped, does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them."""
    table = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True, check=True)
    children: dict[int, list[int]] = {}
    for line in table.stdout.splitlines():
        pid, ppid = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
    found, frontier = list(pids), list(pids)
    while frontier:
        frontier = [child for pid in frontier for child in children.get(pid, [])]
        found += frontier
    return found


def wait_until_gone(pids: list[int], timeout: float = 60.0) -> list[int]:
    """Wait for ``pids`` to end; the ones still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.5)
    return [pid for pid in pids if alive(pid)]


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def where() -> Iterator[list[str]]:
    """The command prefix that runs a block on a loopback of its own (a network namespace), or ``[]``."""
    if hosts.UNAVAILABLE:
        if taken := [port for port in (*TRIAL_PORTS, LOCAL_SUPERLINK_PORT) if port_taken(port)]:
            pytest.skip(f"port {taken[0]} is taken here and {hosts.UNAVAILABLE}")
        yield []
        return
    name = f"fedapp-docs-{os.getpid()}"
    hosts.ip("netns", "add", name)
    try:
        hosts.ip("-n", name, "link", "set", "lo", "up")
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def fresh_home(tmp_path) -> dict[str, str]:
    """A user's environment on a fresh machine: an empty home, this project's venv first on ``PATH``."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", "FEDAPP_CACHE_DIR")}
    env.update(
        HOME=str(home),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
    )
    return env


@pytest.fixture
def bystander(tmp_path) -> Iterator[subprocess.Popen]:
    """A process that ``pkill -f flower-superlink`` would stop: another user's local SuperLink, by its command line."""
    other = tmp_path / "other-home/.flwr/local-superlink/state.db"
    command = [sys.executable, "-c", "import time; time.sleep(900)", "flower-superlink", "--database", str(other)]
    process = subprocess.Popen(command, start_new_session=True)
    yield process
    process.kill()
    process.wait(timeout=10)


def run_block(block: str, script: Path, cwd: Path, env: dict[str, str], where: list[str], timeout: float = 900):
    """Run ``block`` verbatim with bash (written to ``script``, a bash of its own), in ``cwd``."""
    script.write_text(block)
    return subprocess.run(
        [*where, "bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def copy_app(target: Path) -> Path:
    target.mkdir()
    for name in APP_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.is_file():
            shutil.copy2(source, target / name)
    return target


def test_the_local_trial_runs_twice_as_written_and_its_teardown_stops_only_what_it_started(
    tmp_path, where, fresh_home, bystander
):
    blocks = section_bash_blocks((ROOT / "docs" / "deployment.md").read_text(), TRIAL_HEADING)
    assert len(blocks) == 2, f"the trial section should hold the trial and its teardown, found {len(blocks)} blocks"
    trial, teardown = blocks
    app = copy_app(tmp_path / "app")
    folder = app / "results" / "local-trial"
    started: list[int] = []
    try:
        for attempt in (1, 2):
            done = run_block(trial, tmp_path / f"trial-{attempt}.sh", app, fresh_home, where)
            if (folder / "pids").exists():
                recorded = [int(pid) for pid in (folder / "pids").read_text().split()]
                started += [pid for pid in recorded if pid not in started]
            logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(folder.glob("*.log")))
            assert done.returncode == 0, f"run {attempt}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{logs}"
            config = tomllib.loads((folder / "flwr-home" / "config.toml").read_text())
            assert config["superlink"]["local-trial"] == {"address": "127.0.0.1:9092", "insecure": True}
            runs = sorted((folder / "runs").iterdir())
            assert len(runs) == attempt, runs
            assert [row["round"] for row in read_metrics(runs[-1] / "metrics.jsonl")] == [1, 2]
            assert (runs[-1] / "summary.json").is_file()
        # The second run reused the federation the first one started.
        assert len(started) == 3 and all(alive(pid) for pid in started), started
        assert not (Path(fresh_home["HOME"]) / ".flwr").exists(), "the trial wrote into the user's ~/.flwr"
        assert any((folder / "flwr-home").rglob("apps/*")), "the trial's processes installed the app elsewhere"
        tree = descendants(started)

        done = run_block(teardown, tmp_path / "teardown.sh", app, fresh_home, where, timeout=60)
        assert done.returncode == 0, done.stderr
        assert not (folder / "pids").exists()
        assert wait_until_gone(tree) == [], "the teardown left processes the trial started running"
        assert bystander.poll() is None, "the teardown stopped a process the trial did not start"
    finally:
        stop_processes(started)


def test_the_getting_started_stop_command_stops_only_the_local_superlink(tmp_path, where, fresh_home, bystander):
    (stop,) = [b for b in BASH_BLOCK.findall((ROOT / "docs/getting-started.md").read_text()) if "pkill" in b]
    home = Path(fresh_home["HOME"])
    listed = subprocess.run(
        [*where, "flwr", "ls"], env=fresh_home, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )  # any command on the default `local` connection starts Flower's local SuperLink, as `flwr run` does
    found = subprocess.run(["pgrep", "-f", f"flower-superlink .*{home}/"], capture_output=True, text=True, check=False)
    local = [int(pid) for pid in found.stdout.split()]
    try:
        assert listed.returncode == 0 and len(local) == 1, f"{listed.stdout[-2000:]}\n{listed.stderr[-2000:]}"
        tree = descendants(local)
        done = run_block(stop, tmp_path / "stop.sh", tmp_path, fresh_home, where, timeout=60)
        assert done.returncode == 0, done.stderr
        assert wait_until_gone(tree) == [], "the local SuperLink (or its SuperExec) still runs"
        assert bystander.poll() is None, "the command stopped a SuperLink that the user's `flwr run` did not start"
    finally:
        stop_processes(local)


RAY_TRIAL_HEADING = "### Try it on one machine"
ACTIVE_RAY_NODE = re.compile(r"^ 1 node_[0-9a-f]{56}$", re.MULTILINE)  # a line of `ray status`'s "Active:" list
NO_RAY_STATUS_YET = "No cluster status. It may take a few seconds for the Ray internal services to start up."


def client_workers(root: int) -> dict[int, int]:
    """Ray's client workers (``ray::ClientAppActor``) below process ``root``: pid -> parent pid
    (the raylet, one per Ray node, that started it)."""
    workers = {}
    for pid in descendants([root]):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if title.startswith(b"ray::ClientAppActor"):
            workers[pid] = parent
    return workers


def test_the_ray_cluster_trial_runs_as_written_and_spreads_the_clients_over_both_nodes(tmp_path, fresh_home):
    """docs/scale.md: two Ray nodes, a launcher run that joins them (``RAY_ADDRESS``) and ``ray
    stop``, in a process, mount and network namespace of the test's own: ``ray stop`` there stops
    only this cluster, port 6379 is free, and Ray's ``/tmp/ray`` (where ``ray start`` records the
    machine's latest cluster) is a private folder. While it runs, the test watches which Ray node
    (raylet) started each client worker."""
    if hosts.UNAVAILABLE or not shutil.which("unshare"):
        pytest.skip(f"needs root and unshare for a namespace of its own ({hosts.UNAVAILABLE or 'no unshare'})")
    (block,) = section_bash_blocks((ROOT / "docs" / "scale.md").read_text(), RAY_TRIAL_HEADING)
    private_ray_tmp = tmp_path / "ray-tmp"
    private_ray_tmp.mkdir()
    Path("/tmp/ray").mkdir(exist_ok=True)
    script = tmp_path / "ray-trial.sh"
    script.write_text(f"set -e\nip link set lo up\nmount --bind {private_ray_tmp} /tmp/ray\n{block}")
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "ray-trial.log"
    # When the namespace's first process (bash) ends, the kernel ends every process in it.
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "bash", str(script)]
    with log.open("w") as out:
        trial = subprocess.Popen(command, cwd=work, env=fresh_home, stdout=out, stderr=subprocess.STDOUT)
        raylets: set[int] = set()
        deadline = time.monotonic() + 600
        while trial.poll() is None and time.monotonic() < deadline:
            raylets |= set(client_workers(trial.pid).values())
            time.sleep(0.5)
        if trial.poll() is None:
            trial.kill()
        trial.wait(timeout=60)
    text = log.read_text(errors="replace")
    output = text[-6000:]
    assert trial.returncode == 0, output
    # `ray status` reports the monitor's last refresh, which may predate the second node's start,
    # or, on a busy machine, the monitor's first report (the docs say both).
    listed = len(ACTIVE_RAY_NODE.findall(text))
    assert listed in (1, 2) or NO_RAY_STATUS_YET in text, f"`ray status` reported no cluster:\n{output}"
    rows = read_metrics(work / "cluster-results" / "on-two-nodes" / "metrics.jsonl")
    assert [row["clients_fit"] for row in rows] == [10, 10], output
    assert len(raylets) == 2, f"client workers ran under {len(raylets)} Ray node(s), not both:\n{output}"
    assert "Stopped all" in output, output  # `ray stop` found the cluster's processes
