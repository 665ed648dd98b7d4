"""Framework overhead: the same federated run as plain Python loops and as a Flower simulation.

For one method of each family it runs the same clients, data, epochs and seeds
three ways:

* **plain loops** (the lower bound): no Flower messages, no Ray, no SuperLink.
  Each client's NumPyClient is built once and kept; every round the loop calls
  the strategy's ``configure_fit``, each sampled client's ``fit``, the strategy's
  ``aggregate_fit`` (the method's own averaging or distillation), then the same
  for evaluation. Once with one worker process per core (1 torch thread each,
  client p in worker p mod workers, as the simulation lays clients out), once
  with every client in this process and every core as torch threads. The faster
  of the two is the bound.
* **Flower simulation**: ``flwr run`` through :mod:`fedapp.launch` (a private
  SuperLink, Ray workers with 1 CPU each, the ClientApp building the client for
  every message, arrays travelling as Flower messages).

The simulation computes exactly what the process loop computes (same thread
layout, so the same floating-point sums): the script checks that their
per-round accuracies are equal. It prints the wall time of each (the
simulation's includes starting the SuperLink, the ServerApp and the Ray
workers), the time of the rounds after the first (start-up over) and the
ratios::

    python benchmarks/overhead.py                       # 10 and 100 clients, 5 methods
    python benchmarks/overhead.py --clients 10 --methods pfedlora --rounds 5
    python benchmarks/overhead.py --smoke               # tiny sizes (CI); no timing is asserted
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import MethodRun, markdown_table, run_method

from fedapp.config import resolve_run_config
from fedapp.flower.driver import PartitionProxy, drive_rounds, stand_in_manager
from fedapp.inprocess import InProcessClients, build_clients
from fedapp.server_app import build_strategy

# One method per family (A: CLIP text prompts, B: heterogeneous CNNs, C: server-held CLIP,
# D: ViT visual prompts) plus FedAvg as the reference, all on the digits that ship with
# scikit-learn and the random-init tiny backbones.
FAMILY_METHODS = {
    "fedavg": {},
    "promptfl": {"shots-per-class": 16},
    # pFedLoRA's paper's SGD lr: at the default 0.05 one client's adapter step diverges on the
    # seed-0 pathological split of 4 clients (adapter loss 5e7 in round 1; every client NaN in round 2).
    "pfedlora": {"client-models": "cnn-1,cnn-2,cnn-3", "lr": 0.01},
    "fedd2p": {},
    "pep-fedpt": {"clip-model": "fedapp-tiny-vit", "shots-per-class": 16},
}
SMOKE_METHODS = ("pfedlora",)
TARGETS = {10: 1.15, 100: 1.3}


@dataclass(frozen=True)
class PlainRun:
    """What the plain loop measured: wall time, per-round times, per-round mean accuracy."""

    wall_seconds: float
    round_seconds: list[float]
    acc_mean: list[float]


class LocalClients(InProcessClients):
    """Every client in this process, run one after another with ``threads`` torch threads."""

    def __init__(self, overrides: Mapping[str, Any], threads: int) -> None:
        torch.set_num_threads(threads)
        super().__init__(overrides)

    def wait_ready(self) -> None:
        pass

    def close(self) -> None:
        pass


def _client_worker(conn: Connection, overrides: dict[str, Any], partitions: list[int], threads: int) -> None:
    """A plain-loop worker process: builds its clients once, then runs what the parent sends."""
    torch.set_num_threads(threads)
    clients = build_clients(overrides, partitions)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        kind, batches = job  # [(instruction, partitions it goes to)]
        conn.send([(p, getattr(clients[p], kind)(ins)) for ins, partitions in batches for p in partitions])


class PlainWorkers:
    """``workers`` processes with ``threads`` torch threads each; partition p lives in worker p mod workers."""

    def __init__(self, overrides: Mapping[str, Any], workers: int, threads: int) -> None:
        num_clients = int(overrides["num-partitions"])
        context = mp.get_context("spawn")  # a fork after torch has run threads can deadlock
        self.workers = min(workers, num_clients)
        self.connections: list[Connection] = []
        self.processes = []
        for worker in range(self.workers):
            parent_end, child_end = context.Pipe()
            partitions = list(range(worker, num_clients, self.workers))
            process = context.Process(target=_client_worker, args=(child_end, dict(overrides), partitions, threads))
            process.start()
            self.connections.append(parent_end)
            self.processes.append(process)

    def wait_ready(self) -> None:
        for connection in self.connections:
            if connection.recv() != "ready":
                raise RuntimeError("a plain-loop worker failed to start")

    def run(self, kind: str, instructions: list[tuple[PartitionProxy, Any]]) -> list[tuple[PartitionProxy, Any]]:
        """Send each node's instruction to its worker; the replies, in the instructions' order."""
        nodes = {node.partition: node for node, _ in instructions}
        for worker, connection in enumerate(self.connections):
            # Strategies send most clients the same instruction object: pickle it once per worker.
            batches: dict[int, tuple[Any, list[int]]] = {}
            for node, ins in instructions:
                if node.partition % self.workers == worker:
                    batches.setdefault(id(ins), (ins, []))[1].append(node.partition)
            connection.send((kind, list(batches.values())))
        replies = dict(pair for connection in self.connections for pair in connection.recv())
        return [(nodes[partition], replies[partition]) for partition in nodes]

    def close(self) -> None:
        for connection in self.connections:
            connection.send(None)
        for process in self.processes:
            process.join()


def plain_loop(overrides: Mapping[str, Any], workers: int, threads: int) -> PlainRun:
    """Run ``overrides`` for ``num-rounds`` rounds without Flower's runtime: in ``workers``
    processes of ``threads`` torch threads each, or (``workers = 0``) all in this one."""
    started = time.perf_counter()
    pool = PlainWorkers(overrides, workers, threads) if workers else LocalClients(overrides, threads)
    try:
        config = resolve_run_config(dict(overrides))
        strategy = build_strategy(config, record=False)
        pool.wait_ready()
        manager = stand_in_manager(config.num_partitions)
        round_seconds = drive_rounds(strategy, pool, manager, config.num_rounds)
    finally:
        pool.close()
    return PlainRun(
        wall_seconds=time.perf_counter() - started,
        round_seconds=round_seconds,
        acc_mean=[record.acc_mean for record in strategy.history],
    )


def simulation(overrides: Mapping[str, Any], setting: str, num_clients: int) -> MethodRun:
    """The same run through ``flwr run`` (Ray simulation, 1 CPU per client)."""
    return run_method(
        str(overrides["method"]), {k: v for k, v in overrides.items() if k != "method"}, setting, num_clients
    )


def _steady(seconds: Sequence[float]) -> float:
    """Total time of the rounds after the first (the first also starts workers)."""
    return sum(seconds[1:]) if len(seconds) > 1 else sum(seconds)


@dataclass(frozen=True)
class Row:
    """One method and client count: the two plain loops and the simulation."""

    method: str
    clients: int
    processes: PlainRun  # one process per core, 1 torch thread each (the simulation's layout)
    threads: PlainRun  # one process, every core as torch threads
    flower: MethodRun

    @property
    def flower_steady(self) -> float:
        return _steady([m["round_seconds"] for m in self.flower.metrics])

    @property
    def flower_outside_rounds(self) -> float:
        """Start-up and shutdown: the flwr CLI, SuperLink, app submission, ServerApp, Ray."""
        return self.flower.wall_seconds - sum(m["round_seconds"] for m in self.flower.metrics)

    @property
    def plain_wall(self) -> float:
        """The lower bound: the faster plain loop."""
        return min(self.processes.wall_seconds, self.threads.wall_seconds)

    @property
    def plain_steady(self) -> float:
        return min(_steady(self.processes.round_seconds), _steady(self.threads.round_seconds))

    @property
    def same_accuracy(self) -> bool:
        """The simulation computed what the plain loop with its thread layout computed."""
        flower_acc = [m["acc_mean"] for m in self.flower.metrics]
        return len(flower_acc) == len(self.processes.acc_mean) and all(
            abs(a - b) <= 1e-9 for a, b in zip(flower_acc, self.processes.acc_mean, strict=True)
        )


def table(rows: Sequence[Row]) -> str:
    header = [
        "method",
        "clients",
        "plain wall s (processes / threads)",
        "Flower wall s (outside rounds / round 1)",
        "wall ratio",
        "plain rounds 2+ s (processes / threads)",
        "Flower rounds 2+ s",
        "rounds 2+ ratio",
        "target",
        "same accuracies",
    ]
    body = [
        [
            r.method,
            str(r.clients),
            f"{r.processes.wall_seconds:.1f} / {r.threads.wall_seconds:.1f}",
            f"{r.flower.wall_seconds:.1f} ({r.flower_outside_rounds:.1f} / {r.flower.metrics[0]['round_seconds']:.1f})",
            f"{r.flower.wall_seconds / r.plain_wall:.2f}",
            f"{_steady(r.processes.round_seconds):.1f} / {_steady(r.threads.round_seconds):.1f}",
            f"{r.flower_steady:.1f}",
            f"{r.flower_steady / r.plain_steady:.2f}",
            f"{TARGETS.get(r.clients, TARGETS[100]):.2f}",
            "yes" if r.same_accuracy else "no",
        ]
        for r in rows
    ]
    return markdown_table(header, body)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="10,100", help="comma list of client counts")
    parser.add_argument("--methods", help=f"comma list (default: {','.join(FAMILY_METHODS)})")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="plain-loop processes (the simulation: 1 CPU per client)",
    )
    parser.add_argument("--smoke", action="store_true", help="2 rounds, 4 clients, pfedlora")
    args = parser.parse_args(argv)
    methods = args.methods.split(",") if args.methods else list(SMOKE_METHODS if args.smoke else FAMILY_METHODS)
    unknown = sorted(set(methods) - set(FAMILY_METHODS))
    if unknown:
        parser.error(f"unknown methods: {', '.join(unknown)} (choose from {', '.join(FAMILY_METHODS)})")
    client_counts = [4] if args.smoke else [int(c) for c in args.clients.split(",")]
    rounds = 2 if args.smoke else args.rounds
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedapp-overhead-") as scratch:
        for num_clients in client_counts:
            for method in methods:
                overrides = {
                    "method": method,
                    "num-partitions": num_clients,
                    "num-rounds": rounds,
                    "local-epochs": 1,
                    # Dirichlet splits of the 1,797 digits fail at 100 clients; 2 classes each always works.
                    "partition": "pathological",
                    "results-dir": scratch,
                    "state-dir": scratch,
                    **FAMILY_METHODS[method],
                }
                processes = plain_loop(overrides, args.workers, threads=1)
                threads = plain_loop(overrides, 0, threads=args.workers)
                print(
                    f"{method} N={num_clients}: plain loops {processes.wall_seconds:.1f}s (processes), "
                    f"{threads.wall_seconds:.1f}s (threads)",
                    flush=True,
                )
                flower = simulation(overrides, f"overhead-{num_clients}", num_clients)
                rows.append(Row(method, num_clients, processes, threads, flower))
                # This row now, in case a later run fails (prefixed: the table proper comes at the end).
                print("row:", table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
