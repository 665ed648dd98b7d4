"""A stand-in node for driving a strategy without Flower's server loop (tests,
benchmarks, notebooks): the caller hands the strategy its replies directly."""

from __future__ import annotations

from flwr.common import Code, GetPropertiesRes, Status
from flwr.server import SimpleClientManager
from flwr.server.client_proxy import ClientProxy


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
