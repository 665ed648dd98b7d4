"""Run a federation in this one process, without Flower's runtime.

The strategy and the clients are the same objects a Flower run uses, driven by
:func:`fedapp.flower.driver.drive_rounds` (Flower's round loop without the
transport). Tests use it to run every method through a protocol
in seconds, and ``benchmarks/overhead.py`` as the lower bound of a round's time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flwr.client import Client, NumPyClient

from fedapp.clientdata import load_client_data
from fedapp.config import resolve_run_config
from fedapp.flower.driver import PartitionProxy, drive_rounds, stand_in_manager
from fedapp.flower.strategy import FedAppStrategy
from fedapp.metrics import check_clients_trained
from fedapp.registry import client_class
from fedapp.server_app import build_strategy
from fedapp.state import MemoryStateStore
from fedapp.training import select_device


def build_numpy_clients(overrides: Mapping[str, Any], partitions: Iterable[int]) -> dict[int, NumPyClient]:
    """The method's NumPyClients of ``partitions``, built once, each with its own in-memory state."""
    config = resolve_run_config(dict(overrides))
    device = select_device(config.device)
    method_client = client_class(config.method)
    return {
        partition: method_client(
            config, load_client_data(config, partition, config.num_partitions), MemoryStateStore({}), device
        )
        for partition in partitions
    }


def build_clients(overrides: Mapping[str, Any], partitions: Iterable[int]) -> dict[int, Client]:
    """:func:`build_numpy_clients`, as Flower ``Client`` objects."""
    return {partition: client.to_client() for partition, client in build_numpy_clients(overrides, partitions).items()}


class InProcessClients:
    """Every client of the run in this process, called one after another."""

    def __init__(self, overrides: Mapping[str, Any]) -> None:
        self.clients = build_clients(overrides, range(int(resolve_run_config(dict(overrides))["num-partitions"])))

    def run(self, kind: str, instructions: list[tuple[PartitionProxy, Any]]) -> list[tuple[PartitionProxy, Any]]:
        return [(node, getattr(self.clients[node.partition], kind)(ins)) for node, ins in instructions]


def run_in_process(overrides: Mapping[str, Any], *, record: bool = False) -> FedAppStrategy:
    """Run the configured federation here; the strategy's :attr:`~FedAppStrategy.history`
    holds every round's metrics (and with ``record`` the run folder is written too, its
    folder released and its tracker's run ended when the run ends, or fails)."""
    config = resolve_run_config(dict(overrides))
    strategy = build_strategy(config, record=record)
    try:
        # resume=true continues from the checkpoint, as the ServerApp does (it once started over
        # and appended rounds 1.. again to metrics.jsonl).
        completed = strategy.resume() if config.resume else 0
        pool = InProcessClients(overrides)
        drive_rounds(strategy, pool, stand_in_manager(config.num_partitions), config.num_rounds, completed)
    finally:
        if strategy.recorder is not None:
            strategy.recorder.close()
    if strategy.recorder is not None:  # what ends the ServerApp as a failure ends this run too
        check_clients_trained(strategy.recorder.directory)
    return strategy
