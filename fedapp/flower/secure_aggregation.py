"""Secure aggregation (SecAgg+) through Flower's ``secaggplus_mod`` and ``SecAggPlusWorkflow``.

With ``secagg = true`` every client masks its upload before it leaves the
device, and the server learns only the example-weighted average of the round's
uploads, never one client's arrays. Each participant's example count and fit
metrics still travel in the clear (SecAgg+ weights the sum by them).

The pieces:

* :func:`fedapp.secagg.check_secagg_config`: the config rules (which methods, share counts,
  quantization limits), run by :func:`fedapp.config.validate`;
* :func:`fedapp.flower.client_mods.secagg_client_mod`: the ClientApp mod; it runs Flower's
  ``secaggplus_mod`` for the messages of a SecAgg+ round and passes every other
  message through, so it is always installed;
* :func:`run_secagg`: the ServerApp side; it drives the strategy through
  ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))``;
* :class:`SecAggReplies`: what tells a :class:`~fedapp.flower.strategy.FedAppStrategy`
  that the round's replies carry the unmasked aggregate rather than each
  client's arrays.

What ``SecAggPlusWorkflow`` hands to ``Strategy.aggregate_fit`` (Flower 1.42):
one ``(proxy, FitRes)`` per client whose masked vector was summed, each with
that client's own ``num_examples`` and ``metrics`` but all sharing one
``Parameters``: the dequantized sum divided by the (quantized) sum of weights,
i.e. the example-weighted *average*, as float64 arrays.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.common import FitRes, ndarray_to_bytes, parameters_to_ndarrays
from flwr.server import ServerConfig, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp.grid import Grid

from fedapp.aggregation import Arrays, metrics_problem, update_problem
from fedapp.config import RunConfig
from fedapp.errors import ConfigError
from fedapp.flower.recording import RoundLog, num_params
from fedapp.flower.replies import ClientUpdate, reply_order
from fedapp.flower.strategy import FedAppStrategy
from fedapp.secagg import MODULUS_RANGE, secagg_workflow_options

log = logging.getLogger("flwr.fedapp")


# ----- server side ---------------------------------------------------------------


@dataclass
class SecAggReplies:
    """Tells a FedAppStrategy that every fit reply carries the round's unmasked
    SecAgg+ aggregate (an example-weighted average) instead of the client's arrays.

    Set as the strategy's ``secure_aggregation``; its :meth:`updates` then takes
    the place of per-reply validation: participants are counted and their
    metrics used one by one, the aggregate is validated once and handed to
    ``aggregate_updates`` as a single update carrying every participant's examples.
    """

    clipping_range: float
    quantization_range: int
    max_weight: float
    aggregated_rounds: set[int] = field(default_factory=set)

    def updates(
        self,
        strategy: FedAppStrategy,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        round_log: RoundLog,
    ) -> tuple[list[ClientUpdate], list[ClientUpdate]]:
        """``(participants, to_aggregate)``: one update per usable participant
        (no arrays; its count and metrics), and the aggregate as one update
        (empty when it cannot be used, which skips the round)."""

        self.aggregated_rounds.add(server_round)
        expected = strategy.expected_update()
        bytes_up = _masked_bytes(expected or [])
        participants: list[ClientUpdate] = []
        for proxy, res in results:
            problem = update_problem([], res.num_examples, None) or metrics_problem(res.metrics)
            if problem is not None:
                strategy.leave_out(server_round, round_log, proxy, res.metrics, problem)
                continue
            update = ClientUpdate(proxy.cid, [], res.num_examples, dict(res.metrics), bytes_up)
            participants.append(strategy.accept(round_log, update, num_params(expected or [])))
        participants.sort(key=reply_order)
        if not participants:
            return [], []
        problem = None
        if len(participants) < len(results):
            problem = "the secure sum includes the unusable replies above and cannot be taken apart"
        else:
            arrays, problem = self._aggregate(results, expected)
        if problem is not None:
            log.warning("round %d: secure aggregate not used: %s", server_round, problem)
            round_log.left_out.append(f"secure aggregate: {problem}")
            return participants, []
        total = sum(u.num_examples for u in participants)
        return participants, [ClientUpdate("secagg+", arrays, total, {}, 0)]

    def _aggregate(
        self, results: list[tuple[ClientProxy, FitRes]], expected: Arrays | None
    ) -> tuple[Arrays, str | None]:
        """The unmasked aggregate in the global arrays' dtypes, or why it is unusable."""
        first = results[0][1].parameters
        if any(res.parameters is not first and res.parameters.tensors != first.tensors for _, res in results):
            return [], "the replies carry different arrays (not a SecAgg+ round?)"
        counts = [int(res.num_examples) for _, res in results]
        levels = self.quantization_range
        if len(counts) * levels >= MODULUS_RANGE:
            return [], f"{len(counts)} participants x secagg-quantization-range {levels} overflow the modulus 2**32"
        if sum(round(n / self.max_weight * levels) for n in counts) >= MODULUS_RANGE:
            return [], f"the example counts ({sum(counts)} in all) overflow the weight sum; raise secagg-max-weight"
        try:
            arrays = parameters_to_ndarrays(first)
        except Exception as err:
            return [], f"undecodable aggregate ({err})"
        if expected is not None and len(arrays) == len(expected):
            if any(not np.issubdtype(ref.dtype, np.floating) for ref in expected):
                return [], "the global arrays include integer arrays, which SecAgg+ cannot average"
            arrays = [a.astype(ref.dtype) for a, ref in zip(arrays, expected, strict=True)]
        problem = update_problem(arrays, sum(counts), expected)
        if problem is not None:
            return [], problem
        peak = max((float(np.abs(a).max()) for a in arrays if a.size), default=0.0)
        scale = max(1.0, max(counts) / self.max_weight)
        if peak * scale > self.clipping_range / 2:
            log.warning(
                "secure aggregate reaches %.3g (x %.3g for the largest example count), near secagg-clipping-range "
                "= %g: clients' values beyond it may have been clipped; raise secagg-clipping-range",
                peak,
                scale,
                self.clipping_range,
            )
        return arrays, None


