"""Every method on Flower's Message API (``flwr.serverapp`` strategies, ClientApp handlers).

Flower 1.42's own apps drive a :class:`flwr.serverapp.strategy.Strategy` with
``strategy.start(grid=..., initial_arrays=..., num_rounds=...)`` and answer with
``@app.train()`` / ``@app.evaluate()`` handlers that exchange ``ArrayRecord``,
``ConfigRecord`` and ``MetricRecord``. This module puts our methods on that API
without a second copy of any of them:

* :class:`MessageStrategy` is a Message-API strategy that drives one of our
  :class:`~fedapp.flower.strategy.FedAppStrategy` objects (DP wrapper included), the
  same object the legacy path runs: the grid's nodes become the proxies it samples,
  its instructions become Messages and the replies become the ``FitRes`` /
  ``EvaluateRes`` it validates, aggregates, accounts for and records. Sampling,
  reply validation, aggregation order, byte accounting, held-out clients, checkpoints
  and resume are therefore those of the legacy path, computed by the same code.
* :func:`~fedapp.flower.message_records.answer` is the client side: a Message-API reply from a
  method's ``NumPyClient`` (``fedapp.client_app`` builds it, as for the legacy path). It lives in
  :mod:`fedapp.flower.message_records`, which imports none of Flower's server side.

The records a message holds (the layout of Flower's templates):

==============  ================================================  =====================================
message         instruction (server to client)                    reply (client to server)
==============  ================================================  =====================================
``train``       ``"arrays"`` ArrayRecord, ``"config"`` ConfigRecord  ``"arrays"``, ``"metrics"`` MetricRecord
``evaluate``    ``"arrays"``, ``"config"``                          ``"metrics"`` (``loss`` among them)
``query``       ``"config"``                                       ``"properties"`` ConfigRecord
==============  ================================================  =====================================

A reply's ``"metrics"`` carry ``num-examples`` (Flower's weighting key); metrics that
are not numbers (a MetricRecord holds only ints and floats) travel in a
``"details"`` ConfigRecord beside it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import (
    Code,
    EvaluateRes,
    FitRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedapp.config import RunConfig
from fedapp.errors import ConfigError
from fedapp.extras import check_server_extras
from fedapp.flower.message_records import (
    ARRAYS,
    CONFIG,
    LOSS,
    NUM_EXAMPLES,
    arrays_of,
    joined_metrics,
)
from fedapp.flower.pending_index import index_pending_messages
from fedapp.flower.privacy import wrap_for_privacy
from fedapp.flower.sampling import reply_properties
from fedapp.flower.strategy import FedAppStrategy
from fedapp.registry import strategy_class

log = logging.getLogger("flwr.fedapp")

#: ``timeout`` for ``Strategy.start`` when ``round-timeout`` = 0: wait for every reply, as the legacy path does.
NO_TIMEOUT = math.inf


# ----- server side ---------------------------------------------------------------


class NodeProxy(ClientProxy):
    """A node of the grid, as the proxy our sampler asks for its partition (a ``query``
    message); training and evaluation go out as Messages from :class:`MessageStrategy`."""

    def __init__(self, node_id: int, grid: Grid) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id
        self.grid = grid

    def query_message(self, ins: GetPropertiesIns, group_id: int | None) -> Message:
        """The ``query`` message asking this node ``ins`` (the sampler sends a round's in one batch)."""
        return Message(
            RecordDict({CONFIG: ConfigRecord(dict(ins.config))}),
            dst_node_id=self.node_id,
            message_type=MessageType.QUERY,
            group_id=str(group_id or ""),
        )

    def get_properties(self, ins, timeout, group_id) -> GetPropertiesRes:
        replies = list(self.grid.send_and_receive([self.query_message(ins, group_id)], timeout=timeout))
        if len(replies) != 1:
            raise TimeoutError(f"node {self.node_id} did not answer its query")
        if replies[0].has_error():
            raise RuntimeError(replies[0].error.reason)
        return GetPropertiesRes(Status(Code.OK, ""), dict(reply_properties(replies[0])))

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError("MessageStrategy sends the global arrays itself")

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError("MessageStrategy sends training messages itself")

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError("MessageStrategy sends evaluation messages itself")

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


class GridNodes(SimpleClientManager):
    """The grid's connected nodes as a client manager (what our sampler draws from),
    refreshed whenever it is asked."""

    def __init__(self, grid: Grid, poll_seconds: float = 0.5) -> None:
        super().__init__()
        self.grid = grid
        self.poll_seconds = poll_seconds

    def refresh(self) -> None:
        node_ids = set(self.grid.get_node_ids())
        for cid, proxy in list(self.clients.items()):
            if int(cid) not in node_ids:
                self.unregister(proxy)
        for node_id in sorted(node_ids - {int(cid) for cid in self.clients}):
            self.register(NodeProxy(node_id, self.grid))

    def num_available(self) -> int:
        self.refresh()
        return super().num_available()

    def all(self) -> dict[str, ClientProxy]:
        self.refresh()
        return super().all()

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        deadline = time.monotonic() + timeout
        while self.num_available() < num_clients:
            if time.monotonic() > deadline:
                return False
            time.sleep(self.poll_seconds)
        return True


class ClientFailure(RuntimeError):
    """A node that answered with an error, or not at all, in a round."""


class MessageStrategy(Strategy):
    """One of our methods as a Flower Message-API strategy.

    Parameters
    ----------
    strategy
        The method's :class:`~fedapp.flower.strategy.FedAppStrategy` (or its DP wrapper);
        it keeps all the method's state, its records and its checkpoints.

    See Also
    --------
    from_config : The configured method's strategy, DP wrapper included.

    Examples
    --------
    In a ServerApp of your own (``flwr new`` style)::

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            config = resolve_run_config(context.run_config)
            strategy = MessageStrategy.from_config(config)
            strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=config.num_rounds)
    """

    def __init__(self, strategy: FedAppStrategy) -> None:
        self.strategy = strategy
        self._nodes: GridNodes | None = None
        self._sent: dict[int, dict[int, ClientProxy]] = {}
        self._checked_start = False

    @classmethod
    def from_config(cls, config: RunConfig, *, record: bool = False) -> MessageStrategy:
        """The strategy of ``config.method`` (:meth:`FedAppStrategy.from_config`: the data is
        checked first; ``record`` writes the results folder), wrapped for DP when ``dp`` is on."""
        if record:
            check_server_extras(config)
        strategy = strategy_class(config.method).from_config(config, record=record)
        return cls(wrap_for_privacy(strategy, config))

    def __repr__(self) -> str:
        return f"MessageStrategy({self.strategy!r})"

    @property
    def completed_rounds(self) -> int:
        """Rounds a resumed run had finished before this process (0 for a fresh run)."""
        return self.strategy.completed_rounds

    def resume(self) -> int:
        """Continue from the run's checkpoint (:meth:`FedAppStrategy.resume`); returns the
        rounds it had completed. ``start`` then numbers its rounds after them."""
        return self.strategy.resume()

    def rounds_left(self) -> int:
        """``num-rounds`` less the rounds a resumed run had completed: ``num_rounds`` for ``start``."""
        return max(self.strategy.config.num_rounds - self.completed_rounds, 0)

    def initial_arrays(self) -> ArrayRecord:
        """The global arrays round 1 sends (a resumed run's: its checkpoint's), for ``start``."""
        parameters = self.strategy.initialize_parameters(SimpleClientManager())
        return ArrayRecord(parameters_to_ndarrays(parameters) if parameters is not None else [])

    def summary(self) -> None:
        log.info("%r on Flower's Message API", self.strategy)

    # ----- Message API -------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._configure(MessageType.TRAIN, server_round + self.completed_rounds, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round += self.completed_rounds
        results, failures = self._replies(server_round, replies, _fit_res)
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        arrays = None if parameters is None else ArrayRecord(parameters_to_ndarrays(parameters))
        return arrays, _metric_record(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._configure(MessageType.EVALUATE, server_round + self.completed_rounds, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        server_round += self.completed_rounds
        results, failures = self._replies(server_round, replies, _evaluate_res)
        loss, metrics = self.strategy.aggregate_evaluate(server_round, results, failures)
        return _metric_record({**metrics, **({LOSS: loss} if loss is not None else {})})

    # ----- translation ---------------------------------------------------------

    def _grid_nodes(self, grid: Grid) -> GridNodes:
        if self._nodes is None or self._nodes.grid is not grid:
            index_pending_messages(grid)  # in a user's own ServerApp too (a simulation's grid only)
            self._nodes = GridNodes(grid)
        return self._nodes

    def _parameters(self, arrays: ArrayRecord) -> Parameters:
        ndarrays = arrays.to_numpy_ndarrays()
        if not self._checked_start:  # the first round: the arrays start() was given
            self._checked_start = True
            expected = self.strategy.global_arrays
            layout = [(a.shape, a.dtype) for a in ndarrays]
            if layout != [(a.shape, a.dtype) for a in expected]:
                raise ConfigError(
                    f"initial_arrays: {len(ndarrays)} arrays that are not the method's {len(expected)} global "
                    "arrays; start the strategy with initial_arrays=strategy.initial_arrays()"
                )
        return ndarrays_to_parameters(ndarrays)

    def _configure(
        self, kind: str, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """The strategy's ``configure_fit`` / ``configure_evaluate`` instructions, as Messages."""
        parameters = self._parameters(arrays)
        configure = self.strategy.configure_fit if kind == MessageType.TRAIN else self.strategy.configure_evaluate
        instructions = configure(server_round, parameters, self._grid_nodes(grid))
        self._sent[server_round] = {int(proxy.cid): proxy for proxy, _ in instructions}
        # One record per distinct payload (usually one for all); the global arrays go out as given.
        records: dict[int, ArrayRecord] = {id(parameters): arrays}
        messages = []
        for proxy, ins in instructions:
            key = id(ins.parameters)
            if key not in records:
                records[key] = ArrayRecord(parameters_to_ndarrays(ins.parameters))
            content = RecordDict({ARRAYS: records[key], CONFIG: ConfigRecord({**dict(config), **ins.config})})
            messages.append(Message(content, dst_node_id=int(proxy.cid), message_type=kind, group_id=str(server_round)))
        return messages

    def _replies(self, server_round: int, replies: Iterable[Message], decode) -> tuple[list, list]:
        """``(results, failures)`` as the legacy server hands them over: a reply with an
        error, one that cannot be read, and a node that did not reply are failures."""
        waiting = self._sent.pop(server_round, {})
        results, failures = [], []
        for reply in replies:
            proxy = waiting.pop(reply.metadata.src_node_id, None)
            if proxy is None:
                continue  # not sent this round (Flower does not hand over such replies)
            name = self.strategy.client_name(proxy)
            if reply.has_error():
                failures.append(ClientFailure(f"{name}: {reply.error.reason}"))
                continue
            try:
                results.append((proxy, decode(reply.content)))
            except (KeyError, TypeError, ValueError) as err:
                failures.append(ClientFailure(f"{name}: unreadable reply ({type(err).__name__}: {err})"))
        timeout = self.strategy.config.round_timeout
        within = f" within round-timeout = {timeout:g}s" if timeout > 0 else ""
        failures += [ClientFailure(f"{self.strategy.client_name(p)}: no reply{within}") for p in waiting.values()]
        return results, failures


def _fit_res(content: RecordDict) -> FitRes:
    metrics = joined_metrics(content)
    num_examples = int(metrics.pop(NUM_EXAMPLES))
    parameters = ndarrays_to_parameters(arrays_of(content))
    return FitRes(Status(Code.OK, ""), parameters, num_examples, metrics)


def _evaluate_res(content: RecordDict) -> EvaluateRes:
    metrics = joined_metrics(content)
    num_examples, loss = int(metrics.pop(NUM_EXAMPLES)), float(metrics.pop(LOSS))
    return EvaluateRes(Status(Code.OK, ""), loss, num_examples, metrics)


def _metric_record(metrics: Mapping[str, Scalar]) -> MetricRecord | None:
    numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    numbers = {k: v for k, v in numbers.items() if not (isinstance(v, float) and math.isnan(v))}
    return MetricRecord(numbers) if numbers else None
