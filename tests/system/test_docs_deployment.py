"""docs/deployment.md's "Across machines" steps and its "Stopping" commands, and docs/edge.md's
systemd command, run as written on four fresh hosts: the server ``link.example.org``
(10.0.0.1), two devices and the operator's workstation.

Each host is a network namespace on a bridge, at the addresses the docs use, with a mount
namespace of its own in which ``/etc``, ``/home``, ``/opt``, ``/root`` and ``/var`` are
copy-on-write layers over this machine's, empty at the start: whatever a step writes
(credentials, the ``/etc/hosts`` line, ``/var/lib/fedapp``, ``~/.flwr``) stays in that host's
layer, and nothing on this machine changes. The test does only what an operator does between
the documented commands: creates the operator's account, copies each file to the host the
docs' table names (as ``scp`` would), adds the documented ``/etc/hosts`` line, installs the
project where the systemd unit expects it, and fills in the ids ``flwr ls`` and ``flwr
supernode list`` print. A documented step that stops working fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedapp.launch import stop_processes
from fedapp.metrics import read_metrics
from tests.paths import ROOT
from tests.system import netns as hosts
from tests.system.federation import TASK_POLL_INTERVAL, wait_for
from tests.system.test_docs_trial import section_bash_blocks

pytestmark = pytest.mark.skipif(bool(hosts.UNAVAILABLE), reason=str(hosts.UNAVAILABLE))

DEPLOYMENT = (ROOT / "docs/deployment.md").read_text()
EDGE = (ROOT / "docs/edge.md").read_text()
ACROSS = "## Across machines: TLS and authenticated SuperNodes"
VENV = Path(sys.prefix)
# The host folders a step may write; each host sees this machine's under a layer of its own.
LAYERED = ("/etc", "/home", "/opt", "/root", "/var")
OVERLAY = """set -e
for d in {dirs}; do
  mkdir -p "{layer}/upper$d" "{layer}/work$d"
  mount -t overlay overlay -o "lowerdir=$d,upperdir={layer}/upper$d,workdir={layer}/work$d" "$d"
done
echo ready
exec sleep infinity
"""


@dataclass
class Host:
    """One machine: a network namespace and a mount namespace (held by a ``sleep``) with its own layers."""

    name: str
    netns: str
    layer: Path
    home: str
    holder: subprocess.Popen
    logs: Path
    started: dict[str, subprocess.Popen] = field(default_factory=dict)

    def written(self, path: str) -> Path:
        """Where a file this host wrote at ``path`` lies, seen from outside (its layer)."""
        return self.layer / "upper" / path.lstrip("/")

    def env(self, **extra: str) -> dict[str, str]:
        """A login's environment on this host: the project's venv on ``PATH``, as the docs set it up."""
        kept = {k: v for k, v in os.environ.items() if not k.startswith(("FLWR_", "FEDAPP_", "XDG_", "RAY_"))}
        return {
            **kept,
            "HOME": self.home,
            "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # "set ... on all of them"
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": TASK_POLL_INTERVAL,
            **extra,
        }

    def bash(self, script: str, cwd: str | None) -> list[str]:
        """``script`` run by a bash of its own on this host, in ``cwd`` (default: the home folder).
        The ``cd`` happens inside: nsenter's ``--wd`` would resolve the folder on this machine."""
        enter = ["nsenter", "-t", str(self.holder.pid), "-m", "-n", "--"]
        return [*enter, "bash", "-c", 'cd "$1" && exec bash -c "$2"', "bash", cwd or self.home, script]

    def sh(self, script: str, cwd: str | None = None, stdin: bytes | None = None, timeout: float = 300):
        """Run ``script`` with bash on this host and wait for it."""
        done = subprocess.run(
            self.bash(script, cwd),
            env=self.env(),
            input=stdin,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())

    def start(self, name: str, script: str, cwd: str | None = None, **env: str) -> subprocess.Popen:
        """Start ``script`` in the background (a service), logging to ``<logs>/<name>.log``."""
        with (self.logs / f"{name}.log").open("w") as out:
            process = subprocess.Popen(
                self.bash(script, cwd),
                env=self.env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self, name: str) -> None:
        process = self.started.pop(name)
        stop_processes([process.pid])
        process.wait(timeout=15)

    def receive(self, data: bytes, path: str, mode: str) -> None:
        """``data`` copied to ``path`` on this host, as ``scp`` then ``chmod`` would."""
        folder = os.path.dirname(path)
        copied = self.sh(f'mkdir -p "{folder}" && cat > "{path}" && chmod {mode} "{path}"', stdin=data)
        assert copied.returncode == 0, copied.stderr


