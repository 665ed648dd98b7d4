"""What every method's server side shares: sampling, validation, bytes, metrics.

A method's strategy subclasses :class:`FedAppStrategy` and fills in three
hooks: :meth:`~FedAppStrategy.initial_arrays` (the global state it starts
from), :meth:`~FedAppStrategy.aggregate_updates` (how validated client payloads
become the next global state) and, optionally,
:meth:`~FedAppStrategy.fit_config`. Everything else, including the per-round
metrics line, happens here once.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

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
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from torch import nn

from fedapp.aggregation import Arrays, metrics_problem, update_norm, update_problem
from fedapp.catalog import CATALOG
from fedapp.checkpoint import FILENAME as CHECKPOINT_FILE
from fedapp.checkpoint import (
    ServerCheckpoint,
    check_resumable,
    check_state_shapes,
    load_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from fedapp.clientdata import CLASS_NAMES_KEY, check_data, encode_class_names
from fedapp.config import RunConfig, domain_of_partition, held_out_partitions
from fedapp.errors import ConfigError, StateError, client_error_message
from fedapp.metrics import (
    MB,
    AccuracyStats,
    RoundRecord,
    RunRecorder,
    check_writable_folders,
    payload_bytes,
    progress_line,
)
from fedapp.models import build_model
from fedapp.params import decode_parameters
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
    bytes_eval_down: int = 0  # evaluation instructions carry the global arrays again
    params_up: list[int] = field(default_factory=list)
    params_down: list[int] = field(default_factory=list)
    train_flops: int = 0
    left_out: list[str] = field(default_factory=list)
    skipped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class AggregateReplies(Protocol):
    """What stands in for per-reply validation when every fit reply carries the round's
    aggregate instead of one client's arrays (SecAgg+: :class:`fedapp.flower.secure_aggregation.SecAggReplies`)."""

    def updates(
        self,
        strategy: FedAppStrategy,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        round_log: _RoundLog,
    ) -> tuple[list[ClientUpdate], list[ClientUpdate]]:
        """``(participants, to_aggregate)``: one update per usable participant, and the aggregate."""
        ...


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
    domain_names
        Names of the data's domains (``partition = domain``), for the per-domain
        accuracies; default ``"domain-0"``, ``"domain-1"``, ...

    See Also
    --------
    from_config : Build a strategy from the run configuration alone, reading
        ``num_classes`` and ``class_names`` from the configured data (what a
        ServerApp of your own should use).
    """

    #: Whether the method keeps one global model whose accuracy is meaningful.
    has_global_model: bool = True
    #: Set by :func:`fedapp.flower.secure_aggregation.run_secagg` when rounds run under SecAgg+:
    #: every fit reply then carries the round's unmasked aggregate, not the client's arrays.
    secure_aggregation: AggregateReplies | None = None

    def __init__(
        self,
        config: RunConfig,
        num_classes: int,
        recorder: RunRecorder | None = None,
        class_names: Sequence[str] | None = None,
        domain_names: Sequence[str] | None = None,
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
        self._mb_eval_cumulative = 0.0
        self._params_cumulative = 0
        self._flops_cumulative = 0
        self._global: Arrays = []
        self._held_out = held_out_partitions(config)
        self._partition_of: dict[str, int] = {}
        self.completed_rounds = 0  # rounds a resumed run had finished before this process
        self.domain_names = tuple(domain_names or ())
        if self._held_out and self.new_client_note and recorder is not None:
            recorder.summary_extra["held_out_note"] = self.held_out_note
            log.warning("%s: the %d held-out clients are not evaluated", self.held_out_note, len(self._held_out))

    @property
    def new_client_note(self) -> str:
        """Why a client that never trained cannot be served (held-out clients are then not
        evaluated and the summary says so); empty when the global state alone serves it.
        The method's catalog entry says it (:class:`fedapp.catalog.MethodSpec`)."""
        return CATALOG[self.config.method].new_client_note

    @property
    def held_out_note(self) -> str:
        """Why this method reports no held-out accuracy (empty when it does)."""
        if not self.new_client_note:
            return ""
        return f"{self.config['method']} cannot serve a client that never trained: {self.new_client_note}"

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
            names for ``config.method``.
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
        method = config.method
        expected = strategy_class(method)
        if not issubclass(cls, expected):
            raise ConfigError(
                f"config key 'method' = {method!r} is served by {expected.__name__}, not {cls.__name__}; "
                f"the ClientApp runs the clients of {method!r}"
            )
        check_writable_folders(config.values, results=record)
        source = check_data(config, config.num_partitions)
        recorder = None
        if record:
            recorder = RunRecorder(
                config.results_dir,
                config.resolved_run_name,
                config.as_dict(),
                config.target_accuracy,
                # A resumed run keeps its metrics until the checkpoint says which rounds count.
                fresh=not config.resume,
            )
            log.info("results go to %s", recorder.directory)
        if recorder is not None and source.domain_names:
            recorder.summary_extra["domain_names"] = list(source.domain_names)
        return cls(config, source.num_classes, recorder, source.class_names, source.domain_names)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.config['method']!r})"

    @property
    def global_arrays(self) -> Arrays:
        """The current global arrays: the initial ones after initialisation, then
        the latest aggregate (empty before the run starts, or when nothing is shared)."""
        return list(self._global)

    # ----- checkpoints -------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path | None:
        """Where this run's checkpoint lives (None when no results folder is written)."""
        return None if self.recorder is None else self.recorder.directory / CHECKPOINT_FILE

    def strategy_state(self) -> dict[str, np.ndarray]:
        """Method state outside the global arrays that a resumed run needs (default: none)."""
        return {}

    def load_strategy_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`strategy_state` returned."""
        if state:
            raise StateError(f"{type(self).__name__} keeps no strategy state, but the checkpoint has {sorted(state)}")

    def save_checkpoint(self, server_round: int) -> Path | None:
        """Write everything needed to continue after ``server_round``."""
        path = self.checkpoint_path
        if path is None:
            return None
        checkpoint = ServerCheckpoint(
            round=server_round,
            config=self.config.as_dict(),
            global_arrays=list(self._global),
            strategy_state=self.strategy_state(),
            totals={
                "mb_cumulative": self._mb_cumulative,
                "mb_eval_cumulative": self._mb_eval_cumulative,
                "params_cumulative": self._params_cumulative,
                "flops_cumulative": self._flops_cumulative,
            },
            records=[asdict(r) for r in self.history],
            rng=rng_state(),
        )
        return save_checkpoint(path, checkpoint)

    def resume(self) -> int:
        """Continue from this run's checkpoint; returns the rounds it had completed.

        Restores the global arrays, the method's state, the running totals, the
        records so far (``metrics.jsonl`` is rewritten to exactly those rounds)
        and the random number generators. A missing, corrupt or mismatched
        checkpoint raises :class:`~fedapp.errors.StateError`.
        """
        path = self.checkpoint_path
        if path is None:
            raise StateError("resume needs a results folder (results-dir/run-name) to read the checkpoint from")
        checkpoint = load_checkpoint(path)
        check_resumable(checkpoint, self.config.as_dict(), path)
        fresh = self.initial_arrays()
        if [(a.shape, a.dtype) for a in fresh] != [(a.shape, a.dtype) for a in checkpoint.global_arrays]:
            raise StateError(f"checkpoint {path} holds global arrays of other shapes than this method builds")
        check_state_shapes(checkpoint.strategy_state, self.strategy_state(), path)
        self.load_strategy_state(checkpoint.strategy_state)
        self._global = checkpoint.global_arrays
        self._mb_cumulative = checkpoint.totals["mb_cumulative"]
        self._mb_eval_cumulative = checkpoint.totals.get("mb_eval_cumulative", 0.0)
        self._params_cumulative = int(checkpoint.totals["params_cumulative"])
        self._flops_cumulative = int(checkpoint.totals["flops_cumulative"])
        self.history = [RoundRecord(**row) for row in checkpoint.records]
        if self.recorder is not None:
            self.recorder.restore(self.history)
        restore_rng_state(checkpoint.rng)
        self.completed_rounds = checkpoint.round
        log.info("resuming %s after round %d from %s", self.config.resolved_run_name, checkpoint.round, path)
        return checkpoint.round

    def zoo_model(self, name: str) -> nn.Module:
        """A zoo model for this task (same shapes as the clients build)."""
        return build_model(name, self.num_classes, image_size=self.config.image_size)

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

    @functools.cached_property
    def _agreement(self) -> dict[str, Scalar]:
        return {CLASS_NAMES_KEY: encode_class_names(self.class_names)}

    def agreement_config(self) -> dict[str, Scalar]:
        """What every instruction carries so that a client checks its data agrees with the
        server's (its classes, in label order) before it trains or evaluates; encoded once."""
        return dict(self._agreement)

    def skip_round(self, server_round: int, reason: str) -> None:
        """Note that ``server_round`` produced no aggregate (the global state stays), and why."""
        round_log = self._round_log.setdefault(server_round, _RoundLog())
        round_log.skipped = True
        round_log.left_out.append(reason)
        log.warning("round %d: %s; keeping the previous global state", server_round, reason)

    def add_round_metric(self, server_round: int, name: str, value: float) -> None:
        """Log a server-side figure of this round (e.g. a loss) in its metrics line."""
        self._round_log.setdefault(server_round, _RoundLog()).extra[name] = value

    def expected_update(self) -> Arrays | None:
        """Arrays a client's upload must match in shape and dtype (None: no check)."""
        return self._global or None

    # ----- Flower Strategy interface -----------------------------------------

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        if not self.completed_rounds:  # a resumed run starts from its checkpoint's arrays
            self._global = self.initial_arrays()
        return ndarrays_to_parameters(self._global)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self._round_log[server_round] = _RoundLog()
        clients = self._sample(server_round, client_manager, self.config.fraction_fit, salt=0, training=True)
        fit_ins = FitIns(parameters, {**self.fit_config(server_round), **self.agreement_config()})
        round_log = self._round_log[server_round]
        round_log.bytes_down = [payload_bytes(parameters.tensors)] * len(clients)
        round_log.params_down = [_num_params(decode_parameters(parameters.tensors))] * len(clients)
        return [(client, fit_ins) for client in clients]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        round_log = self._round_log.setdefault(server_round, _RoundLog())
        if self.secure_aggregation is not None:
            # One reply per participant, all carrying the same aggregate: count and weigh
            # the participants, aggregate the one pre-averaged update.
            updates, to_aggregate = self.secure_aggregation.updates(self, server_round, results, round_log)
        else:
            updates = to_aggregate = self._validated(server_round, results, round_log)
        for failure in failures:
            reason = self._failure_reason(failure)
            log.warning("round %d: left out %s", server_round, reason)
            round_log.left_out.append(reason)
        round_log.clients_failed += len(failures)
        round_log.clients_fit = len(updates)
        if len(updates) < self.config.min_clients or not to_aggregate:
            round_log.skipped = True
            if len(updates) < self.config.min_clients:  # else the secure aggregate was unusable (logged)
                log.warning(
                    "round %d: %d usable updates, fewer than min-clients = %d; keeping the previous global state",
                    server_round,
                    len(updates),
                    self.config.min_clients,
                )
            return None, {}
        losses = [(float(u.metrics["train_loss"]), u.num_examples) for u in updates if "train_loss" in u.metrics]
        if losses:
            total = sum(n for _, n in losses)
            round_log.train_loss = sum(loss * n for loss, n in losses) / total
        round_log.extra.update(_mean_metrics([(u.metrics, u.num_examples) for u in updates], "fit"))
        self._global = self.aggregate_updates(server_round, to_aggregate)
        return ndarrays_to_parameters(self._global), {"train_loss": round_log.train_loss}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        clients = self._sample(server_round, client_manager, self.config.fraction_evaluate, salt=1, training=False)
        ins = EvaluateIns(parameters, {"server-round": server_round, **self.agreement_config()})
        round_log = self._round_log.setdefault(server_round, _RoundLog())
        round_log.bytes_eval_down = payload_bytes(parameters.tensors) * len(clients)
        return [(client, ins) for client in clients]

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        # Replies arrive in completion order; sorting by value makes the sums below reproducible.
        results = sorted(results, key=lambda pr: (float(pr[1].metrics.get("accuracy", math.nan)), pr[1].num_examples))
        held_out = [(p, r) for p, r in results if self._partition_of.get(p.cid) in self._held_out]
        results = [(p, r) for p, r in results if self._partition_of.get(p.cid) not in self._held_out]
        stats = _accuracy_stats(results)
        global_acc = None
        if self.has_global_model and results:
            # The pooled accuracy of the one global model over every client's test set.
            total = sum(res.num_examples for _, res in results)
            global_acc = sum(float(res.metrics.get("accuracy", 0.0)) * res.num_examples for _, res in results) / max(
                total, 1
            )
        eval_extra = _mean_metrics([(dict(res.metrics), res.num_examples) for _, res in results], "eval")
        if held_out:
            held = _accuracy_stats(held_out)
            eval_extra.update(held_out_acc_mean=held.mean, held_out_acc_worst=held.worst, held_out_clients=held.clients)
        eval_extra.update(self._novel_metrics(stats, results))
        domains = self._domain_accuracies(results)
        if domains:
            eval_extra["domain_acc"] = domains
        self._record_round(server_round, stats, global_acc, failures, eval_extra)
        losses = [(res.loss, res.num_examples) for _, res in results if res.num_examples > 0]
        loss = sum(v * n for v, n in losses) / sum(n for _, n in losses) if losses else None
        return loss, {"acc_mean": stats.mean, "acc_worst": stats.worst}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None  # every method is evaluated on the clients' own test sets

    @staticmethod
    def _novel_metrics(base: AccuracyStats, results: list[tuple[ClientProxy, EvaluateRes]]) -> dict[str, float]:
        """Base-to-novel: clients' accuracy on classes they never trained on, and its harmonic
        mean with the base accuracy (``acc_mean``), as CoCoOp reports them."""
        novel = AccuracyStats.of(
            [float(r.metrics["novel_accuracy"]) for _, r in results if "novel_accuracy" in r.metrics]
        )
        if not novel.clients:
            return {}
        total = base.mean + novel.mean
        harmonic = 2 * base.mean * novel.mean / total if total > 0 else 0.0
        return {"novel_acc_mean": novel.mean, "novel_acc_worst": novel.worst, "harmonic_mean": harmonic}

    def _domain_accuracies(self, results: list[tuple[ClientProxy, EvaluateRes]]) -> dict[str, float]:
        """Mean client accuracy per domain (``partition = domain``), keyed by domain name."""
        by_domain: dict[int, list[tuple[ClientProxy, EvaluateRes]]] = {}
        for proxy, res in results:
            partition = self._partition_of.get(proxy.cid)
            domain = None if partition is None else domain_of_partition(self.config, partition)
            if domain is not None:
                by_domain.setdefault(domain, []).append((proxy, res))
        return {self._domain_name(d): _accuracy_stats(replies).mean for d, replies in sorted(by_domain.items())}

    def _domain_name(self, domain: int) -> str:
        return self.domain_names[domain] if domain < len(self.domain_names) else f"domain-{domain}"

    # ----- shared machinery ----------------------------------------------------

    def _sample(
        self, server_round: int, client_manager: ClientManager, fraction: float, salt: int, training: bool
    ) -> list[ClientProxy]:
        """Pick clients as a function of (seed, round) only, over the pool sorted by partition.

        Node ids differ from one run (or restart) to the next; partitions do
        not, so whenever not everyone is picked (or per-domain accuracies are
        wanted) the nodes are asked their partition once. Held-out clients are
        never picked to train; they are evaluated only when the method's global
        state alone can serve them (:attr:`new_client_note` is empty).
        """
        min_clients = self.config.min_clients
        # Flower's grid-backed client manager refreshes its node list when asked how many
        # nodes it has (and otherwise every 5 s); asking first keeps a first round whose
        # nodes are already connected from waiting for the next refresh.
        if client_manager.num_available() < min_clients:
            client_manager.wait_for(min_clients)
        pool = client_manager.all()
        if self._held_out or fraction < 1.0 or self.config.partition == "domain":
            self._ask_partitions(list(pool.values()), server_round)
            keep_held_out = not training and not self.new_client_note
            pool = {
                cid: proxy
                for cid, proxy in pool.items()
                if (partition := self._partition_of.get(cid)) is not None
                and (keep_held_out or partition not in self._held_out)
            }
        ids = sorted(pool, key=lambda cid: (self._partition_of.get(cid, -1), cid))
        count = min(len(ids), max(min_clients, math.ceil(fraction * len(ids))))
        rng = np.random.default_rng([self.config.seed, server_round, salt])
        chosen = sorted(rng.choice(len(ids), size=count, replace=False)) if count < len(ids) else range(len(ids))
        return [pool[ids[i]] for i in chosen]

    def _ask_partitions(self, proxies: list[ClientProxy], server_round: int) -> None:
        """Learn the partition of every node not asked yet, all at once."""
        missing = [proxy for proxy in proxies if proxy.cid not in self._partition_of]
        if missing:
            with ThreadPoolExecutor(max_workers=min(16, len(missing))) as pool:
                list(pool.map(lambda proxy: self._partition(proxy, server_round), missing))

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
        """The usable replies of a round; every other one is logged, counted as
        failed and its reason kept for the round's metrics line."""
        expected = self.expected_update()
        updates = []
        for proxy, res in results:
            up = payload_bytes(res.parameters.tensors)
            try:
                arrays = decode_parameters(res.parameters.tensors)
            except Exception as err:
                problem = f"undecodable payload ({err})"
            else:
                problem = (
                    _round_problem(res.metrics, server_round)
                    or update_problem(arrays, res.num_examples, expected)
                    or metrics_problem(res.metrics)
                    or self._norm_problem(arrays, expected)
                )
            if problem is not None:
                self.leave_out(server_round, round_log, proxy, res.metrics, problem)
                continue
            update = ClientUpdate(proxy.cid, arrays, res.num_examples, dict(res.metrics), up)
            updates.append(self.accept(round_log, update, _num_params(arrays)))
        return sorted(updates, key=reply_order)

    def _norm_problem(self, arrays: Arrays, expected: Arrays | None) -> str | None:
        """An update farther than ``update-norm-bound`` from the global arrays (a scaled or poisoned one)."""
        bound = self.config.update_norm_bound
        if bound <= 0 or expected is None:
            return None
        norm = update_norm(arrays, expected)
        return None if norm <= bound else f"update norm {norm:.4g} exceeds update-norm-bound = {bound:g}"

    def leave_out(
        self, server_round: int, round_log: _RoundLog, proxy: ClientProxy, metrics: dict[str, Scalar], problem: str
    ) -> None:
        """Refuse one reply: a warning naming the client, a failed count, the reason in the metrics."""
        reason = f"{self._client_name(proxy, metrics)}: {problem}"
        log.warning("round %d: left out %s", server_round, reason)
        round_log.left_out.append(reason)
        round_log.clients_failed += 1

    @staticmethod
    def accept(round_log: _RoundLog, update: ClientUpdate, params: int) -> ClientUpdate:
        """Count one usable reply's traffic and training FLOPs in the round."""
        round_log.bytes_up.append(update.bytes_up)
        round_log.params_up.append(params)
        round_log.train_flops += int(update.metrics.get("train_flops", 0))
        return update

    def _client_name(self, proxy: ClientProxy, metrics: dict[str, Scalar] | None = None) -> str:
        """The client's node id, and its partition when known (asked, or reported with its update)."""
        partition = self._partition_of.get(proxy.cid, (metrics or {}).get("partition_id"))
        return f"client {proxy.cid}" + ("" if partition is None else f" (partition {partition})")

    def _failure_reason(self, failure: tuple[ClientProxy, FitRes] | BaseException) -> str:
        """One line on why a client sent no usable reply (an error, a lost node, a timeout)."""
        if isinstance(failure, BaseException):
            # Flower's legacy server hands over the bare exception, without the client's proxy.
            text = client_error_message(f"{type(failure).__name__}: {failure}")
            timeout = self.config.round_timeout
            if timeout > 0 and _TIMEOUT_HINT in text:
                text = f"timed out (no reply within round-timeout = {timeout:g}s): {text}"
            return "a client that failed: " + _shortened(text)
        proxy, res = failure
        name = self._client_name(proxy, res.metrics)
        return _shortened(f"{name}: status {res.status.code.name}: {client_error_message(res.status.message)}")

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
        self._mb_eval_cumulative += round_log.bytes_eval_down / MB
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
            extra={
                "eval_failures": len(failures),
                "left_out_reasons": list(round_log.left_out),
                "round_skipped": round_log.skipped,
                # Not in mb_cumulative, which is the training traffic the papers count.
                "bytes_eval_down_round": round_log.bytes_eval_down,
                "mb_eval_cumulative": self._mb_eval_cumulative,
                **round_log.extra,
                **eval_extra,
            },
        )
        self.history.append(record)
        num_rounds = self.config.num_rounds
        log.info(progress_line(record, num_rounds))
        if self.recorder is not None:
            self.recorder.add(record)
            self.save_checkpoint(server_round)
            if server_round >= num_rounds:
                self.recorder.write_plots()


