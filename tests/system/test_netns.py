"""Separate hosts: SuperLink, SuperNodes and the operator's CLI in their own network namespaces.

The federation (TLS, authenticated SuperNodes; :mod:`tests.system.netns`) is
built once for the tier. The first run of the restart test is submitted before
the first test looks at it; the SuperLink is restarted only after it has ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.system.federation import BIN, flower_env, flwr, run_metrics, wait_for
from tests.system.netns import LINK_ADDRESS, SUBNET, node_config

# The methods' runs over real processes are test_deployment.py's (every family's client, Message API),
# test_lean_supernode.py's (FedD2P, legacy API) and test_docs_deployment.py's (pFedLoRA, legacy API, on
# fresh hosts across namespaces with TLS, as docs/deployment.md writes it). Here: what the transport,
# the SuperLink and the SuperNodes do across hosts, whatever the method: refusals, a hard-killed node
# rejoining (FedAvg), a SuperLink restart under a run with personal state on disk (Standalone).
RESTART = 'method="standalone" num-rounds=1 num-partitions=2 state="disk" run-name="restart" results-dir="{}"'


@pytest.fixture(scope="module")
def runs(netns):
    """The restart test's first run, in flight from the module's first test on."""
    return {"restart-a": netns.submit(RESTART.format(netns.root / "results-restart" / "a"))}


def test_hosts_are_separate(netns, runs):
    """A node reaches the SuperLink only over the bridge: its loopback has no SuperLink."""
    probe = "import socket,sys; s=socket.socket(); s.settimeout(2); sys.exit(s.connect_ex((sys.argv[1], 9092)))"
    python = str(BIN / "python")
    assert subprocess.run(netns.net.on("node-0", python, "-c", probe, f"{SUBNET}.1"), check=False).returncode == 0
    assert subprocess.run(netns.net.on("node-0", python, "-c", probe, "127.0.0.1"), check=False).returncode != 0


def wait_exit(process: subprocess.Popen, timeout: float = 90) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the SuperNode (pid {process.pid}) was still running after {timeout}s")


def trusted_node(netns, name: str, key: str, *extra: str, port: int = 9094) -> subprocess.Popen:
    """A SuperNode on host node-1 that trusts the CA and presents ``key``."""
    trust = ("--root-certificates", str(netns.certs / "ca.crt"))
    return netns.start_supernode(name, "node-1", key, node_config(netns, 1), *trust, *extra, port=port)


def assert_refused(netns, name: str, key: str, port: int) -> None:
    """A node presenting ``key`` (and giving up after one try) is refused by the SuperLink and exits."""
    assert wait_exit(trusted_node(netns, name, key, "--max-retries", "1", port=port)) != 0
    assert "Failed to activate SuperNode" in netns.processes.log(name)


def test_unregistered_node_is_refused(netns):
    before = {node["node-id"] for node in netns.nodes()}
    assert_refused(netns, "rogue", "rogue", port=9095)
    assert {node["node-id"] for node in netns.nodes()} == before
    assert netns.online() == 2


def test_node_without_ca_certificate_cannot_connect(netns):
    # The key is registered: only the missing CA certificate stands in the way.
    process = netns.start_supernode("no-ca", "node-1", "spare", node_config(netns, 1), "--max-retries", "1", port=9096)
    assert wait_exit(process) != 0
    assert "CERTIFICATE_VERIFY_FAILED" in netns.processes.log("no-ca")
    spare = [node for node in netns.nodes() if node["status"] != "online"]
    assert len(spare) == 1 and spare[0]["status"] == "registered"


def test_cli_without_ca_certificate_cannot_connect(netns):
    home = netns.root / "home-stranger"
    env = flower_env(home)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "fed"\n\n[superlink.fed]\naddress = "{LINK_ADDRESS}"\n')
    listed = flwr(["supernode", "list"], env, netns.net.on("operator"), timeout=60)
    assert listed.returncode != 0
    assert "online" not in listed.stdout
    # What docs/deployment.md tells the operator to expect (not the TLS error's name).
    assert "Connection to the SuperLink is unavailable" in listed.stdout + listed.stderr, listed.stdout


def _rejoined(netns, since_kill: float) -> bool:
    """Both nodes online, one of them activated after the kill (the dead one stays listed as
    online, with its old activation time, until its heartbeat lapses)."""
    online = [node for node in netns.nodes() if node["status"] == "online"]
    return len(online) == 2 and any(float(node["online-elapsed"]) < since_kill for node in online)


def test_a_hard_killed_supernode_rejoins_and_the_next_round_aggregates_both_nodes(netns, runs):
    """Power loss on a device: its SuperNode is killed (SIGKILL, no goodbye) and started again
    as docs/edge.md's systemd unit does (refused and restarted until the SuperLink lets it in).
    The SuperLink counts the dead node online until its heartbeat lapses, so the time to rejoin
    is Flower's (about two 30 s heartbeat intervals); then a round with min-clients = 2 uses both."""
    for name in ("node-0", "node-1"):  # nothing of this module's may be in flight on the nodes
        assert name in netns.processes.started
    netns.queue.drain()
    killed = netns.processes.started.pop("node-1")
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=10)
    started, attempts = time.monotonic(), 0
    process = None
    while time.monotonic() - started < 240 and not _rejoined(netns, time.monotonic() - started):
        if process is None or process.poll() is not None:  # refused, it exited: the unit starts it again
            if process is not None:
                assert "Failed to activate SuperNode" in netns.processes.log("node-1"), netns.processes.log("node-1")
                time.sleep(5)  # RestartSec
            attempts += 1
            process = trusted_node(netns, "node-1", "node-1")  # as the unit starts it: no --max-retries
        time.sleep(1)
    rejoined = time.monotonic() - started
    assert _rejoined(netns, rejoined), f"node-1 did not rejoin within {rejoined:.0f}s ({attempts} starts)"
    # The measured time to rejoin, kept with the tier's files (docs/edge.md quotes it).
    (netns.root / "rejoin.txt").write_text(f"rejoined after {rejoined:.0f}s ({attempts} starts)\n")
    results = netns.root / "results-rejoin"
    config = f'method="fedavg" num-partitions=2 num-rounds=1 min-clients=2 run-name="rejoin" results-dir="{results}"'
    [row] = run_metrics(results, "rejoin", netns.run(config), netns.processes)
    assert row["clients_fit"] == 2 and not row["round_skipped"] and row["fit_missing_clients"] == []


