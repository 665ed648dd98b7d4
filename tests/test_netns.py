"""Separate hosts: SuperLink, SuperNodes and the operator's CLI in their own network namespaces.

Each "host" is a Linux network namespace with one veth interface on a bridge in
the SuperLink's namespace (10.77.0.0/24), so every connection crosses a real
network interface and nothing can use another host's loopback. The federation
runs with TLS (a private CA from ``docker/make-certs.sh``) and SuperNode
authentication (keys from ``docker/make-node-keys.sh``, registered with
``flwr supernode register``), exactly as the README's deployment section says.

Needs root (CAP_NET_ADMIN) and iproute2; elsewhere the module is skipped with
the reason. Every process is stopped by PID and every namespace deleted at the
end, pass or fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedapp.launch import stop_processes
from tests.federation import BIN, ROOT, Processes, connection_toml, flower_env, flwr, run_app, run_metrics, wait_for

pytestmark = pytest.mark.slow

SUBNET = "10.77.0"
HOSTS = {"superlink": 1, "node-0": 2, "node-1": 3, "operator": 9}
LINK_ADDRESS = f"{SUBNET}.{HOSTS['superlink']}:9092"


def _namespaces_unavailable() -> str | None:
    if os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    for tool in ("ip", "openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"fedapp-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


_REASON = _namespaces_unavailable()
if _REASON:
    pytestmark = [pytest.mark.slow, pytest.mark.skip(reason=_REASON)]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Network:
    """Namespaces joined by veth pairs to a bridge in the SuperLink's namespace."""

    def __init__(self, tag: str) -> None:
        self.names = {host: f"fedapp-{tag}-{host}" for host in HOSTS}
        self.made: list[str] = []

    def build(self) -> None:
        for name in self.names.values():
            ip("netns", "add", name)
            self.made.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        hub = self.names["superlink"]
        ip("-n", hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hub, "addr", "add", f"{SUBNET}.{HOSTS['superlink']}/24", "dev", "br0")
        ip("-n", hub, "link", "set", "br0", "up")
        for index, (host, octet) in enumerate(HOSTS.items()):
            if host == "superlink":
                continue
            port, name = f"port{index}", self.names[host]
            ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name)
            ip("-n", hub, "link", "set", port, "master", "br0", "up")
            ip("-n", name, "addr", "add", f"{SUBNET}.{octet}/24", "dev", "eth0")
            ip("-n", name, "link", "set", "eth0", "up")

    def on(self, host: str, *command: str) -> list[str]:
        """``command`` run on ``host`` (inside its namespace)."""
        return ["ip", "netns", "exec", self.names[host], *command]

    def destroy(self) -> None:
        for name in self.made:
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
            stop_processes([int(pid) for pid in pids.stdout.split()], timeout=5)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        self.made.clear()


@dataclass
class Federation:
    net: Network
    processes: Processes
    root: Path
    certs: Path
    keys: Path
    operator_env: dict[str, str]
    superlink_command: list[str]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return flwr(args, self.operator_env, self.net.on("operator"), timeout)

    def nodes(self) -> list[dict]:
        listed = self.cli("supernode", "list", "--format", "json")
        if listed.returncode != 0:
            return []
        return json.loads(listed.stdout[listed.stdout.index("{") :])["nodes"]

    def online(self) -> int:
        return sum(node["status"] == "online" for node in self.nodes())

    def start_supernode(self, name: str, host: str, key: str, node_config: str, *extra: str, port: int = 9094):
        command = [
            str(BIN / "flower-supernode"),
            "--superlink",
            LINK_ADDRESS,
            "--auth-supernode-private-key",
            str(self.keys / key),
            "--port",
            str(port),
            "--node-config",
            node_config,
            *extra,
        ]
        env = flower_env(self.root / f"home-{name}")
        return self.processes.start(name, self.net.on(host, *command), env)

    def start_superlink(self) -> None:
        self.processes.start("superlink", self.net.on("superlink", *self.superlink_command))
        wait_for(lambda: self.cli("supernode", "list").returncode == 0, "the SuperLink answering over TLS", 90, 1.0)

    def run(self, run_config: str, timeout: float = 400) -> subprocess.CompletedProcess:
        return run_app("fed", run_config, self.operator_env, self.net.on("operator"), timeout)


def node_config(federation: Federation, partition: int) -> str:
    state = federation.root / f"state-node-{partition}"
    return f'partition-id={partition} num-partitions=2 state-dir="{state}"'


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("netns")
    certs, keys = root / "certs", root / "keys"
    subprocess.run(["bash", str(ROOT / "docker/make-certs.sh"), str(certs), f"IP:{SUBNET}.1"], check=True)
    node_keys = ["node-0", "node-1", "rogue", "spare"]
    subprocess.run(["bash", str(ROOT / "docker/make-node-keys.sh"), str(keys), *node_keys], check=True)
    net = Network(str(os.getpid()))
    processes = Processes(root / "logs", flower_env(root / "home-superlink"))
    operator_env = flower_env(root / "home-operator")
    (root / "home-operator/config.toml").write_text(connection_toml("fed", LINK_ADDRESS, certs / "ca.crt"))
    superlink = [
        str(BIN / "flower-superlink"),
        "--ssl-ca-certfile",
        str(certs / "ca.crt"),
        "--ssl-certfile",
        str(certs / "server.pem"),
        "--ssl-keyfile",
        str(certs / "server.key"),
        "--enable-supernode-auth",
        "--host",
        "0.0.0.0",
        "--port",
        "9092",
        "--database",
        str(root / "superlink.db"),
    ]
    fed = Federation(net, processes, root, certs, keys, operator_env, superlink)
    try:
        net.build()
        fed.start_superlink()
        # "rogue" is never registered; "spare" is, but its node has no CA certificate.
        for key in ("node-0", "node-1", "spare"):
            registered = fed.cli("supernode", "register", str(keys / f"{key}.pub"))
            assert registered.returncode == 0, registered.stdout + registered.stderr
        for partition in range(2):
            host = f"node-{partition}"
            fed.start_supernode(
                host, host, host, node_config(fed, partition), "--root-certificates", str(certs / "ca.crt")
            )
        wait_for(lambda: fed.online() == 2, "both SuperNodes online", 90, 1.0)
        yield fed
    finally:
        processes.stop_all()
        net.destroy()


