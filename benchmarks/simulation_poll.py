"""What one pass of Flower's simulation poll costs, by the number of simulated nodes.

Flower's simulation engine hands messages to its workers from a loop
(``vce_api.add_messages_to_queue``) that, every 0.1 s, asks its in-memory
SuperLink state for a queued message once per node; each ask scans every stored
message (``InMemoryLinkState.get_message_ins``), delivered ones included, until
their replies are pulled. This registers N nodes with the engine's own
``_register_nodes`` on the grid a simulation's ServerApp gets, stores one
message for each of ``--messages`` nodes (a round's instructions, delivered and
awaiting replies), and times one pass over every node, as the loop makes it::

    python benchmarks/simulation_poll.py --nodes 1000 5000 10000 --messages 100

A pass that takes longer than the loop's 0.1 s wait keeps one core of the
simulation process busy while a round's messages are out, beside the workers.
Each pass is timed twice: with Flower's own ``get_message_ins`` and with the
per-node index this project's ServerApp gives a simulation's state
(:mod:`fedapp.flower.pending_index`).
"""

from __future__ import annotations

import argparse
import time

from flwr.app import Message, RecordDict
from flwr.proto.task_pb2 import Task
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from fedapp.flower.pending_index import index_pending_messages

RUN_ID = 7


def simulation_grid(
    num_nodes: int, grid_class: type[InMemoryGrid] = InMemoryGrid
) -> tuple[InMemoryGrid, dict[int, int]]:
    """The grid a Flower simulation's ServerApp gets, with ``num_nodes`` nodes registered by
    the engine's own ``_register_nodes``, and the engine's node id -> partition mapping."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    run = Run.create_empty(run_id=RUN_ID)  # as flwr.simulation.run_simulation makes and pre-registers it
    run.primary_task_id, run.federation_id = RUN_ID + 1, NOOP_FEDERATION_ID
    state = factory.state()
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[run.primary_task_id] = Task(task_id=run.primary_task_id, run_id=run.run_id)
    nodes_mapping = vce_api._register_nodes(num_nodes=num_nodes, state_factory=factory)
    grid = grid_class(state_factory=factory)
    grid.set_run(run)
    return grid, nodes_mapping


def poll_pass_seconds(num_nodes: int, messages: int, *, indexed: bool = False) -> float:
    """Seconds of one poll pass over ``num_nodes`` nodes with ``messages`` delivered messages
    stored, through Flower's ``get_message_ins`` or (``indexed``) the per-node index."""
    grid, nodes_mapping = simulation_grid(num_nodes)
    if indexed:
        index_pending_messages(grid)
    nodes = list(nodes_mapping)
    # The grid stamps messages with the task it runs as, as a ServerApp's does.
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN_ID, 1
    grid.push_messages([Message(RecordDict(), dst_node_id=node, message_type="train") for node in nodes[:messages]])
    for node in nodes[:messages]:
        grid.state.get_message_ins(node_id=node, limit=1)  # delivered; stored until its reply is pulled
    started = time.perf_counter()
    for node in nodes:
        grid.state.get_message_ins(node_id=node, limit=1)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict[int, tuple[float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--messages", type=int, default=100, help="messages stored (a round's instructions)")
    args = parser.parse_args(argv)
    seconds = {
        n: tuple(poll_pass_seconds(n, min(args.messages, n), indexed=i) for i in (False, True)) for n in args.nodes
    }
    print(
        f"| nodes | one poll pass, {args.messages} messages stored: Flower's (ms) | share of a core "
        "(pass / (pass + 0.1 s)) | indexed (ms) | share of a core |"
    )
    print("|---|---|---|---|---|")
    for n, (flower, indexed) in seconds.items():
        shares = [s / (s + 0.1) for s in (flower, indexed)]
        print(f"| {n:,} | {1000 * flower:.0f} | {shares[0]:.0%} | {1000 * indexed:.0f} | {shares[1]:.0%} |")
    return seconds


if __name__ == "__main__":
    main()
