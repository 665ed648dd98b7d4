"""Separate hosts: SuperLink, SuperNodes and the operator's CLI in their own network namespaces.

The federation (TLS, authenticated SuperNodes; :mod:`tests.system.netns`) is
built once for the tier. Every method run and the first run of the restart
test are submitted before the first test looks at one; the SuperLink is
restarted only after all of them have ended.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.system.federation import BIN, flower_env, flwr, run_metrics, wait_for
from tests.system.netns import LINK_ADDRESS, SUBNET, node_config

VIT = 'clip-model="fedapp-tiny-vit" prompt-length=2 shots-per-class=8'

CASES = {
    "pfedlora": 'state="disk"',  # family B, personal models under each node's state-dir
    "sdfed": 'shots-per-class=8 local-prompt-lengths="4,16"',  # family A
    "fedd2p": 'client-models="vgg-2,vgg-3" d2p-steps=5 shots-per-class=8',  # family C
    "pep-fedpt": VIT,  # family D
}
RESTART = 'method="standalone" num-rounds=1 num-partitions=2 state="disk" run-name="restart" results-dir="{}"'


@pytest.fixture(scope="module")
def runs(netns):
    """Every run this module checks, in flight from the module's first test on."""
    results = netns.root / "results"
    submitted = {}
    for method, extra in CASES.items():
        where = f'results-dir="{results}" run-name="netns-{method}"'
        submitted[method] = netns.submit(f'method="{method}" num-rounds=2 num-partitions=2 {extra} {where}')
    submitted["restart-a"] = netns.submit(RESTART.format(netns.root / "results-restart" / "a"))
    return submitted


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


def test_unregistered_node_is_refused(netns):
    before = {node["node-id"] for node in netns.nodes()}
    process = netns.start_supernode(
        "rogue", "node-1", "rogue", node_config(netns, 1), "--root-certificates",
        str(netns.certs / "ca.crt"), "--max-retries", "1", port=9095,
    )  # fmt: skip
    assert wait_exit(process) != 0
    assert "Failed to activate SuperNode" in netns.processes.log("rogue")
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


@pytest.mark.parametrize("method", CASES)
def test_two_rounds_across_hosts(netns, runs, method):
    results = netns.root / "results"
    run_name = f"netns-{method}"
    rows = run_metrics(results, run_name, runs[method].result(), netns.processes)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["clients_fit"] == 2 and r["clients_evaluated"] == 2 for r in rows)
    if method == "pfedlora":
        for partition in range(2):
            saved = netns.root / f"state-node-{partition}" / run_name / f"partition-{partition}"
            assert sorted(p.name for p in saved.glob("*.npz")), f"no personal state in {saved}"


def test_supernode_survives_superlink_restart(netns, runs):
    """The SuperLink goes down between two runs; the same SuperNode processes reconnect
    and the second run continues each client's personal model from its state-dir."""
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

    second = run_metrics(results / "b", "restart", netns.run(RESTART.format(results / "b")), netns.processes)
    assert [r["fit_personal_rounds"] for r in second] == [2.0]  # trained on from round 1, not from scratch
    assert all(process.poll() is None for process in nodes.values())