def test_hosts_are_separate(federation):
    """A node reaches the SuperLink only over the bridge: its loopback has no SuperLink."""
    probe = "import socket,sys; s=socket.socket(); s.settimeout(2); sys.exit(s.connect_ex((sys.argv[1], 9092)))"
    python = str(BIN / "python")
    assert subprocess.run(federation.net.on("node-0", python, "-c", probe, f"{SUBNET}.1"), check=False).returncode == 0
    assert subprocess.run(federation.net.on("node-0", python, "-c", probe, "127.0.0.1"), check=False).returncode != 0


def wait_exit(process: subprocess.Popen, timeout: float = 90) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the SuperNode (pid {process.pid}) was still running after {timeout}s")


def test_unregistered_node_is_refused(federation):
    before = {node["node-id"] for node in federation.nodes()}
    process = federation.start_supernode(
        "rogue", "node-1", "rogue", node_config(federation, 1), "--root-certificates",
        str(federation.certs / "ca.crt"), "--max-retries", "1", port=9095,
    )  # fmt: skip
    assert wait_exit(process) != 0
    assert "Failed to activate SuperNode" in federation.processes.log("rogue")
    assert {node["node-id"] for node in federation.nodes()} == before
    assert federation.online() == 2


def test_node_without_ca_certificate_cannot_connect(federation):
    # The key is registered: only the missing CA certificate stands in the way.
    process = federation.start_supernode(
        "no-ca", "node-1", "spare", node_config(federation, 1), "--max-retries", "1", port=9096
    )
    assert wait_exit(process) != 0
    assert "CERTIFICATE_VERIFY_FAILED" in federation.processes.log("no-ca")
    spare = [node for node in federation.nodes() if node["status"] != "online"]
    assert len(spare) == 1 and spare[0]["status"] == "registered"


def test_cli_without_ca_certificate_cannot_connect(federation):
    home = federation.root / "home-stranger"
    env = flower_env(home)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "fed"\n\n[superlink.fed]\naddress = "{LINK_ADDRESS}"\n')
    listed = flwr(["supernode", "list"], env, federation.net.on("operator"), timeout=60)
    assert listed.returncode != 0
    assert "online" not in listed.stdout


VIT = 'clip-model="fedapp-tiny-vit" prompt-length=2 shots-per-class=8'


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("pfedlora", 'state="disk"'),  # family A, personal models under each node's state-dir
        ("sdfed", 'shots-per-class=8 local-prompt-lengths="4,16"'),  # family B
        ("fedd2p", 'client-models="vgg-2,vgg-3" d2p-steps=5 shots-per-class=8'),  # family C
        ("pep-fedpt", VIT),  # family D
    ],
)
def test_two_rounds_across_hosts(federation, method, extra):
    results = federation.root / "results"
    run_name = f"netns-{method}"
    config = f'method="{method}" num-rounds=2 num-partitions=2 {extra} results-dir="{results}" run-name="{run_name}"'
    rows = run_metrics(results, run_name, federation.run(config), federation.processes)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["clients_fit"] == 2 and r["clients_evaluated"] == 2 for r in rows)
    if method == "pfedlora":
        for partition in range(2):
            saved = federation.root / f"state-node-{partition}" / run_name / f"partition-{partition}"
            assert sorted(p.name for p in saved.glob("*.npz")), f"no personal state in {saved}"


def test_supernode_survives_superlink_restart(federation):
    """The SuperLink goes down between two runs; the same SuperNode processes reconnect
    and the second run continues each client's personal model from its state-dir."""
    results = federation.root / "results-restart"
    config = 'method="standalone" num-rounds=1 num-partitions=2 state="disk" run-name="restart" results-dir="{}"'
    nodes = {name: federation.processes.started[name] for name in ("node-0", "node-1")}
    first = run_metrics(results / "a", "restart", federation.run(config.format(results / "a")), federation.processes)
    assert [r["fit_personal_rounds"] for r in first] == [1.0]

    federation.processes.stop("superlink")
    reconnects = {name: federation.processes.log(name).count("Connection successful") for name in nodes}
    time.sleep(3)  # the nodes notice and start retrying
    federation.start_superlink()
    wait_for(
        lambda: all(federation.processes.log(n).count("Connection successful") > reconnects[n] for n in nodes),
        "both SuperNodes reconnecting",
        120,
        1.0,
    )
    assert all(process.poll() is None for process in nodes.values()), "a SuperNode process exited"

    second = run_metrics(results / "b", "restart", federation.run(config.format(results / "b")), federation.processes)
    assert [r["fit_personal_rounds"] for r in second] == [2.0]  # trained on from round 1, not from scratch
    assert all(process.poll() is None for process in nodes.values())