def _masked_bytes(arrays: Arrays) -> int:
    """Bytes of one client's masked upload: int64 arrays of the shared shapes plus the weight."""
    shapes = [(1,), *(a.shape for a in arrays)]
    return sum(len(ndarray_to_bytes(np.zeros(shape, np.int64))) for shape in shapes)


class FedAppSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ fit workflow, noting a round the protocol halted in
    (too few clients or shares) as skipped in the strategy's metrics."""

    def __init__(self, strategy: FedAppStrategy, replies: SecAggReplies, **options: Any) -> None:
        super().__init__(**options)
        self.strategy = strategy
        self.replies = replies

    def __call__(self, grid: Grid, context: Context) -> None:
        super().__call__(grid, context)
        current_round = int(context.state.config_records[MAIN_CONFIGS_RECORD][WorkflowKey.CURRENT_ROUND])
        if current_round not in self.replies.aggregated_rounds:
            self.strategy.skip_round(
                current_round, "secure aggregation halted (too few clients or key shares; see the log)"
            )


def fedapp_strategy(strategy: Strategy) -> FedAppStrategy:
    """Our strategy, inside any wrappers (Flower's DP wrappers keep it as ``.strategy``)."""

    inner: Any = strategy
    while not isinstance(inner, FedAppStrategy):
        inner = getattr(inner, "strategy", None)
        if inner is None:
            raise TypeError(f"{type(strategy).__name__} is not (a wrapper of) a FedAppStrategy")
    return inner


def check_float_uploads(strategy: FedAppStrategy) -> None:
    """Refuse a run whose shared arrays include integer ones (SecAgg+ averages floats only)."""
    integers = [i for i, a in enumerate(strategy.initial_arrays()) if not np.issubdtype(a.dtype, np.floating)]
    if integers:
        raise ConfigError(
            f"config key 'secagg' = true: method '{strategy.config['method']}' would upload integer arrays "
            f"(positions {integers}, e.g. BatchNorm's batch counter), which SecAgg+ cannot average; "
            "choose models without BatchNorm (the cnn-* models)"
        )


def run_secagg(grid: Grid, context: Context, strategy: Strategy, config: RunConfig, server_config: ServerConfig):
    """Run the whole federation through ``DefaultWorkflow`` with SecAgg+ fit rounds.

    ``strategy`` is this project's strategy, possibly wrapped; returns the
    finished :class:`~flwr.server.LegacyContext` (strategy and History).
    """
    inner = fedapp_strategy(strategy)
    check_float_uploads(inner)
    options = secagg_workflow_options(config)
    replies = SecAggReplies(options["clipping_range"], options["quantization_range"], options["max_weight"])
    inner.secure_aggregation = replies
    log.info(
        "secure aggregation (SecAgg+): num_shares=%s, reconstruction_threshold=%s, clipping_range=%g, "
        "quantization_range=%d, max_weight=%g",
        options["num_shares"],
        options["reconstruction_threshold"],
        options["clipping_range"],
        options["quantization_range"],
        options["max_weight"],
    )
    legacy = LegacyContext(
        context=context, config=server_config, strategy=strategy, client_manager=SimpleClientManager()
    )
    DefaultWorkflow(fit_workflow=FedAppSecAggPlusWorkflow(inner, replies, **options))(grid, legacy)
    return legacy