@pytest.fixture(scope="module")
def machines(tmp_path_factory) -> Iterator[dict[str, Host]]:
    root = tmp_path_factory.mktemp("docs-deployment")
    server_name, server_ip = re.search(r"a server `([\w.-]+)` \((\d+\.\d+\.\d+\.\d+)\)", DEPLOYMENT).groups()
    assert (server_name, server_ip) == ("link.example.org", "10.0.0.1")
    net = hosts.Network(f"d{os.getpid()}", "10.0.0", {"server": 1, "device-0": 2, "device-1": 3, "operator": 9})
    homes = {"server": "/root", "device-0": "/root", "device-1": "/root", "operator": "/home/operator"}
    machines: dict[str, Host] = {}
    try:
        net.build()
        for name, netns in net.names.items():
            layer = root / name
            script = OVERLAY.format(dirs=" ".join(LAYERED), layer=layer)
            holder = subprocess.Popen(
                net.on(name, "bash", "-c", script), stdout=subprocess.PIPE, text=True, start_new_session=True
            )
            assert holder.stdout.readline().strip() == "ready", f"{name}: the overlays did not mount"
            (root / "logs").mkdir(exist_ok=True)
            machines[name] = Host(name, netns, layer, homes[name], holder, root / "logs")
        # The operator's account exists on a workstation; everything else starts empty.
        assert machines["operator"].sh("mkdir -p /home/operator", cwd="/").returncode == 0
        yield machines
    finally:
        for machine in machines.values():
            stop_processes([process.pid for process in machine.started.values()], timeout=5)
        net.destroy()


def documented_blocks() -> dict[str, str]:
    """The section's bash blocks by step, and its TOML block."""
    blocks = section_bash_blocks(DEPLOYMENT, ACROSS)
    assert len(blocks) == 6, f"the section's bash blocks changed: {len(blocks)}"
    steps = dict(zip(("credentials", "superlink", "register", "supernode", "run", "stopping"), blocks, strict=True))
    assert "make-certs.sh" in steps["credentials"] and "flower-superlink" in steps["superlink"]
    assert "flwr stop" in steps["stopping"]
    [toml] = re.findall(r"^```toml\n(.*?)^```", DEPLOYMENT[DEPLOYMENT.index(ACROSS) :], re.MULTILINE | re.DOTALL)[:1]
    steps["toml"] = toml
    return steps


def hosts_line() -> str:
    """The ``/etc/hosts`` line the docs tell every machine to have."""
    found = re.search(r"a line `([^`]+)` in each\s+machine's `/etc/hosts`", DEPLOYMENT)
    assert found, "docs/deployment.md no longer says which /etc/hosts line every machine needs"
    return " ".join(found.group(1).split())


def edge_exec_start() -> str:
    """The command docs/edge.md's systemd unit starts (``ExecStart=``)."""
    found = re.search(r"`ExecStart=([^`]+)`", EDGE)
    assert found, "docs/edge.md no longer shows the systemd unit's ExecStart"
    return found.group(1)


def nodes(operator: Host) -> list[dict]:
    listed = operator.sh("flwr supernode list fed --format json")
    if listed.returncode != 0 or "{" not in listed.stdout:
        return []
    return json.loads(listed.stdout[listed.stdout.index("{") :])["nodes"]


def metric_rows(server: Host, run_name: str) -> list[dict]:
    path = server.written(f"/var/lib/fedapp/results/{run_name}/metrics.jsonl")
    return read_metrics(path) if path.exists() else []