# What Flower's error reply says when a client's message outlived its TTL (the round timeout).
_TIMEOUT_HINT = "expired"
# Terminal colour codes that Ray puts into its error texts.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _shortened(text: str, head: int = 150, tail: int = 250) -> str:
    """An error text on one line: its first line and its last (where a remote
    traceback ends in the client's own message), each cut to length."""
    lines = [" ".join(line.split()) for line in _ANSI_ESCAPE.sub("", text).splitlines() if line.strip()]
    if not lines:
        return ""
    first, last = lines[0], lines[-1]
    if len(lines) == 1:
        return first if len(first) <= head + tail else f"{first[:head]} ... {first[-tail:]}"
    return f"{first[:head]} ... {last[-tail:]}"


# Client metrics that are bookkeeping or already summarised elsewhere.
def reply_order(update: ClientUpdate) -> tuple[int, str]:
    """Replies arrive in completion order; a fixed order keeps float sums, and so runs, reproducible."""
    return int(update.metrics.get("partition_id", -1)), update.cid


_NOT_AVERAGED = {"train_loss", "partition_id", "accuracy", "novel_accuracy", "train_flops", "server_round"}


def _round_problem(metrics: dict[str, Scalar], server_round: int) -> str | None:
    """A reply that says it was trained for another round (a late or replayed message) is refused."""
    replied = metrics.get("server_round")
    if replied is not None and replied != server_round:
        return f"reply for round {replied} arrived in round {server_round}"
    return None


def _accuracy_stats(results: list[tuple[ClientProxy, EvaluateRes]]) -> AccuracyStats:
    """Mean, worst and spread of the clients' reported test accuracies."""
    return AccuracyStats.of([float(res.metrics.get("accuracy", math.nan)) for _, res in results])


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
