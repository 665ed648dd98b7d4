"""Which clients take part in a round: a draw that depends on (seed, round) only, over the
pool sorted by partition (:meth:`ClientSampler.sample`); the held-out partitions, which
never train; and asking each node its partition, once (node ids change from one run or
restart to the next, partitions do not).

The nodes of a grid are asked all at once: one push of every query message and one wait
for the replies, so the start of a run costs one message per node and not one poll
interval per node (Flower's grid sleeps between pulls: 0.1 s in simulation, 3 s deployed).

In Flower's simulation no node is asked (:func:`registered_partitions`): the engine
registers its nodes one after another and gives the i-th partition i, so the order in
which they registered is their partition order. Asking would cost one message per node
through a runtime that scans every stored message for each node every 0.1 s, O(N²) for
N nodes (issue 25: 8.8x the start-up for 10x the clients). Every reply's reported
partition is checked against that order (:meth:`ClientSampler.confirm`); a mismatch turns
the inference off and the nodes are asked from then on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

import numpy as np
from flwr.app import Message
from flwr.common import GetPropertiesIns, MessageTypeLegacy
from flwr.compat.common import recorddict_compat
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.superlink.grid import InMemoryGrid

from fedapp.clientdata import held_out_clients
from fedapp.config import RunConfig, domain_of_partition
from fedapp.flower.message_records import PROPERTIES

log = logging.getLogger("flwr.fedapp")

_Reply = TypeVar("_Reply")


class ClientSampler:
    """Picks a round's clients and remembers every node's partition.

    Parameters
    ----------
    config
        The run configuration: ``seed``, ``min-clients``, ``partition`` and the
        held-out settings (:func:`fedapp.clientdata.held_out_clients`).
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        #: Partitions that never train.
        self.held_out: frozenset[int] = held_out_clients(config)
        #: Node id -> partition, for every node that answered (or whose registration order said).
        self.partition_of: dict[str, int] = {}
        #: Whether a simulation's registration order may stand for the nodes' answers.
        self.trust_registration = True

    def sample(
        self,
        server_round: int,
        client_manager: ClientManager,
        fraction: float,
        salt: int,
        *,
        include_held_out: bool = False,
    ) -> list[ClientProxy]:
        """Pick ``fraction`` of the pool (at least ``min-clients``) as a function of
        (seed, round, ``salt``) only, over the pool sorted by partition.

        Whenever not everyone is picked, clients are held out or per-domain
        accuracies are wanted, the nodes are asked their partition once, and a node
        that does not answer is left out. Held-out clients are picked only with
        ``include_held_out`` (evaluation, when the method's global state alone
        serves a client that never trained).
        """
        min_clients = self.config.min_clients
        # Flower's grid-backed client manager refreshes its node list when asked how many
        # nodes it has (and otherwise every 5 s); asking first keeps a first round whose
        # nodes are already connected from waiting for the next refresh.
        if client_manager.num_available() < min_clients:
            client_manager.wait_for(min_clients)
        pool = client_manager.all()
        if self.held_out or fraction < 1.0 or self.config.partition == "domain":
            self.ask_partitions(list(pool.values()), server_round)
            pool = {
                cid: proxy
                for cid, proxy in pool.items()
                if (partition := self.partition_of.get(cid)) is not None
                and (include_held_out or partition not in self.held_out)
            }
        ids = sorted(pool, key=lambda cid: (self.partition_of.get(cid, -1), cid))
        count = min(len(ids), max(min_clients, math.ceil(fraction * len(ids))))
        rng = np.random.default_rng([self.config.seed, server_round, salt])
        chosen = sorted(rng.choice(len(ids), size=count, replace=False)) if count < len(ids) else range(len(ids))
        return [pool[ids[i]] for i in chosen]

    def ask_partitions(self, proxies: Sequence[ClientProxy], server_round: int) -> None:
        """Learn the partition of every node not asked yet, all at once: a grid's nodes in one
        batch of messages, any other proxy on a thread of its own."""
        missing = [proxy for proxy in proxies if proxy.cid not in self.partition_of]
        batches: dict[int, list[tuple[Any, Message]]] = {}
        alone = []
        for proxy in missing:
            message = query_message(proxy, server_round)
            if message is None:
                alone.append(proxy)
            else:
                batches.setdefault(id(proxy.grid), []).append((proxy, message))
        for batch in batches.values():
            known = registered_partitions(batch[0][0].grid) if self.trust_registration else None
            self.partition_of.update((p.cid, known[p.node_id]) for p, _ in batch if p.node_id in (known or {}))
            if batch := [(proxy, message) for proxy, message in batch if proxy.cid not in self.partition_of]:
                self._ask_batch(batch, server_round)
        if alone:
            with ThreadPoolExecutor(max_workers=min(16, len(alone))) as pool:
                list(pool.map(lambda proxy: self.partition(proxy, server_round), alone))

    def _ask_batch(self, queries: Sequence[tuple[Any, Message]], server_round: int) -> None:
        """Ask nodes of one grid (``(proxy, query)`` pairs): every query pushed, then the replies pulled together."""
        unanswered = {proxy.node_id: proxy for proxy, _ in queries}
        grid = queries[0][0].grid
        for reply in grid.send_and_receive([message for _, message in queries], timeout=None):
            proxy = unanswered.pop(reply.metadata.src_node_id, None)
            if proxy is None:
                continue
            try:
                if reply.has_error():
                    raise RuntimeError(reply.error.reason)
                self.partition_of[proxy.cid] = int(reply_properties(reply)["partition-id"])
            except Exception as err:  # a client that cannot answer is left out this round, not fatal
                _no_partition(server_round, proxy, err)
        for proxy in unanswered.values():
            _no_partition(server_round, proxy, TimeoutError("no reply"))

    def partition(self, proxy: ClientProxy, server_round: int) -> int | None:
        """The client's partition id, asked once (None if it does not answer; it is asked again next time)."""
        if proxy.cid not in self.partition_of:
            try:
                res = proxy.get_properties(GetPropertiesIns(config={}), timeout=None, group_id=server_round)
                self.partition_of[proxy.cid] = int(res.properties["partition-id"])
            except Exception as err:  # a client that cannot answer is left out this round, not fatal
                _no_partition(server_round, proxy, err)
                return None
        return self.partition_of[proxy.cid]

    def confirm(self, replies: Sequence[tuple[ClientProxy, Any]]) -> None:
        """Check each reply's reported ``partition_id`` metric against the partition the sampler
        holds for its node; on a mismatch, log it, keep the reported one and stop inferring
        partitions from a simulation's registration order (the nodes are asked instead)."""
        for proxy, res in replies:
            reported = (getattr(res, "metrics", None) or {}).get("partition_id")
            known = self.partition_of.get(proxy.cid)
            if reported is None or known is None or int(reported) == known:
                continue
            log.error(
                "client %s reports partition %s, not %d as the server had it (from a simulation's registration "
                "order or the node's earlier answer): the nodes are asked their partitions from now on",
                proxy.cid,
                reported,
                known,
            )
            self.trust_registration = False
            self.partition_of = {proxy.cid: int(reported)}

    def is_held_out(self, cid: str) -> bool:
        """Whether node ``cid`` holds a held-out partition (False while its partition is unknown)."""
        return self.partition_of.get(cid) in self.held_out

    def split_held_out(
        self, replies: Sequence[tuple[ClientProxy, _Reply]]
    ) -> tuple[list[tuple[ClientProxy, _Reply]], list[tuple[ClientProxy, _Reply]]]:
        """``(training clients' replies, held-out clients' replies)``, each in the given order,
        once each reply's reported partition is checked (:meth:`confirm`)."""
        self.confirm(replies)
        held = [(p, r) for p, r in replies if self.is_held_out(p.cid)]
        kept = [(p, r) for p, r in replies if not self.is_held_out(p.cid)]
        return kept, held

    def domain_of(self, cid: str) -> int | None:
        """The domain of node ``cid``'s partition (``partition = domain``), else None (also while unknown)."""
        partition = self.partition_of.get(cid)
        return None if partition is None else domain_of_partition(self.config, partition)


