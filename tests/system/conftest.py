"""The system tier's federations, each started once for the whole tier.

``loopback`` is a SuperLink with two SuperNodes on 127.0.0.1, as a long-lived
deployment would run them: every module that needs real Flower processes
submits its runs to it instead of starting its own. ``netns`` is the TLS and
node-authenticated federation across network namespaces (:mod:`tests.system.netns`),
also built once. Every process they start is stopped by PID (with its process
group) at the end, and every namespace deleted, pass or fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedapp.launch import free_port
from tests.system import netns as hosts
from tests.system.federation import (
    BIN,
    Processes,
    RunQueue,
    connection_toml,
    flower_env,
    healthy,
    run_app,
    wait_for,
)


@dataclass
class Loopback:
    """A running loopback federation: put ``flwr run``s in flight with :meth:`submit`."""

    env: dict[str, str]
    processes: Processes
    root: Path
    queue: RunQueue = field(init=False)

    def __post_init__(self) -> None:
        self.queue = RunQueue(lambda run_config: run_app("loopback", run_config, self.env, timeout=900))

    def submit(self, run_config: str):
        """Put a run in flight; the future's result is the finished ``flwr run``."""
        return self.queue.submit(run_config)


@pytest.fixture(scope="session")
def loopback(tmp_path_factory):
    root = tmp_path_factory.mktemp("loopback")
    env = flower_env(root / "flwr-home")
    processes = Processes(root / "logs", env)
    federation = None
    try:
        link_port = free_port()
        superlink = ["--insecure", "--host", "127.0.0.1", "--port", str(link_port)]
        processes.start("superlink", [str(BIN / "flower-superlink"), *superlink, "--database", str(root / "link.db")])
        wait_for(lambda: healthy(f"http://127.0.0.1:{link_port}/health"), "the SuperLink becoming healthy")
        for pid in range(2):
            node = ["--insecure", "--superlink", f"127.0.0.1:{link_port}", "--port", str(free_port())]
            paths = f'state-dir="{root / f"state-{pid}"}" cache-dir="{root / f"cache-{pid}"}"'
            node += ["--node-config", f"partition-id={pid} num-partitions=2 {paths}"]
            processes.start(f"supernode-{pid}", [str(BIN / "flower-supernode"), *node])
        (root / "flwr-home/config.toml").write_text(connection_toml("loopback", f"127.0.0.1:{link_port}"))
        federation = Loopback(env=env, processes=processes, root=root)
        yield federation
    finally:
        if federation is not None:
            federation.queue.drain()
            federation.queue.close()
        processes.stop_all()


@pytest.fixture(scope="session")
def netns(tmp_path_factory):
    if hosts.UNAVAILABLE:
        pytest.skip(hosts.UNAVAILABLE)
    yield from hosts.federation(tmp_path_factory.mktemp("netns"))
