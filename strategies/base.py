"""What every method's server side shares: sampling, validation, bytes, metrics.

A method's strategy subclasses :class:`FedAppStrategy` and fills in three
hooks: :meth:`~FedAppStrategy.initial_arrays` (the global state it starts
from), :meth:`~FedAppStrategy.aggregate_updates` (how validated client payloads
become the next global state) and, optionally,
:meth:`~FedAppStrategy.fit_config`. Everything else, including the per-round
metrics line, happens here once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetPropertiesIns,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from torch import nn

from fedapp.aggregation import Arrays, update_problem
from fedapp.clientdata import check_data
from fedapp.config import RunConfig, held_out_partitions
from fedapp.errors import ConfigError
from fedapp.metrics import MB, AccuracyStats, RoundRecord, RunRecorder, payload_bytes, progress_line
from fedapp.models import build_model
from fedapp.registry import strategy_class

log = logging.getLogger("flwr.fedapp")

_S = TypeVar("_S", bound="FedAppStrategy")


@dataclass(frozen=True)
class ClientUpdate:
    """One client's validated reply to a fit instruction."""

    cid: str
    arrays: Arrays
    num_examples: int
    metrics: dict[str, Scalar]
    bytes_up: int


@dataclass
class _RoundLog:
    """What a round accumulates between fit and evaluate."""

    started: float = field(default_factory=time.perf_counter)
    clients_fit: int = 0
    clients_failed: int = 0
    train_loss: float = float("nan")
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    params_up: list[int] = field(default_factory=list)
    params_down: list[int] = field(default_factory=list)
    train_flops: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class FedAppStrategy(Strategy):
    """Base strategy of every method in this project.

    Parameters
    ----------
    config
        The validated run configuration.
    num_classes
        Classes of the task (the output size of every model).
    recorder
        Where per-round metrics go; None keeps them in memory only
        (:attr:`history`), e.g. inside someone else's ServerApp.
    class_names
        The task's class names, for methods whose server reads them (FedD2P's
        class descriptions); default ``"0"``, ``"1"``, ...

    See Also
    --------
    from_config : Build a strategy from the run configuration alone, reading
        ``num_classes`` and ``class_names`` from the configured data (what a
        ServerApp of your own should use).
    """

    #: Whether the method keeps one global model whose accuracy is meaningful.
    has_global_model: bool = True

    def __init__(
        self,
        config: RunConfig,
        num_classes: int,
        recorder: RunRecorder | None = None,
        class_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.num_classes = num_classes
        self.class_names = tuple(class_names) if class_names is not None else tuple(map(str, range(num_classes)))
        if len(self.class_names) != num_classes:
            raise ValueError(f"{len(self.class_names)} class names for {num_classes} classes")
        self.recorder = recorder
        self.history: list[RoundRecord] = []
        self._round_log: dict[int, _RoundLog] = {}
        self._mb_cumulative = 0.0
        self._params_cumulative = 0
        self._flops_cumulative = 0
        self._global: Arrays = []
        self._held_out = held_out_partitions(config.values)
        self._partition_of: dict[str, int] = {}

    @classmethod
    def from_config(cls: type[_S], config: RunConfig, *, record: bool = False) -> _S:
        """Build this strategy from a run configuration alone.

        Loads and partitions the configured data once, as this project's own
        ServerApp does, so that a missing folder, a corrupt image or an empty
        partition stops the run before any client trains, and takes
        ``num_classes`` and ``class_names`` from it: they then agree with what
        every client builds from the same configuration.

        Parameters
        ----------
        config
            The validated run configuration
            (:func:`fedapp.config.resolve_run_config`). Its ``method`` selects
            the ClientApp's side and must be one this class serves; its
            ``num-rounds`` should equal the ``ServerConfig``'s (it numbers the
            progress lines and triggers the final plots).
        record
            Whether to write the results folder (``results-dir``/``run-name``:
            metrics, summary and plots) as rounds complete; by default the
            per-round records are kept in memory only, in :attr:`history`.

        Returns
        -------
        FedAppStrategy
            An instance of ``cls``.

        Raises
        ------
        fedapp.errors.ConfigError
            If ``cls`` is not (a subclass of) the strategy that the registry
            names for ``config["method"]``.
        fedapp.errors.DataError
            If the configured data is missing, unreadable or cannot be split
            into ``num-partitions`` non-empty partitions.

        Examples
        --------
        >>> from fedapp.config import resolve_run_config
        >>> from strategies import PFedLoRAStrategy
        >>> config = resolve_run_config({"method": "pfedlora", "num-partitions": 2})
        >>> PFedLoRAStrategy.from_config(config)
        PFedLoRAStrategy(method='pfedlora')
        """
        method = str(config["method"])
        expected = strategy_class(method)
        if not issubclass(cls, expected):
            raise ConfigError(
                f"config key 'method' = {method!r} is served by {expected.__name__}, not {cls.__name__}; "
                f"the ClientApp runs the clients of {method!r}"
            )
        source = check_data(config, int(config["num-partitions"]))
        recorder = None
        if record:
            recorder = RunRecorder(
                config["results-dir"], config.run_name, config.as_dict(), float(config["target-accuracy"])
            )
            log.info("results go to %s", recorder.directory)
        return cls(config, source.num_classes, recorder, source.class_names)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.config['method']!r})"

    @property
    def global_arrays(self) -> Arrays:
        """The current global arrays: the initial ones after initialisation, then
        the latest aggregate (empty before the run starts, or when nothing is shared)."""
        return list(self._global)

    def zoo_model(self, name: str) -> nn.Module:
        """A zoo model for this task (same shapes as the clients build)."""
        return build_model(name, self.num_classes, image_size=int(self.config["image-size"]))

    # ----- hooks for methods -------------------------------------------------

    def initial_arrays(self) -> Arrays:
        """The global arrays sent in round 1 (empty when nothing is shared)."""
        raise NotImplementedError

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> Arrays:
        """Merge validated client payloads into the next global arrays."""
        raise NotImplementedError

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        """Per-round instructions sent with the global arrays."""
        return {"server-round": server_round}

    def add_round_metric(self, server_round: int, name: str, value: float) -> None:
        """Log a server-side figure of this round (e.g. a loss) in its metrics line."""
        self._round_log.setdefault(server_round, _RoundLog()).extra[name] = value

    def expected_update(self) -> Arrays | None:
        """Arrays a client's upload must match in shape and dtype (None: no check)."""
        return self._global or None

    # ----- Flower Strategy interface -----------------------------------------

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        self._global = self.initial_arrays()
        return ndarrays_to_parameters(self._global)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self._round_log[server_round] = _RoundLog()
        clients = self._sample(server_round, client_manager, float(self.config["fraction-fit"]), salt=0, training=True)
        fit_ins = FitIns(parameters, self.fit_config(server_round))
        round_log = self._round_log[server_round]
        round_log.bytes_down = [payload_bytes(parameters.tensors)] * len(clients)
        round_log.params_down = [_num_params(parameters_to_ndarrays(parameters))] * len(clients)
        return [(client, fit_ins) for client in clients]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        round_log = self._round_log.setdefault(server_round, _RoundLog())
        updates = self._validated(server_round, results, round_log)
        round_log.clients_failed += len(failures)
        for failure in failures:
            log.warning("round %d: a client failed: %r", server_round, failure)
        round_log.clients_fit = len(updates)
        if len(updates) < int(self.config["min-clients"]) or not updates:
            log.warning(
                "round %d: %d usable updates, fewer than min-clients = %d; keeping the previous global state",
                server_round,
                len(updates),
                self.config["min-clients"],
            )
            return None, {}
        losses = [(float(u.metrics["train_loss"]), u.num_examples) for u in updates if "train_loss" in u.metrics]
        if losses:
            total = sum(n for _, n in losses)
            round_log.train_loss = sum(loss * n for loss, n in losses) / total
        round_log.extra.update(_mean_metrics([(u.metrics, u.num_examples) for u in updates], "fit"))
        self._global = self.aggregate_updates(server_round, updates)
        return ndarrays_to_parameters(self._global), {"train_loss": round_log.train_loss}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        clients = self._sample(
            server_round, client_manager, float(self.config["fraction-evaluate"]), salt=1, training=False
        )
        ins = EvaluateIns(parameters, {"server-round": server_round})
        return [(client, ins) for client in clients]

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        held_out = [(p, r) for p, r in results if self._partition_of.get(p.cid) in self._held_out]
        results = [(p, r) for p, r in results if self._partition_of.get(p.cid) not in self._held_out]
        stats = AccuracyStats.of([float(res.metrics.get("accuracy", math.nan)) for _, res in results])
        global_acc = None
        if self.has_global_model and results:
            # The pooled accuracy of the one global model over every client's test set.
            total = sum(res.num_examples for _, res in results)
            global_acc = sum(float(res.metrics.get("accuracy", 0.0)) * res.num_examples for _, res in results) / max(
                total, 1
            )
        eval_extra = _mean_metrics([(dict(res.metrics), res.num_examples) for _, res in results], "eval")
        if held_out:
            held = AccuracyStats.of([float(res.metrics.get("accuracy", math.nan)) for _, res in held_out])
            eval_extra.update(held_out_acc_mean=held.mean, held_out_acc_worst=held.worst, held_out_clients=held.clients)
        self._record_round(server_round, stats, global_acc, failures, eval_extra)
        losses = [(res.loss, res.num_examples) for _, res in results if res.num_examples > 0]
        loss = sum(v * n for v, n in losses) / sum(n for _, n in losses) if losses else None
        return loss, {"acc_mean": stats.mean, "acc_worst": stats.worst}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None  # every method is evaluated on the clients' own test sets

    # ----- shared machinery ----------------------------------------------------

    def _sample(
        self, server_round: int, client_manager: ClientManager, fraction: float, salt: int, training: bool
    ) -> list[ClientProxy]:
        """Pick clients as a function of (seed, round) only, over a sorted pool.

        Held-out clients are never picked to train; they are evaluated only
        when the method has a global state for them to use.
        """
        min_clients = int(self.config["min-clients"])
        client_manager.wait_for(min_clients)
        pool = client_manager.all()
        if self._held_out:
            keep_held_out = not training and self.has_global_model
            pool = {
                cid: proxy
                for cid, proxy in pool.items()
                if (partition := self._partition(proxy, server_round)) is not None
                and (keep_held_out or partition not in self._held_out)
            }
        ids = sorted(pool)
        count = min(len(ids), max(min_clients, math.ceil(fraction * len(ids))))
        rng = np.random.default_rng([int(self.config["seed"]), server_round, salt])
        chosen = sorted(rng.choice(len(ids), size=count, replace=False)) if count < len(ids) else range(len(ids))
        return [pool[ids[i]] for i in chosen]

    def _partition(self, proxy: ClientProxy, server_round: int) -> int | None:
        """The client's partition id, asked once (None if it does not answer)."""
        if proxy.cid not in self._partition_of:
            try:
                res = proxy.get_properties(GetPropertiesIns(config={}), timeout=None, group_id=server_round)
                self._partition_of[proxy.cid] = int(res.properties["partition-id"])
            except Exception as err:  # a client that cannot answer is left out this round, not fatal
                log.warning("round %d: client %s did not report its partition (%r)", server_round, proxy.cid, err)
                return None
        return self._partition_of[proxy.cid]

    def _validated(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], round_log: _RoundLog
    ) -> list[ClientUpdate]:
        expected = self.expected_update()
        updates = []
        for proxy, res in results:
            up = payload_bytes(res.parameters.tensors)
            try:
                arrays = parameters_to_ndarrays(res.parameters)
            except Exception as err:
                problem = f"undecodable payload ({err})"
            else:
                problem = update_problem(arrays, res.num_examples, expected)
            if problem is not None:
                log.warning("round %d: left out client %s: %s", server_round, proxy.cid, problem)
                round_log.clients_failed += 1
                continue
            round_log.bytes_up.append(up)
            round_log.params_up.append(_num_params(arrays))
            round_log.train_flops += int(res.metrics.get("train_flops", 0))
            updates.append(ClientUpdate(proxy.cid, arrays, res.num_examples, dict(res.metrics), up))
        return updates

    def _record_round(
        self,
        server_round: int,
        stats: AccuracyStats,
        global_acc: float | None,
        failures: list[Any],
        eval_extra: dict[str, float],
    ) -> None:
        round_log = self._round_log.pop(server_round, _RoundLog())
        round_total = sum(round_log.bytes_up) + sum(round_log.bytes_down)
        self._mb_cumulative += round_total / MB
        params_total = sum(round_log.params_up) + sum(round_log.params_down)
        self._params_cumulative += params_total
        self._flops_cumulative += round_log.train_flops
        record = RoundRecord(
            round=server_round,
            acc_mean=stats.mean,
            acc_worst=stats.worst,
            acc_std=stats.std,
            clients_evaluated=stats.clients,
            global_acc=global_acc,
            train_loss=round_log.train_loss,
            clients_fit=round_log.clients_fit,
            clients_failed=round_log.clients_failed,
            bytes_up_per_client=float(np.mean(round_log.bytes_up)) if round_log.bytes_up else 0.0,
            bytes_down_per_client=float(np.mean(round_log.bytes_down)) if round_log.bytes_down else 0.0,
            bytes_round_total=round_total,
            mb_cumulative=self._mb_cumulative,
            params_round_total=params_total,
            params_cumulative=self._params_cumulative,
            train_flops_round=round_log.train_flops,
            train_flops_cumulative=self._flops_cumulative,
            round_seconds=time.perf_counter() - round_log.started,
            extra={"eval_failures": len(failures), **round_log.extra, **eval_extra},
        )
        self.history.append(record)
        num_rounds = int(self.config["num-rounds"])
        log.info(progress_line(record, num_rounds))
        if self.recorder is not None:
            self.recorder.add(record)
            if server_round >= num_rounds:
                self.recorder.write_plots()


# Client metrics that are bookkeeping or already summarised elsewhere.
_NOT_AVERAGED = {"train_loss", "partition_id", "accuracy", "train_flops"}


def _num_params(arrays: Arrays) -> int:
    return int(sum(a.size for a in arrays))


def _mean_metrics(replies: list[tuple[dict[str, Scalar], int]], prefix: str) -> dict[str, float]:
    """Example-weighted mean of every numeric metric a method's clients report."""
    keys = {k for metrics, _ in replies for k, v in metrics.items() if isinstance(v, int | float)} - _NOT_AVERAGED
    out = {}
    for key in sorted(keys):
        pairs = [(float(m[key]), n) for m, n in replies if key in m and n > 0]
        if pairs:
            out[f"{prefix}_{key}"] = sum(v * n for v, n in pairs) / sum(n for _, n in pairs)
    return out