def registered_partitions(grid: Any) -> dict[int, int] | None:
    """Node id -> partition of a Flower simulation's nodes, without asking any node; None
    (ask them) for any other grid.

    Flower's simulation engine (``vce_api._register_nodes``) registers its N nodes one after
    another and gives the i-th the node config ``partition-id = i``; its ServerApp, alone of
    Flower's runtimes, talks to an ``InMemoryGrid``, whose node records carry the time each
    node registered. Sorted by that time, the nodes are in partition order. Also None when
    two nodes share a registration time, which would leave the order undecided.
    """
    if not isinstance(grid, InMemoryGrid):
        return None
    try:
        registered = sorted((datetime.fromisoformat(node.registered_at), node.node_id) for node in grid.get_nodes())
    except ValueError:  # a node without a registration time
        return None
    if len({when for when, _ in registered}) != len(registered):
        return None
    return {node_id: partition for partition, (_, node_id) in enumerate(registered)}


def query_message(proxy: ClientProxy, server_round: int) -> Message | None:
    """The partition query for ``proxy`` as a Message of its grid, or None if ``proxy`` is not a
    grid's node (it is then asked through :meth:`ClientProxy.get_properties`).

    Flower's legacy proxy speaks the legacy ``get_properties`` message; a proxy of our own
    (the Message API's :class:`~fedapp.flower.message_api.NodeProxy`) builds its own.
    """
    ins = GetPropertiesIns(config={})
    if isinstance(proxy, GridClientProxy):
        return Message(
            recorddict_compat.getpropertiesins_to_recorddict(ins),
            dst_node_id=proxy.node_id,
            message_type=MessageTypeLegacy.GET_PROPERTIES,
            group_id=str(server_round),
        )
    build = getattr(proxy, "query_message", None)
    return None if build is None else build(ins, server_round)


def reply_properties(reply: Message) -> Mapping[str, Any]:
    """The properties a node's reply to :func:`query_message` carries."""
    if reply.metadata.message_type == MessageTypeLegacy.GET_PROPERTIES:
        return recorddict_compat.recorddict_to_getpropertiesres(reply.content).properties
    return reply.content.config_records[PROPERTIES]


def _no_partition(server_round: int, proxy: ClientProxy, err: BaseException) -> None:
    log.warning("round %d: client %s did not report its partition (%r)", server_round, proxy.cid, err)