def test_supernode_survives_superlink_restart(netns, runs):
    """The SuperLink goes down after a run's first round; the same SuperNode processes
    reconnect and the resumed run's second round continues each client's personal model
    from its state-dir (the same run: its token is in the checkpoint)."""
    results = netns.root / "results-restart"
    nodes = {name: netns.processes.started[name] for name in ("node-0", "node-1")}
    first = run_metrics(results / "a", "restart", runs["restart-a"].result(), netns.processes)
    assert [r["fit_personal_rounds"] for r in first] == [1.0]
    netns.queue.drain()  # nothing may be in flight when the SuperLink goes down

    netns.processes.stop("superlink")
    reconnects = {name: netns.processes.log(name).count("Connection successful") for name in nodes}
    time.sleep(3)  # the nodes notice and start retrying
    netns.start_superlink()
    wait_for(
        lambda: all(netns.processes.log(n).count("Connection successful") > reconnects[n] for n in nodes),
        "both SuperNodes reconnecting",
        120,
        1.0,
    )
    assert all(process.poll() is None for process in nodes.values()), "a SuperNode process exited"

    resumed = RESTART.replace("num-rounds=1", "num-rounds=2").format(results / "a") + " resume=true"
    second = run_metrics(results / "a", "restart", netns.run(resumed), netns.processes)
    assert [r["fit_personal_rounds"] for r in second] == [1.0, 2.0]  # round 2 trained on from round 1
    assert all(process.poll() is None for process in nodes.values())
