"""Which clients take part in a round: a draw that depends on (seed, round) only, over the
pool sorted by partition (:meth:`ClientSampler.sample`); the held-out partitions, which
never train; and asking each node its partition, once (node ids change from one run or
restart to the next, partitions do not).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
from flwr.common import GetPropertiesIns
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from fedapp.config import RunConfig, domain_of_partition, held_out_partitions

log = logging.getLogger("flwr.fedapp")

_Reply = TypeVar("_Reply")


class ClientSampler:
    """Picks a round's clients and remembers every node's partition.

    Parameters
    ----------
    config
        The run configuration: ``seed``, ``min-clients``, ``partition`` and the
        held-out settings (:func:`fedapp.config.held_out_partitions`).
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        #: Partitions that never train.
        self.held_out: frozenset[int] = held_out_partitions(config)
        #: Node id -> partition, for every node that answered.
        self.partition_of: dict[str, int] = {}

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
        """Learn the partition of every node not asked yet, all at once."""
        missing = [proxy for proxy in proxies if proxy.cid not in self.partition_of]
        if missing:
            with ThreadPoolExecutor(max_workers=min(16, len(missing))) as pool:
                list(pool.map(lambda proxy: self.partition(proxy, server_round), missing))

    def partition(self, proxy: ClientProxy, server_round: int) -> int | None:
        """The client's partition id, asked once (None if it does not answer; it is asked again next time)."""
        if proxy.cid not in self.partition_of:
            try:
                res = proxy.get_properties(GetPropertiesIns(config={}), timeout=None, group_id=server_round)
                self.partition_of[proxy.cid] = int(res.properties["partition-id"])
            except Exception as err:  # a client that cannot answer is left out this round, not fatal
                log.warning("round %d: client %s did not report its partition (%r)", server_round, proxy.cid, err)
                return None
        return self.partition_of[proxy.cid]

    def is_held_out(self, cid: str) -> bool:
        """Whether node ``cid`` holds a held-out partition (False while its partition is unknown)."""
        return self.partition_of.get(cid) in self.held_out

    def split_held_out(
        self, replies: Sequence[tuple[ClientProxy, _Reply]]
    ) -> tuple[list[tuple[ClientProxy, _Reply]], list[tuple[ClientProxy, _Reply]]]:
        """``(training clients' replies, held-out clients' replies)``, each in the given order."""
        held = [(p, r) for p, r in replies if self.is_held_out(p.cid)]
        kept = [(p, r) for p, r in replies if not self.is_held_out(p.cid)]
        return kept, held

    def domain_of(self, cid: str) -> int | None:
        """The domain of node ``cid``'s partition (``partition = domain``), else None (also while unknown)."""
        partition = self.partition_of.get(cid)
        return None if partition is None else domain_of_partition(self.config, partition)
