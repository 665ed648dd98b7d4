"""Driving a strategy without Flower's server loop (the in-process driver, tests,
benchmarks, notebooks): stand-in nodes, and the round loop Flower's server runs.

The strategy and the clients are the same objects a Flower run uses; only the
transport is gone: every round calls the strategy's ``configure_fit``, each
sampled client's ``fit``, ``aggregate_fit``, then the same for evaluation, as
Flower's server loop does.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from flwr.common import Code, GetPropertiesRes, Status
from flwr.server import SimpleClientManager
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from fedapp.flower.strategy import FedAppStrategy


class PartitionProxy(ClientProxy):
    """A node that answers ``get_properties`` with its partition id (as our clients do)
    and is never sent work: the tests hand the strategy its replies directly."""

    def __init__(self, partition: int, cid: str | None = None) -> None:
        super().__init__(cid or f"node-{partition}")
        self.partition = partition

    def get_properties(self, ins, timeout, group_id):
        return GetPropertiesRes(Status(Code.OK, ""), {"partition-id": self.partition})

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


def stand_in_manager(num_partitions: int) -> SimpleClientManager:
    """A client manager holding one :class:`PartitionProxy` per partition ``0 .. num_partitions - 1``."""
    manager = SimpleClientManager()
    for partition in range(num_partitions):
        manager.register(PartitionProxy(partition))
    return manager


class ClientPool(Protocol):
    """Where the clients live: runs ``fit`` or ``evaluate`` instructions, returns the replies in order."""

    def run(self, kind: str, instructions: list[tuple[PartitionProxy, Any]]) -> list[tuple[PartitionProxy, Any]]: ...


def drive_rounds(
    strategy: FedAppStrategy, pool: ClientPool, manager: ClientManager, num_rounds: int, completed: int = 0
) -> list[float]:
    """Run rounds ``completed + 1 .. num_rounds`` of ``strategy`` over ``pool`` (``completed``: the
    rounds a resumed strategy had finished); returns each round's seconds.

    A reply whose status is not OK is handed to the strategy as a failure, as
    Flower's server loop does.
    """
    parameters = strategy.initialize_parameters(manager)
    seconds = []
    for server_round in range(completed + 1, num_rounds + 1):
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
