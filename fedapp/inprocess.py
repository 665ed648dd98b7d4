"""Run a federation in this one process, without Flower's runtime.

The strategy and the clients are the same objects a Flower run uses; only the
transport is gone: every round calls the strategy's ``configure_fit``, each
sampled client's ``fit``, ``aggregate_fit``, then the same for evaluation, as
Flower's server loop does. Tests use it to run every method through a protocol
in seconds, and ``benchmarks/overhead.py`` as the lower bound of a round's time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from flwr.client import Client
from flwr.common import Code
from flwr.server.client_manager import ClientManager

from fedapp.clientdata import load_client_data
from fedapp.config import resolve_run_config
from fedapp.registry import client_class
from fedapp.server_app import build_strategy
from fedapp.state import MemoryStateStore
from fedapp.training import select_device
from strategies.base import FedAppStrategy
from strategies.proxies import PartitionProxy, stand_in_manager


class ClientPool(Protocol):
    """Where the clients live: runs ``fit`` or ``evaluate`` instructions, returns the replies in order."""

    def run(self, kind: str, instructions: list[tuple[PartitionProxy, Any]]) -> list[tuple[PartitionProxy, Any]]: ...


def build_clients(overrides: Mapping[str, Any], partitions: Iterable[int]) -> dict[int, Client]:
    """The clients of ``partitions``, built once, each with its own in-memory state."""
    config = resolve_run_config(dict(overrides))
    num_clients = int(config["num-partitions"])
    device = select_device(str(config["device"]))
    clients = {}
    for partition in partitions:
        data = load_client_data(config, partition, num_clients)
        client = client_class(str(config["method"]))(config, data, MemoryStateStore({}), device)
        clients[partition] = client.to_client()
    return clients


class InProcessClients:
    """Every client of the run in this process, called one after another."""

    def __init__(self, overrides: Mapping[str, Any]) -> None:
        self.clients = build_clients(overrides, range(int(resolve_run_config(dict(overrides))["num-partitions"])))

    def run(self, kind: str, instructions: list[tuple[PartitionProxy, Any]]) -> list[tuple[PartitionProxy, Any]]:
        return [(node, getattr(self.clients[node.partition], kind)(ins)) for node, ins in instructions]


def drive_rounds(strategy: FedAppStrategy, pool: ClientPool, manager: ClientManager, num_rounds: int) -> list[float]:
    """Run ``num_rounds`` rounds of ``strategy`` over ``pool``; returns each round's seconds.

    A reply whose status is not OK is handed to the strategy as a failure, as
    Flower's server loop does.
    """
    parameters = strategy.initialize_parameters(manager)
    seconds = []
    for server_round in range(1, num_rounds + 1):
        started = time.perf_counter()
        replies = pool.run("fit", strategy.configure_fit(server_round, parameters, manager))
        ok = [(node, res) for node, res in replies if res.status.code == Code.OK]
        failed = [(node, res) for node, res in replies if res.status.code != Code.OK]
        aggregated, _ = strategy.aggregate_fit(server_round, ok, failed)
        parameters = aggregated or parameters
        evaluations = pool.run("evaluate", strategy.configure_evaluate(server_round, parameters, manager))
        strategy.aggregate_evaluate(server_round, evaluations, [])
        seconds.append(time.perf_counter() - started)
    return seconds


def run_in_process(overrides: Mapping[str, Any], *, record: bool = False) -> FedAppStrategy:
    """Run the configured federation here; the strategy's :attr:`~FedAppStrategy.history`
    holds every round's metrics (and with ``record`` the run folder is written too)."""
    config = resolve_run_config(dict(overrides))
    strategy = build_strategy(config, record=record)
    pool = InProcessClients(overrides)
    drive_rounds(strategy, pool, stand_in_manager(int(config["num-partitions"])), int(config["num-rounds"]))
    return strategy
