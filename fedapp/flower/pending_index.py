"""A per-node index of the undelivered messages in a Flower simulation's link state.

Flower's simulation engine hands messages to its workers from a loop that, every
0.1 s, asks the in-memory link state for a queued message once per node
(``vce_api.add_messages_to_queue``). Each ask (``InMemoryLinkState.get_message_ins``)
checks every stored message, delivered ones included until their replies are pulled,
so with a round's M messages out one pass over N nodes costs N x M message checks:
2.2 s at 10,000 nodes and 100 messages, a core kept busy beside the workers for the
whole round (``benchmarks/simulation_poll.py``).

:func:`index_pending_messages` gives the simulation's state (the one object the
ServerApp's grid and the engine share) a ``get_message_ins`` that answers from an
index of undelivered messages by destination node, rebuilt whenever a message is
stored or deleted. It returns what Flower's own returns, in the same order, marks
the same messages delivered and checks each returned message for expiry and
federation membership first, as Flower's does; the one difference is that an
expired message waiting for another node is purged when that node is asked (every
pass) or its reply is pulled, not on any node's ask.
"""

from __future__ import annotations

import logging

from flwr.app import Message
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.serverapp import Grid
from flwr.supercore.date import now
from flwr.superlink.grid import InMemoryGrid

log = logging.getLogger("flwr.fedapp")

#: What the index reads of Flower 1.42's ``InMemoryLinkState`` (its own ``get_message_ins`` reads them too).
STATE_INTERNALS = ("lock", "message_ins_store", "_check_stored_messages")


class PendingIndex:
    """``get_message_ins`` for ``state``, answered from an index of its undelivered messages.

    Parameters
    ----------
    state
        The simulation's in-memory link state; its own lock guards the index too.
    """

    def __init__(self, state: InMemoryLinkState) -> None:
        self.state = state
        self._indexed_ids: set[str] = set()
        self._pending: dict[int, list[str]] = {}

    def _rebuild(self) -> None:
        """Index the stored messages not yet delivered by destination node, in the order stored."""
        store = self.state.message_ins_store
        self._indexed_ids = set(store)
        self._pending = {}
        for msg_id, message in store.items():
            if message.metadata.delivered_at == "":
                self._pending.setdefault(message.metadata.dst_node_id, []).append(msg_id)

    def __call__(self, node_id: int, limit: int | None, *, run_id: int | None = None) -> list[Message]:
        """The messages for ``node_id`` not delivered yet (at most ``limit``), now marked delivered."""
        if limit is not None and limit < 1:
            raise AssertionError("`limit` must be >= 1")  # what Flower's raises
        found: list[Message] = []
        state = self.state
        with state.lock:
            if state.message_ins_store.keys() != self._indexed_ids:  # stored or deleted since
                self._rebuild()
            pending = self._pending.get(node_id)
            for msg_id in list(pending or ()):
                state._check_stored_messages({msg_id})  # expired or out of the federation: deleted
                message = state.message_ins_store.get(msg_id)
                if message is None or message.metadata.delivered_at != "":
                    pending.remove(msg_id)
                    continue
                if run_id is not None and message.metadata.run_id != run_id:
                    continue
                found.append(message)
                pending.remove(msg_id)
                if limit and len(found) == limit:
                    break
            delivered_at = now().isoformat()
            for message in found:
                message.metadata.delivered_at = delivered_at
        return found


def index_pending_messages(grid: Grid) -> bool:
    """Give a simulation's link state a :class:`PendingIndex` (once); whether it has one.

    Only an :class:`~flwr.superlink.grid.InMemoryGrid` over Flower's
    :class:`InMemoryLinkState` (a simulation's) gets it; a deployment's SuperLink runs
    in another process, and its grid is left as it is.
    """
    if not isinstance(grid, InMemoryGrid):
        return False
    state = grid.state
    if not isinstance(state, InMemoryLinkState):
        return False
    if not all(hasattr(state, name) for name in STATE_INTERNALS):  # another Flower than 1.42's: its own scan
        log.debug("simulation link state without %s: Flower's own get_message_ins kept", ", ".join(STATE_INTERNALS))
        return False
    if isinstance(state.get_message_ins, PendingIndex):
        return True
    # The engine looks the method up on every ask, so the instance's attribute takes over at once.
    state.get_message_ins = PendingIndex(state)  # type: ignore[method-assign]
    log.debug("simulation link state: undelivered messages indexed by node")
    return True