def test_the_documented_deployment_runs_as_written_on_fresh_hosts(machines):
    """Credentials, SuperLink, registration, two SuperNodes (one as the docs' step 4, one as
    edge.md's systemd unit), a pFedLoRA run stopped after its first round and resumed to the
    end, then the "Stopping" commands: retire a key, stop the services by PID, and what stays."""
    steps = documented_blocks()
    operator, server = machines["operator"], machines["server"]
    devices = [machines["device-0"], machines["device-1"]]
    line = hosts_line()
    for machine in (operator, *devices):
        assert machine.sh(f'echo "{line}" >> /etc/hosts', cwd="/").returncode == 0

    # 1. Credentials, on the operator's machine, from the project's folder.
    made = operator.sh(steps["credentials"], cwd=str(ROOT))
    assert made.returncode == 0, made.stdout + made.stderr
    credentials = operator.written("/home/operator/fedapp-credentials")
    assert (credentials / "certs/ca.key").is_file() and not (credentials / "keys/ca.key").exists()

    def send(name: str, machine: Host, path: str, mode: str = "644") -> None:
        machine.receive((credentials / name).read_bytes(), path, mode)

    # Which file goes where (the docs' table).
    for name in ("ca.crt", "server.pem", "server.key"):
        send(f"certs/{name}", server, f"/root/certs/{name}", "600" if name.endswith(".key") else "644")
    send("certs/ca.crt", devices[0], "/root/ca.crt")
    send("keys/node-0", devices[0], "/root/node-0", "600")
    send("certs/ca.crt", devices[1], "/etc/fedapp/ca.crt")  # the systemd unit's paths
    send("keys/node-1", devices[1], "/etc/fedapp/node.key", "600")

    # 2. The SuperLink, on a server where /var/lib/fedapp does not exist yet.
    assert not server.written("/var/lib/fedapp").exists()
    server.start("superlink", steps["superlink"])
    # 3. The operator's connection (the TOML as written, at the path its comment names) and registration.
    toml_path = steps["toml"].splitlines()[0].removeprefix("# ").split(" ")[0].replace("~", operator.home)
    operator.receive(steps["toml"].encode(), toml_path, "644")
    wait_for(lambda: operator.sh("flwr supernode list fed").returncode == 0, "the SuperLink answering", 90, 1.0)
    registered = operator.sh(steps["register"])
    assert registered.returncode == 0, registered.stdout + registered.stderr
    assert registered.stdout.count("registered") >= 2, registered.stdout

    # 4. The SuperNodes: device 0 as the step says, device 1 as edge.md's unit (the project installed
    # under /opt/fedapp, its own partition).
    devices[0].start("supernode-0", steps["supernode"])
    assert devices[1].sh(f"mkdir -p /opt/fedapp && ln -s {VENV} /opt/fedapp/.venv", cwd="/").returncode == 0
    unit = edge_exec_start().replace("partition-id=0", "partition-id=1")
    devices[1].start("supernode-1", unit, cwd="/", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    wait_for(lambda: sum(n["status"] == "online" for n in nodes(operator)) == 2, "both SuperNodes online", 120, 1.0)

    # 5. The run, stopped once its first round is in, then resumed as "Stopping" says.
    run = steps["run"].strip()
    run_name = re.search(r'run-name="([\w-]+)"', run).group(1)
    first = operator.start("run", run, cwd=str(ROOT))
    wait_for(lambda: len(metric_rows(server, run_name)) >= 1, "the run's first round", 300, 0.2)
    stopping = [command.split("#")[0].strip() for command in steps["stopping"].strip().splitlines()]
    assert operator.sh(stopping[0]).returncode == 0  # flwr ls fed: a table

    def runs() -> list[dict]:
        listed = operator.sh(stopping[1]).stdout  # flwr ls fed --format json
        return json.loads(listed[listed.index("{") :])["runs"]

    [submitted] = runs()
    run_id = str(submitted["run-id"])
    stopped = operator.sh(stopping[2].replace("<run-id>", run_id))
    assert stopped.returncode == 0 and f"Run {run_id} successfully stopped" in stopped.stdout, stopped.stdout
    assert [run["status"] for run in runs()] == ["finished:stopped"]
    first.wait(timeout=120)
    done = len(metric_rows(server, run_name))
    assert done == 1 and server.written(f"/var/lib/fedapp/results/{run_name}/checkpoint.npz").is_file()
    resume = run[: run.rindex("'")] + " resume=true'"
    resumed = operator.sh(resume, cwd=str(ROOT), timeout=600)  # right after the stop, as an operator would
    (operator.logs / "resumed-run.log").write_text(resumed.stdout + resumed.stderr)
    rows = metric_rows(server, run_name)
    assert [r["round"] for r in rows] == [1, 2], resumed.stdout[-3000:] + server.log("superlink")[-3000:]
    assert all(r["clients_fit"] == 2 and not r["fit_missing_clients"] for r in rows)
    for partition, device in enumerate(devices):
        state = device.written(f"/var/lib/fedapp/state/{run_name}/partition-{partition}")
        assert sorted(state.glob("*.safetensors")), f"no personal state on device {partition} under {state}"

    # Retire device 1's key: its node, started again as the unit would, is refused from then on.
    assert operator.sh(stopping[3]).returncode == 0  # flwr supernode list fed
    node_id = re.search(r"SuperNode ID: (\d+)", devices[1].log("supernode-1")).group(1)
    unregistered = operator.sh(stopping[4].replace("<node-id>", node_id))
    assert unregistered.returncode == 0, unregistered.stdout + unregistered.stderr
    assert {str(n["node-id"]): n["status"] for n in nodes(operator)}[node_id] == "unregistered"
    devices[1].stop("supernode-1")
    again = devices[1].start("supernode-1-again", unit + " --max-retries 1", cwd="/")
    assert again.wait(timeout=120) != 0
    assert "Failed to activate SuperNode" in devices[1].log("supernode-1-again")

    # Stop the services by PID: the SuperNodes first, then the SuperLink.
    devices[0].stop("supernode-0")
    server.stop("superlink")
    # What stays: the SuperLink's database, the run folder, each node's personal state.
    assert server.written("/var/lib/fedapp/superlink.db").stat().st_size > 0
    assert {p.name for p in server.written(f"/var/lib/fedapp/results/{run_name}").iterdir()} >= {
        "metrics.jsonl",
        "checkpoint.npz",
        "summary.json",
    }
