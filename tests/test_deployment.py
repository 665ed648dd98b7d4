"""Deployment on loopback: a real SuperLink, two SuperNodes and ``flwr run``.

One SuperLink and two SuperNodes serve several runs, one per method, as a
long-lived deployment would. Every process the module starts is stopped by PID
(with its process group) at the end, pass or fail. The methods that
``tests/test_netns.py`` runs across separate hosts with TLS (pFedLoRA, SDFed,
FedD2P, PEP-FedPT) are covered there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fedapp.launch import free_port
from tests.federation import BIN, Processes, connection_toml, flower_env, run_app, run_metrics, wait_for

pytestmark = pytest.mark.slow


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).is_success
    except httpx.HTTPError:
        return False


@dataclass
class Federation:
    env: dict[str, str]
    processes: Processes
    root: Path


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("deployment")
    env = flower_env(root / "flwr-home")
    processes = Processes(root / "logs", env)
    try:
        link_port = free_port()
        superlink = ["--insecure", "--host", "127.0.0.1", "--port", str(link_port)]
        processes.start("superlink", [str(BIN / "flower-superlink"), *superlink, "--database", str(root / "link.db")])
        wait_for(lambda: healthy(f"http://127.0.0.1:{link_port}/health"), "the SuperLink becoming healthy")
        for pid in range(2):
            node = ["--insecure", "--superlink", f"127.0.0.1:{link_port}", "--port", str(free_port())]
            node += ["--node-config", f"partition-id={pid} num-partitions=2"]
            processes.start(f"supernode-{pid}", [str(BIN / "flower-supernode"), *node])
        (root / "flwr-home/config.toml").write_text(connection_toml("loopback", f"127.0.0.1:{link_port}"))
        yield Federation(env=env, processes=processes, root=root)
    finally:
        processes.stop_all()


VIT = 'clip-model="fedapp-tiny-vit" prompt-length=2 shots-per-class=8'
D2P = 'client-models="vgg-2,vgg-3" d2p-steps=5 shots-per-class=8'


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("fedavg", 'model="cnn-5"'),
        ("coop-local", "shots-per-class=8"),
        ("promptfl", "shots-per-class=8"),
        ("head-fedavg", VIT),
        ("local-vpt", VIT),
        ("fedvpt", VIT),
        ("fedvpt-d", VIT),
        # One of the two SuperNodes is held out: it answers for its partition, never trains, and is evaluated.
        ("pep-fedpt", f"{VIT} held-out-fraction=0.5 min-clients=1"),
        ("fedd2p-agg", D2P),
        ("fedd2p-gt", D2P),
    ],
)
def test_two_rounds_over_loopback(federation, method, extra):
    results = federation.root / "results"
    run_config = f'method="{method}" num-rounds=2 num-partitions=2 {extra} results-dir="{results}" run-name="{method}"'
    rows = run_metrics(results, method, run_app("loopback", run_config, federation.env), federation.processes)
    assert [r["round"] for r in rows] == [1, 2]
    if method == "pep-fedpt":
        assert all(r["clients_fit"] == 1 and r["clients_evaluated"] == 1 and r["held_out_clients"] == 1 for r in rows)
        return
    assert all(r["clients_fit"] == 2 and r["clients_evaluated"] == 2 for r in rows)
    if method == "fedavg":
        assert rows[-1]["acc_mean"] > 0.1  # better than chance on 10 classes after 2 rounds
