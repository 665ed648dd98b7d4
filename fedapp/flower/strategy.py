"""The base of every method's server side: the Flower protocol and the hooks a method fills in.

A method's strategy subclasses :class:`FedAppStrategy` and fills in three
hooks: :meth:`~FedAppStrategy.initial_arrays` (the global state it starts
from), :meth:`~FedAppStrategy.aggregate_updates` (how validated client payloads
become the next global state) and, optionally,
:meth:`~FedAppStrategy.fit_config`. Everything else, including the per-round
metrics line, happens here once, from the pieces beside this module: sampling (who takes
part), replies (what is usable), recording (the round's record) and resume (checkpoints).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar, ndarrays_to_parameters
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from torch import nn

from fedapp.aggregation import Arrays
from fedapp.catalog import CATALOG
from fedapp.checkpoint import restore_rng_state
from fedapp.clientdata import CLASS_NAMES_KEY, check_data, encode_class_names
from fedapp.config import RunConfig
from fedapp.errors import ConfigError, StateError
from fedapp.flower import replies
from fedapp.flower.recording import (
    RoundLog,
    RunTotals,
    UntestedClients,
    close_round,
    evaluation_order,
    num_params,
    open_run_folder,
    summarize_evaluation,
    write_round,
)
from fedapp.flower.replies import AggregateReplies, ClientUpdate, failure_reason, reply_order, validated_updates
from fedapp.flower.resume import begin_run, checkpoint_path_of, read_resume_point, resume_run, write_checkpoint
from fedapp.flower.sampling import ClientSampler
from fedapp.metrics import RoundRecord, RunRecorder, payload_bytes
from fedapp.models import build_model
from fedapp.models.export import export_global_model
from fedapp.options import MethodOptions
from fedapp.params import decode_parameters
from fedapp.registry import strategy_class
from fedapp.runfolder import check_writable_folders
from fedapp.state import RUN_TOKEN_KEY

# ClientUpdate, reply_order and AggregateReplies are imported from here by strategies/ and others.
__all__ = ["AggregateReplies", "ClientUpdate", "FedAppStrategy", "reply_order"]

log = logging.getLogger("flwr.fedapp")

_S = TypeVar("_S", bound="FedAppStrategy")


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

    options: MethodOptions  # the configured method's own keys
    #: Whether the method keeps one global model whose accuracy is meaningful.
    has_global_model: bool = True
    #: Set by :func:`fedapp.flower.secure_aggregation.run_secagg`: each fit reply carries the unmasked aggregate.
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
        self.options = config.options
        self.num_classes = num_classes
        self.class_names = tuple(class_names) if class_names is not None else tuple(map(str, range(num_classes)))
        if len(self.class_names) != num_classes:
            raise ValueError(f"{len(self.class_names)} class names for {num_classes} classes")
        self._encoded_class_names = encode_class_names(self.class_names)  # once: every instruction carries them
        self.recorder = recorder
        self.history: list[RoundRecord] = []
        self._round_log: dict[int, RoundLog] = {}
        self._untested = UntestedClients(recorder)
        self._totals = RunTotals()
        self._global: Arrays = []
        self._sampler = ClientSampler(config)
        self.completed_rounds = 0  # rounds a resumed run had finished before this process
        self.run_token = begin_run(config, recorder)  # sent with every instruction: personal state is this run's
        self.domain_names = tuple(domain_names or ())
        held_out = self._sampler.held_out
        if held_out and self.new_client_note and recorder is not None:
            recorder.summary_extra["held_out_note"] = self.held_out_note
            log.warning("%s: the %d held-out clients are not evaluated", self.held_out_note, len(held_out))

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
        >>> from fedapp.strategies import PFedLoRAStrategy
        >>> config = resolve_run_config({"method": "pfedlora", "num-partitions": 2})
        >>> PFedLoRAStrategy.from_config(config)
        PFedLoRAStrategy(method='pfedlora')
        """
        _check_serves(cls, config.method)
        check_writable_folders(config.values, results=record)
        source = check_data(config, config.num_partitions)
        recorder = open_run_folder(config, source.domain_names) if record else None
        return cls(config, source.num_classes, recorder, source.class_names, source.domain_names)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.config['method']!r})"

    @property
    def global_arrays(self) -> Arrays:
        """The current global arrays: the initial ones, then the latest aggregate (empty before the run starts, or
        when nothing is shared). The DP wrappers set their noised aggregate here: what the clients receive next."""
        return list(self._global)

    @global_arrays.setter
    def global_arrays(self, arrays: Arrays) -> None:
        self._global = list(arrays)

    def clients_fit(self, server_round: int) -> int:
        """How many clients' updates round ``server_round`` used (0 before its fit replies are aggregated)."""
        return self._round_log[server_round].clients_fit if server_round in self._round_log else 0

    def client_name(self, proxy: ClientProxy, metrics: Mapping[str, Scalar] | None = None) -> str:
        """How logs and metrics name a client: its node id, and its partition when known (asked, or in ``metrics``)."""
        return replies.client_name(proxy, self._sampler.partition_of, metrics)

    # ----- checkpoints -------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path | None:
        """Where this run's checkpoint lives (None when no results folder is written)."""
        return checkpoint_path_of(self.recorder)

    def strategy_state(self) -> dict[str, np.ndarray]:
        """Method state outside the global arrays that a resumed run needs (default: none)."""
        return {}

    def load_strategy_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`strategy_state` returned."""
        if state:
            raise StateError(f"{type(self).__name__} keeps no strategy state, but the checkpoint has {sorted(state)}")

    def save_checkpoint(self, server_round: int) -> Path | None:
        """Write everything needed to continue after ``server_round``, and the global model (``export-models``)."""
        if (path := self.checkpoint_path) is None:
            return None
        state = self.strategy_state()
        export_global_model(self, path.parent, server_round, state)  # models/global.safetensors, if export-models
        return write_checkpoint(
            path, server_round, self.config, self._global, state, self._totals, self.history, self.run_token
        )

    def global_array_names(self) -> list[str]:
        """Names of the global arrays, in order, in ``models/global.safetensors`` (default ``array.<i>``)."""
        return [f"array.{i}" for i in range(len(self._global))]

    def resume(self) -> int:
        """Continue from this run's checkpoint; returns the rounds it had completed.

        Restores the global arrays, the method's state, the running totals, the
        records so far (``metrics.jsonl`` is rewritten to exactly those rounds)
        and the random number generators. A missing, corrupt or mismatched
        checkpoint raises :class:`~fedapp.errors.StateError`.
        """
        path = self.checkpoint_path
        point = read_resume_point(path, self.config, self.initial_arrays, self.strategy_state)
        self.load_strategy_state(point.strategy_state)
        self._global = point.global_arrays
        self._totals = point.totals
        self.history = point.history
        if self.recorder is not None:
            self.recorder.restore(self.history)
        restore_rng_state(point.rng)
        self.completed_rounds = point.round
        self.run_token = resume_run(self.config, self.recorder, point, self.run_token)
        log.info("resuming %s after round %d from %s", self.config.resolved_run_name, point.round, path)
        return point.round

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

    def agreement_config(self) -> dict[str, Scalar]:
        """What every instruction carries so that a client checks, before it trains or evaluates,
        that its data agrees with the server's (its classes, in label order) and its state is this run's."""
        return {CLASS_NAMES_KEY: self._encoded_class_names, RUN_TOKEN_KEY: self.run_token}

    def skip_round(self, server_round: int, reason: str) -> None:
        """Note that ``server_round`` produced no aggregate (the global state stays), and why."""
        self._round_log.setdefault(server_round, RoundLog()).skip(server_round, reason)

    def add_round_metric(self, server_round: int, name: str, value: float) -> None:
        """Log a server-side figure of this round (e.g. a loss) in its metrics line."""
        self._round_log.setdefault(server_round, RoundLog()).extra[name] = value

    def expected_update(self) -> Arrays | None:
        """Arrays a client's upload must match in shape and dtype (None: no check)."""
        return self._global or None

    def leave_out(
        self, server_round: int, round_log: RoundLog, proxy: ClientProxy, metrics: dict[str, Scalar], problem: str
    ) -> None:
        """Refuse one reply: a warning naming the client, a failed count, the reason in the metrics."""
        round_log.refuse(server_round, f"{self.client_name(proxy, metrics)}: {problem}")

    @staticmethod
    def accept(round_log: RoundLog, update: ClientUpdate, params: int) -> ClientUpdate:
        """Count one usable reply's traffic and training FLOPs in the round."""
        return replies.accept(round_log, update, params)

    # ----- Flower Strategy interface -----------------------------------------

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        if not self.completed_rounds:  # a resumed run starts from its checkpoint's arrays
            self._global = self.initial_arrays()
        return ndarrays_to_parameters(self._global)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self._round_log[server_round] = round_log = RoundLog()
        clients = self._sampler.sample(server_round, client_manager, self.config.fraction_fit, salt=0)
        fit_ins = FitIns(parameters, {**self.fit_config(server_round), **self.agreement_config()})
        round_log.bytes_down = [payload_bytes(parameters.tensors)] * len(clients)
        round_log.sampled["fit"] = [self.client_name(client) for client in clients]
        round_log.params_down = [num_params(decode_parameters(parameters.tensors))] * len(clients)
        return [(client, fit_ins) for client in clients]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        round_log = self._round_log.setdefault(server_round, RoundLog())
        self._sampler.confirm(results)
        if self.secure_aggregation is not None:
            # One reply per participant, all carrying the same aggregate: count and weigh
            # the participants, aggregate the one pre-averaged update.
            updates, to_aggregate = self.secure_aggregation.updates(self, server_round, results, round_log)
        else:
            expected, bound, name_of = self.expected_update(), self.config.update_norm_bound, self.client_name
            updates = to_aggregate = validated_updates(server_round, results, round_log, expected, bound, name_of)
        for failure in failures:
            round_log.refuse(server_round, failure_reason(failure, self.client_name, self.config.round_timeout))
        round_log.clients_fit = len(updates)
        round_log.extra["fit_missing_clients"] = round_log.missing("fit", [self.client_name(p) for p, _ in results])
        if len(updates) < (min_clients := self.config.min_clients):  # the reason goes into left_out_reasons
            round_log.skip(server_round, f"{len(updates)} usable updates, fewer than min-clients = {min_clients}")
        elif not to_aggregate:  # the secure aggregate was unusable (logged)
            round_log.skipped = True
        if round_log.skipped:
            return None, {}
        round_log.add_fit_metrics([(u.metrics, u.num_examples) for u in updates])
        self._global = self.aggregate_updates(server_round, to_aggregate)
        return ndarrays_to_parameters(self._global), {"train_loss": round_log.train_loss}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        # Held-out clients are evaluated only when the global state alone serves a client that never trained.
        serves_new = not self.new_client_note
        fraction = self.config.fraction_evaluate
        clients = self._sampler.sample(server_round, client_manager, fraction, salt=1, include_held_out=serves_new)
        ins = EvaluateIns(parameters, {"server-round": server_round, **self.agreement_config()})
        round_log = self._round_log.setdefault(server_round, RoundLog())
        round_log.bytes_eval_down = payload_bytes(parameters.tensors) * len(clients)
        round_log.sampled["evaluate"] = [self.client_name(client) for client in clients]
        return [(client, ins) for client in clients]

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        results, held_out = self._sampler.split_held_out(sorted(results, key=evaluation_order))
        evaluation = summarize_evaluation(
            results, held_out, self._sampler.domain_of, self.domain_names, pooled=self.has_global_model
        )
        self._untested.warn(results + held_out, self.client_name, self._sampler.partition_of)
        round_log = self._round_log.pop(server_round, RoundLog())
        evaluated = [self.client_name(proxy) for proxy, _ in results + held_out]
        record = close_round(server_round, round_log, self._totals, evaluation, len(failures), evaluated)
        self.history.append(record)
        write_round(record, self.recorder, self.config.num_rounds, self.save_checkpoint)
        return evaluation.loss, {"acc_mean": evaluation.stats.mean, "acc_worst": evaluation.stats.worst}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None  # every method is evaluated on the clients' own test sets


def _check_serves(cls: type[FedAppStrategy], method: str) -> None:
    """Refuse a strategy class that is not (a subclass of) the one the registry names for ``method``."""
    expected = strategy_class(method)
    if not issubclass(cls, expected):
        raise ConfigError(
            f"config key 'method' = {method!r} is served by {expected.__name__}, not {cls.__name__}; "
            f"the ClientApp runs the clients of {method!r}"
        )
