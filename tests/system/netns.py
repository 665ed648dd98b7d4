"""Separate hosts: SuperLink, SuperNodes and the operator's CLI in their own network namespaces.

Each "host" is a Linux network namespace with one veth interface on a bridge in
the SuperLink's namespace (10.77.0.0/24), so every connection crosses a real
network interface and nothing can use another host's loopback. The federation
runs with TLS (a private CA from ``docker/make-certs.sh``) and SuperNode
authentication (keys from ``docker/make-node-keys.sh``, registered with
``flwr supernode register``), exactly as docs/deployment.md says.

Needs root (CAP_NET_ADMIN) and iproute2; elsewhere :data:`UNAVAILABLE` says why
and the tests that need the hosts are skipped with it. Every process is stopped
by PID and every namespace deleted at the end, pass or fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fedapp.launch import stop_processes
from tests.paths import ROOT
from tests.system.federation import BIN, Processes, RunQueue, connection_toml, flower_env, flwr, run_app, wait_for

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


UNAVAILABLE = _namespaces_unavailable()


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Network:
    """Namespaces joined by veth pairs to a bridge in the first host's (the SuperLink's) namespace.

    ``hosts`` maps each host to the last octet of its address in ``subnet`` (a /24).
    """

    def __init__(self, tag: str, subnet: str = SUBNET, hosts: dict[str, int] | None = None) -> None:
        self.hosts = dict(hosts or HOSTS)
        self.subnet = subnet
        self.names = {host: f"fedapp-{tag}-{host}" for host in self.hosts}
        self.made: list[str] = []

    def build(self) -> None:
        for name in self.names.values():
            ip("netns", "add", name)
            self.made.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        [(server, server_octet), *others] = self.hosts.items()
        hub = self.names[server]
        ip("-n", hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hub, "addr", "add", f"{self.subnet}.{server_octet}/24", "dev", "br0")
        ip("-n", hub, "link", "set", "br0", "up")
        for index, (host, octet) in enumerate(others, start=1):
            port, name = f"port{index}", self.names[host]
            ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name)
            ip("-n", hub, "link", "set", port, "master", "br0", "up")
            ip("-n", name, "addr", "add", f"{self.subnet}.{octet}/24", "dev", "eth0")
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
    queue: RunQueue = field(init=False)

    def __post_init__(self) -> None:
        self.queue = RunQueue(self.run)

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

    def run(self, run_config: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return run_app("fed", run_config, self.operator_env, self.net.on("operator"), timeout)

    def submit(self, run_config: str):
        """Put a run in flight; the future's result is the finished ``flwr run``."""
        return self.queue.submit(run_config)


def node_config(federation: Federation, partition: int) -> str:
    state = federation.root / f"state-node-{partition}"
    return f'partition-id={partition} num-partitions=2 state-dir="{state}"'


def federation(root: Path):
    """Build the hosts, start the federation in them and yield it; tear everything down after."""
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
        fed.queue.drain()
        fed.queue.close()
        processes.stop_all()
        net.destroy()
