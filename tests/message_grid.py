"""Flower's Message API in this process, for the tests: a grid whose nodes are our clients."""

from __future__ import annotations

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import Error

from fedapp.config import resolve_run_config
from fedapp.flower.message_api import MessageStrategy
from fedapp.flower.message_records import answer
from fedapp.inprocess import build_numpy_clients

FIRST_NODE = 101


class InProcessGrid:
    """A grid whose nodes are our clients in this process (node id ``101 + partition``);
    ``fail`` maps a node to "error" (it answers with an error) or "silent" (no reply).

    With ``client_app`` (ours, :func:`fedapp.client_app.make_client_app`) each node is that
    ClientApp called with the node's own ``Context`` (its partition in the node config, its state
    kept between messages), as a simulation's worker calls it: the ClientApp's mods, its
    ``client_fn`` and the checks around the method's client answer every message.
    """

    def __init__(
        self, overrides: dict, fail: dict[int, str] | None = None, client_app: ClientApp | None = None
    ) -> None:
        num_partitions = resolve_run_config(overrides).num_partitions
        self.nodes = [FIRST_NODE + p for p in range(num_partitions)]
        if client_app is None:
            clients = build_numpy_clients(overrides, range(num_partitions))
            self.clients = {FIRST_NODE + p: client for p, client in clients.items()}
        else:
            self.contexts = {
                FIRST_NODE + p: Context(
                    run_id=1,
                    node_id=FIRST_NODE + p,
                    node_config={"partition-id": p, "num-partitions": num_partitions},
                    state=RecordDict(),
                    run_config={},
                )
                for p in range(num_partitions)
            }
        self.client_app = client_app
        self.fail = fail or {}
        self.sent: list[Message] = []

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            self.sent.append(message)
            node = message.metadata.dst_node_id
            failure = self.fail.get(node) if message.metadata.message_type != MessageType.QUERY else None
            if failure == "silent":
                continue
            if failure == "error":
                replies.append(Message(Error(code=0, reason=f"node {node} crashed"), reply_to=message))
                continue
            if self.client_app is None:
                replies.append(answer(self.clients[node], message))
            else:
                replies.append(self.client_app(message, self.contexts[node]))
        return replies


def run_on_message_api(overrides: dict, grid: InProcessGrid | None = None, *, record: bool = False):
    """``(MessageStrategy, Result)`` of the configured run, driven by Flower's ``Strategy.start``."""
    strategy = MessageStrategy.from_config(resolve_run_config(overrides), record=record)
    grid = grid or InProcessGrid(overrides)
    try:
        result = strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=strategy.rounds_left())
    finally:
        if strategy.strategy.recorder is not None:
            strategy.strategy.recorder.close()
    return strategy, result
