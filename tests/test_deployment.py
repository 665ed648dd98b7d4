"""Deployment on loopback: a real SuperLink, two SuperNodes and ``flwr run``.

One SuperLink and two SuperNodes serve several runs, one per method, as a
long-lived deployment would. Every process the module starts is stopped by PID
(with its process group) at the end, pass or fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fedapp.launch import free_port, stop_processes
from fedapp.metrics import read_metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def wait_healthy(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not become healthy in {timeout}s")


@dataclass
class Federation:
    env: dict[str, str]
    logs: Path
    root: Path

    def logs_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.logs.iterdir()))


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("deployment")
    home = root / "flwr-home"
    home.mkdir()
    env = {
        **os.environ,
        # The SuperLink and SuperNodes start flwr-serverapp / flwr-clientapp from PATH.
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }
    logs = root / "logs"
    logs.mkdir()
    started: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> None:
        out = (logs / f"{name}.log").open("w")
        command = [str(BIN / args[0]), *args[1:]]
        started.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    try:
        link_port = free_port()
        start(
            "superlink",
            "flower-superlink",
            "--insecure",
            "--host",
            "127.0.0.1",
            "--port",
            str(link_port),
            "--database",
            str(root / "superlink.db"),
        )
        wait_healthy(f"http://127.0.0.1:{link_port}/health")
        for pid in range(2):
            start(
                f"supernode-{pid}",
                "flower-supernode",
                "--insecure",
                "--superlink",
                f"127.0.0.1:{link_port}",
                "--port",
                str(free_port()),
                "--node-config",
                f"partition-id={pid} num-partitions=2",
            )
        connection = f'address = "127.0.0.1:{link_port}"\ninsecure = true\n'
        (home / "config.toml").write_text(f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n{connection}')
        yield Federation(env=env, logs=logs, root=root)
    finally:
        stop_processes([p.pid for p in started])


VIT = 'clip-model="fedapp-tiny-vit" prompt-length=2 shots-per-class=8'
D2P = 'client-models="vgg-2,vgg-3" d2p-steps=5 shots-per-class=8'


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("fedavg", 'model="cnn-5"'),
        ("coop-local", "shots-per-class=8"),
        ("promptfl", "shots-per-class=8"),
        ("sdfed", 'shots-per-class=8 local-prompt-lengths="4,16"'),
        ("head-fedavg", VIT),
        ("local-vpt", VIT),
        ("fedvpt", VIT),
        ("fedvpt-d", VIT),
        # One of the two SuperNodes is held out: it answers for its partition, never trains, and is evaluated.
        ("pep-fedpt", f"{VIT} held-out-fraction=0.5 min-clients=1"),
        ("fedd2p", D2P),
        ("fedd2p-agg", D2P),
        ("fedd2p-gt", D2P),
    ],
)
def test_two_rounds_over_loopback(federation, method, extra):
    results = federation.root / "results"
    run_config = f'method="{method}" num-rounds=2 num-partitions=2 {extra} results-dir="{results}" run-name="{method}"'
    done = subprocess.run(
        [str(BIN / "flwr"), "run", str(ROOT), "loopback", "--stream", "--run-config", run_config],
        env=federation.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = results / method / "metrics.jsonl"
    if not metrics.exists():
        pytest.fail(f"no metrics written\n{done.stdout[-3000:]}\n{federation.logs_tail()}")
    rows = read_metrics(metrics)
    assert [r["round"] for r in rows] == [1, 2]
    if method == "pep-fedpt":
        assert all(r["clients_fit"] == 1 and r["clients_evaluated"] == 1 and r["held_out_clients"] == 1 for r in rows)
        return
    assert all(r["clients_fit"] == 2 and r["clients_evaluated"] == 2 for r in rows)
    if method == "fedavg":
        assert rows[-1]["acc_mean"] > 0.1  # better than chance on 10 classes after 2 rounds
