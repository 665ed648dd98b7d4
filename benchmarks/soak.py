"""Soak: a long run over loopback with a flaky client and a SuperNode restarted mid-run.

A real SuperLink and three SuperNodes on 127.0.0.1 run ``--rounds`` rounds of a
small FedAvg run (CNN-5 on digits). One node fails a share of its messages
(``FEDAPP_FAULT_RATE``, a flaky device); another is stopped and started again
when the run reaches ``--restart-at``; a round waits at most ``ROUND_TIMEOUT_S``
for a reply (the restarted node's last one never comes). Every second the script samples the
proportional set size (PSS) of the SuperLink and SuperNodes with every process
they start (ServerApp, ClientApps). It prints whether every round is accounted
for (a metrics line per round; the clients that trained plus those that failed
never exceed the nodes) and whether memory stays flat: the peak of the second
half against the peak of the first half after warm-up.

    python benchmarks/soak.py                 # 200 rounds, 10% faults, restart at round 100
    python benchmarks/soak.py --smoke         # 4 rounds, 70% faults, restart at round 2 (tests)
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import descendants, pss_bytes

from fedapp.client_app import FAULT_RATE_ENV
from fedapp.launch import flower_env, free_port, stop_processes
from fedapp.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NODES = 3
FLAKY_NODE, RESTARTED_NODE = 2, 0
MB = 1024 * 1024
# A round waits at most this long for a reply, as a deployment with devices that come and go sets it:
# without it, a SuperNode restarted while it held a message holds its round until the SuperLink counts
# the old node offline (two 30 s heartbeats), and the restart is then a fixed minute of waiting.
ROUND_TIMEOUT_S = 30


@dataclass
class SoakResult:
    rounds: int
    rounds_recorded: int
    clients_failed: int
    rounds_short_of_a_client: int
    every_round_accounted: bool
    restarted_at_round: int
    peak_mb_first_half: float
    peak_mb_second_half: float
    growth: float
    seconds: float
    samples: list[tuple[float, int, float]] = field(default_factory=list, repr=False)


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.3)


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).is_success
    except httpx.HTTPError:
        return False


class Federation:
    """A SuperLink and ``NODES`` SuperNodes on loopback, each logging to ``<root>/<name>.log``."""

    def __init__(self, root: Path, fault_rate: float) -> None:
        self.root = root
        self.env = flower_env(root / "home", FLWR_TELEMETRY_ENABLED="0", FLWR_SUPEREXEC_TASK_POLL_INTERVAL="0.5")
        (root / "home").mkdir(parents=True, exist_ok=True)
        self.fault_rate = fault_rate
        self.link_port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        with (self.root / f"{name}.log").open("a") as log:
            self.processes[name] = subprocess.Popen(
                command, env=env or self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start_node(self, pid: int) -> None:
        config = f'partition-id={pid} num-partitions={NODES} state-dir="{self.root / f"state-{pid}"}"'
        command = [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.link_port}"]
        command += ["--port", str(free_port()), "--node-config", config]
        env = {**self.env, FAULT_RATE_ENV: str(self.fault_rate)} if pid == FLAKY_NODE else self.env
        self.start(f"supernode-{pid}", command, env)

    def __enter__(self) -> Federation:
        link = [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(self.link_port)]
        self.start("superlink", [*link, "--database", str(self.root / "link.db")])
        wait_until(lambda: healthy(self.link_port), "the SuperLink becoming healthy")
        for pid in range(NODES):
            self.start_node(pid)
        address = f"127.0.0.1:{self.link_port}"
        toml = f'[superlink]\ndefault = "soak"\n\n[superlink.soak]\naddress = "{address}"\ninsecure = true\n'
        (self.root / "home" / "config.toml").write_text(toml)
        return self

    def restart_node(self, pid: int) -> None:
        """Stop a SuperNode as its service manager would (SIGTERM) and start it again."""
        process = self.processes.pop(f"supernode-{pid}")
        stop_processes([process.pid])
        process.wait(timeout=30)
        self.start_node(pid)

    def memory_bytes(self) -> int:
        return sum(pss_bytes(p) for p in descendants(p.pid for p in self.processes.values()))

    def __exit__(self, *exc) -> None:
        stop_processes([p.pid for p in self.processes.values()])


def soak(rounds: int, restart_at: int, fault_rate: float, root: Path) -> SoakResult:
    results = root / "results"
    run_config = (
        f'method="fedavg" model="cnn-5" num-rounds={rounds} num-partitions={NODES} min-clients=1 '
        f'local-epochs=1 round-timeout={ROUND_TIMEOUT_S} results-dir="{results}" run-name="soak"'
    )
    samples: list[tuple[float, int, float]] = []
    started = time.monotonic()
    restarted_at = 0
    with Federation(root, fault_rate) as federation:
        command = [str(BIN / "flwr"), "run", str(ROOT), "soak", "--stream", "--run-config", run_config]
        with (root / "flwr-run.log").open("w") as log:
            run = subprocess.Popen(command, env=federation.env, stdout=log, stderr=subprocess.STDOUT)
        metrics = results / "soak" / "metrics.jsonl"
        while run.poll() is None:
            done = len(read_metrics(metrics)) if metrics.exists() else 0
            samples.append((time.monotonic() - started, done, federation.memory_bytes() / MB))
            if not restarted_at and done >= restart_at:
                federation.restart_node(RESTARTED_NODE)
                restarted_at = done
            time.sleep(1.0)
        if run.returncode != 0:
            raise RuntimeError(f"flwr run failed ({run.returncode}); logs in {root}")
    rows = read_metrics(metrics)
    accounted = [r["round"] for r in rows] == list(range(1, rounds + 1)) and all(
        r["clients_fit"] + r["clients_failed"] <= NODES for r in rows
    )
    warm = [(t, d, mb) for t, d, mb in samples if d >= max(1, rounds // 10)]  # after warm-up: round 1 at least
    half = rounds // 2
    first = max((mb for _, d, mb in warm if d < half), default=0.0)
    second = max((mb for _, d, mb in warm if d >= half), default=0.0)
    return SoakResult(
        rounds=rounds,
        rounds_recorded=len(rows),
        clients_failed=sum(int(r["clients_failed"]) for r in rows),
        rounds_short_of_a_client=sum(1 for r in rows if r["clients_fit"] < NODES),
        every_round_accounted=accounted,
        restarted_at_round=restarted_at,
        peak_mb_first_half=first,
        peak_mb_second_half=second,
        growth=(second / first - 1.0) if first else float("nan"),
        seconds=time.monotonic() - started,
        samples=samples,
    )


def table(result: SoakResult) -> str:
    rows = [
        ("rounds recorded / run", f"{result.rounds_recorded} / {result.rounds}"),
        ("every round accounted for", "yes" if result.every_round_accounted else "NO"),
        ("client failures (injected + restart)", str(result.clients_failed)),
        ("rounds short of a client", str(result.rounds_short_of_a_client)),
        ("SuperNode restarted at round", str(result.restarted_at_round)),
        ("peak PSS, first half (MB)", f"{result.peak_mb_first_half:.0f}"),
        ("peak PSS, second half (MB)", f"{result.peak_mb_second_half:.0f}"),
        ("growth, second half over first", f"{result.growth:+.1%}"),
        ("wall time (s)", f"{result.seconds:.0f}"),
    ]
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def main(argv: Sequence[str] | None = None) -> SoakResult:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--restart-at", type=int, default=None, help="round at which a SuperNode restarts (half)")
    parser.add_argument("--fault-rate", type=float, default=0.1)
    parser.add_argument("--smoke", action="store_true", help="4 rounds, 70%% faults, restart at round 2")
    parser.add_argument("--out", type=Path, default=None, help="write the figures and samples as JSON here")
    args = parser.parse_args(argv)
    rounds, fault_rate = (4, 0.7) if args.smoke else (args.rounds, args.fault_rate)
    restart_at = args.restart_at or rounds // 2
    with tempfile.TemporaryDirectory(prefix="fedapp-soak-") as scratch:
        result = soak(rounds, restart_at, fault_rate, Path(scratch))
    print(table(result))
    if args.out is not None:
        args.out.write_text(json.dumps(asdict(result), indent=1))
    return result


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the federation on SIGTERM too
    main()
