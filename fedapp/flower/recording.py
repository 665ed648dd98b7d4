"""The server's accounting: what a round accumulates between fit and evaluate
(:class:`RoundLog`), the run's running totals (:class:`RunTotals`), the metrics means
and accuracy statistics of a round's replies (held-out clients, per domain, base-to-novel:
:func:`summarize_evaluation`), and how a finished round becomes a :class:`~fedapp.metrics.RoundRecord`
(:func:`close_round`) written to the recorder (:func:`write_round`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from flwr.common import EvaluateRes, Scalar
from flwr.server.client_proxy import ClientProxy

from fedapp.aggregation import Arrays
from fedapp.checkpoint import what_can_resume
from fedapp.clientdata import held_out_clients, load_client_data
from fedapp.config import RunConfig, partition_settings
from fedapp.data.partition_report import (
    PARTITION_FILE,
    check_test_splits,
    partition_summary,
    untested_partitions,
    write_partition_files,
)
from fedapp.errors import StateError
from fedapp.flower.progress import log_done, log_progress
from fedapp.metrics import MB, AccuracyStats, RoundRecord, RunRecorder
from fedapp.tracking import open_tracker

log = logging.getLogger("flwr.fedapp")

#: Per-client accuracies: summarised per client (test, novel classes, validation), never weighted by examples.
ACCURACIES = frozenset({"accuracy", "novel_accuracy", "val_accuracy"})
#: Client metrics that are bookkeeping or already summarised elsewhere.
NOT_AVERAGED = frozenset({"train_loss", "partition_id", "train_flops", "server_round"}) | ACCURACIES

EvaluateReplies = list[tuple[ClientProxy, EvaluateRes]]


@dataclass
class RoundLog:
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
    #: The clients asked to train and to evaluate this round (:meth:`missing` names who did not answer).
    sampled: dict[str, list[str]] = field(default_factory=dict)

    def missing(self, step: str, answered: Sequence[str]) -> list[str]:
        """The clients sampled for ``step`` (fit or evaluate) that sent no usable reply: a node that
        died or restarted mid-round is named here, whichever API reported its failure."""
        return [name for name in self.sampled.get(step, []) if name not in set(answered)]

    def refuse(self, server_round: int, reason: str) -> None:
        """Leave one client out of the round: a warning, a failed count, the reason in the metrics."""
        log.warning("round %d: left out %s", server_round, reason)
        self.left_out.append(reason)
        self.clients_failed += 1

    def skip(self, server_round: int, reason: str) -> None:
        """Note that the round produced no aggregate (the global state stays), and why."""
        self.skipped = True
        self.left_out.append(reason)
        log.warning("round %d: %s; keeping the previous global state", server_round, reason)

    def add_fit_metrics(self, replies: Sequence[tuple[Mapping[str, Scalar], int]]) -> None:
        """The example-weighted train loss and ``fit_*`` means of the usable ``(metrics, num_examples)``."""
        losses = [(float(metrics["train_loss"]), n) for metrics, n in replies if "train_loss" in metrics]
        if losses:
            total = sum(n for _, n in losses)
            self.train_loss = sum(loss * n for loss, n in losses) / total
        self.extra.update(mean_metrics(replies, "fit"))


@dataclass
class RunTotals:
    """Running totals over the rounds so far: the cumulative columns of every record,
    kept in checkpoints (:data:`fedapp.checkpoint.TOTALS` names the same keys)."""

    mb_cumulative: float = 0.0
    #: Evaluation traffic, apart from ``mb_cumulative`` (the training traffic the papers count).
    mb_eval_cumulative: float = 0.0
    params_cumulative: int = 0
    flops_cumulative: int = 0

    @classmethod
    def from_checkpoint(cls, totals: Mapping[str, float]) -> RunTotals:
        """The totals a checkpoint holds (one written before evaluation traffic was counted has none of it)."""
        return cls(
            mb_cumulative=totals["mb_cumulative"],
            mb_eval_cumulative=totals.get("mb_eval_cumulative", 0.0),
            params_cumulative=int(totals["params_cumulative"]),
            flops_cumulative=int(totals["flops_cumulative"]),
        )

    def as_checkpoint(self) -> dict[str, float]:
        """What :meth:`from_checkpoint` reads back."""
        return asdict(self)


@dataclass(frozen=True)
class Evaluation:
    """What a round's evaluation replies amount to."""

    stats: AccuracyStats
    #: Pooled accuracy of the one global model (None when the method has none, or no client replied).
    global_acc: float | None
    #: Example-weighted mean loss (None when no client evaluated any example).
    loss: float | None
    #: ``eval_*`` means, held-out, base-to-novel, per-domain and per-client (``client_acc``)
    #: accuracies for the record's ``extra``.
    extra: dict[str, Any]


def num_params(arrays: Arrays) -> int:
    """Numbers in ``arrays`` (the records count parameters sent as well as bytes)."""
    return int(sum(a.size for a in arrays))


def mean_metrics(replies: Sequence[tuple[Mapping[str, Scalar], int]], prefix: str) -> dict[str, float]:
    """Example-weighted mean of every numeric metric a method's clients report, as ``<prefix>_<key>``."""
    keys = {k for metrics, _ in replies for k, v in metrics.items() if isinstance(v, int | float)} - NOT_AVERAGED
    out = {}
    for key in sorted(keys):
        pairs = [(float(m[key]), n) for m, n in replies if key in m and n > 0]
        if pairs:
            out[f"{prefix}_{key}"] = sum(v * n for v, n in pairs) / sum(n for _, n in pairs)
    return out


def accuracy_stats(results: EvaluateReplies, metric: str = "accuracy") -> AccuracyStats:
    """Mean, worst and spread of the clients' reported test accuracies (or ``metric``'s)."""
    return AccuracyStats.of([float(res.metrics.get(metric, math.nan)) for _, res in results])


def evaluation_order(reply: tuple[ClientProxy, EvaluateRes]) -> tuple[float, int]:
    """Replies arrive in completion order; sorting by value makes the sums over them reproducible."""
    res = reply[1]
    return float(res.metrics.get("accuracy", math.nan)), res.num_examples


def novel_metrics(base: AccuracyStats, results: EvaluateReplies) -> dict[str, float]:
    """Base-to-novel: clients' accuracy on classes they never trained on, and its harmonic
    mean with the base accuracy (``acc_mean``), as CoCoOp reports them; empty when no client
    reports a novel accuracy."""
    novel = AccuracyStats.of([float(r.metrics["novel_accuracy"]) for _, r in results if "novel_accuracy" in r.metrics])
    if not novel.clients:
        return {}
    total = base.mean + novel.mean
    harmonic = 2 * base.mean * novel.mean / total if total > 0 else 0.0
    return {"novel_acc_mean": novel.mean, "novel_acc_worst": novel.worst, "harmonic_mean": harmonic}


def domain_accuracies(
    results: EvaluateReplies, domain_of: Callable[[str], int | None], domain_names: Sequence[str]
) -> dict[str, float]:
    """Mean client accuracy per domain (``partition = domain``), keyed by domain name.

    ``domain_of`` maps a node id to its domain (None: unknown, or no domains);
    a domain without a name in ``domain_names`` is called ``domain-<i>``.
    """
    by_domain: dict[int, EvaluateReplies] = {}
    for proxy, res in results:
        domain = domain_of(proxy.cid)
        if domain is not None:
            by_domain.setdefault(domain, []).append((proxy, res))
    return {
        (domain_names[d] if d < len(domain_names) else f"domain-{d}"): accuracy_stats(replies).mean
        for d, replies in sorted(by_domain.items())
    }


def client_accuracies(results: EvaluateReplies, metric: str = "accuracy") -> dict[str, float]:
    """Each evaluated client's accuracy keyed by its partition id (a string: the keys of a
    JSON object), in partition order, for fairness analyses (``client_acc`` in metrics.jsonl;
    ``metric = "val_accuracy"``: its validation accuracy, ``client_val_acc``).

    The partition is the ``partition_id`` a client reports with its accuracy
    (:meth:`fedapp.clients.base.FedAppClient.eval_metrics`); a reply without either is left out.
    """
    by_partition: dict[int, float] = {}
    for _, res in results:
        partition, accuracy = res.metrics.get("partition_id"), res.metrics.get(metric)
        if isinstance(partition, int | float) and isinstance(accuracy, int | float):
            by_partition[int(partition)] = float(accuracy)
    return {str(partition): by_partition[partition] for partition in sorted(by_partition)}


def summarize_evaluation(
    results: EvaluateReplies,
    held_out: EvaluateReplies,
    domain_of: Callable[[str], int | None],
    domain_names: Sequence[str],
    *,
    pooled: bool,
) -> Evaluation:
    """What the evaluation replies of the training clients (``results``) and of the
    held-out ones (kept apart, never in ``acc_mean``) amount to.

    ``domain_of`` and ``domain_names`` give the per-domain accuracies
    (:func:`domain_accuracies`); ``pooled``: whether the method keeps one global model,
    whose accuracy over every client's test set is then reported as ``global_acc``.
    Each client's own accuracy is kept by partition (:func:`client_accuracies`) as
    ``client_acc`` (and ``held_out_client_acc``) when the clients report their partition.
    """
    stats = accuracy_stats(results)
    global_acc = None
    # A client without test data reports accuracy NaN over 0 examples: it counts in no mean.
    tested = [(res.num_examples, float(res.metrics.get("accuracy", math.nan))) for _, res in results]
    tested = [(n, accuracy) for n, accuracy in tested if n > 0 and math.isfinite(accuracy)]
    if pooled and tested:
        global_acc = sum(n * accuracy for n, accuracy in tested) / sum(n for n, _ in tested)
    extra: dict[str, Any] = mean_metrics([(dict(res.metrics), res.num_examples) for _, res in results], "eval")
    if held_out:
        held = accuracy_stats(held_out)
        extra.update(held_out_acc_mean=held.mean, held_out_acc_worst=held.worst, held_out_clients=held.clients)
    for key, replies in (("client_acc", results), ("held_out_client_acc", held_out)):
        if accuracies := client_accuracies(replies):
            extra[key] = accuracies
    if (val := accuracy_stats(results, "val_accuracy")).clients:  # held back from training: what a sweep selects on
        per_client = client_accuracies(results, "val_accuracy")
        extra.update(val_acc_mean=val.mean, val_acc_worst=val.worst, val_clients=val.clients, client_val_acc=per_client)
    extra.update(novel_metrics(stats, results))
    domains = domain_accuracies(results, domain_of, domain_names)
    if domains:
        extra["domain_acc"] = domains
    losses = [(res.loss, res.num_examples) for _, res in results if res.num_examples > 0]
    loss = sum(v * n for v, n in losses) / sum(n for _, n in losses) if losses else None
    return Evaluation(stats, global_acc, loss, extra)


def close_round(
    server_round: int,
    round_log: RoundLog,
    totals: RunTotals,
    evaluation: Evaluation,
    eval_failures: int,
    evaluated: Sequence[str] = (),
) -> RoundRecord:
    """The record of a finished round; adds its traffic, parameters and FLOPs to ``totals``.

    ``evaluated`` names the clients whose evaluation replies count: the sampled ones not among
    them are ``eval_missing_clients``, and ``eval_subset`` says the accuracies cover fewer clients
    than the round asked."""
    eval_missing = round_log.missing("evaluate", evaluated)
    round_total = sum(round_log.bytes_up) + sum(round_log.bytes_down)
    totals.mb_cumulative += round_total / MB
    totals.mb_eval_cumulative += round_log.bytes_eval_down / MB
    params_total = sum(round_log.params_up) + sum(round_log.params_down)
    totals.params_cumulative += params_total
    totals.flops_cumulative += round_log.train_flops
    stats = evaluation.stats
    return RoundRecord(
        round=server_round,
        acc_mean=stats.mean,
        acc_worst=stats.worst,
        acc_std=stats.std,
        clients_evaluated=stats.clients,
        global_acc=evaluation.global_acc,
        train_loss=round_log.train_loss,
        clients_fit=round_log.clients_fit,
        clients_failed=round_log.clients_failed,
        bytes_up_per_client=float(np.mean(round_log.bytes_up)) if round_log.bytes_up else 0.0,
        bytes_down_per_client=float(np.mean(round_log.bytes_down)) if round_log.bytes_down else 0.0,
        bytes_round_total=round_total,
        mb_cumulative=totals.mb_cumulative,
        params_round_total=params_total,
        params_cumulative=totals.params_cumulative,
        train_flops_round=round_log.train_flops,
        train_flops_cumulative=totals.flops_cumulative,
        round_seconds=time.perf_counter() - round_log.started,
        extra={
            "eval_failures": eval_failures,
            "eval_subset": bool(eval_missing),
            "eval_missing_clients": eval_missing,
            "left_out_reasons": list(round_log.left_out),
            "round_skipped": round_log.skipped,
            # Not in mb_cumulative, which is the training traffic the papers count.
            "bytes_eval_down_round": round_log.bytes_eval_down,
            "mb_eval_cumulative": totals.mb_eval_cumulative,
            **round_log.extra,
            **evaluation.extra,
        },
    )


def write_round(
    record: RoundRecord, recorder: RunRecorder | None, num_rounds: int, save_checkpoint: Callable[[int], object]
) -> None:
    """Log the round's progress line; with a recorder, append the record, then checkpoint
    the run (``save_checkpoint(round)``) and, after the last round, draw the plots; then the ``done:`` line."""
    elapsed = log_progress(record, num_rounds, recorder)
    if recorder is None:
        return log_done(record, num_rounds, elapsed, recorder)
    try:
        recorder.add(record)
        save_checkpoint(record.round)
        if record.round >= num_rounds:
            recorder.finish()
    except OSError as err:  # a full disk, a folder gone read-only: say where, and what is kept
        where = f" ({err.filename})" if err.filename else ""
        raise StateError(
            f"cannot write run folder {recorder.directory} after round {record.round}: {err.strerror or err}{where}; "
            f"the run stops here, and {what_can_resume(recorder.directory)}"
        ) from err
    log_done(record, num_rounds, elapsed, recorder)


def open_recorder(config: RunConfig, domain_names: Sequence[str]) -> RunRecorder:
    """The results folder of this run (``results-dir``/``run-name``), its summary naming the data's domains,
    followed by the experiment tracker ``tracker`` names (:func:`fedapp.tracking.open_tracker`)."""
    recorder = RunRecorder(
        config.results_dir,
        config.resolved_run_name,
        config.as_dict(),
        config.target_accuracy,
        # A resumed run keeps its metrics until the checkpoint says which rounds count.
        fresh=not config.resume,
    )
    log.info("results go to %s", recorder.directory)
    if domain_names:
        recorder.summary_extra["domain_names"] = list(domain_names)
    # After the recorder: a refused run folder never opens a tracker run.
    try:
        tracker = open_tracker(config, recorder.directory)
    except BaseException:
        recorder.close()
        raise
    if tracker is not None:
        recorder.observers.append(tracker)
    return recorder


def open_run_folder(config: RunConfig, domain_names: Sequence[str]) -> RunRecorder:
    """:func:`open_recorder`, after naming the clients without test data, with what each client
    holds written beside (``partition.json`` and ``partition.png``; a resume keeps its own)."""
    summary = None
    if not config.resume:
        clients = functools.partial(load_client_data, config)
        summary = partition_summary(partition_settings(config.values), clients, held_out_clients(config))
        check_test_splits(summary)
    recorder = open_recorder(config, domain_names)
    if summary is not None:
        write_partition_files(recorder.directory, summary)
    return recorder


class UntestedClients:
    """Names, once each, the clients whose test split is empty (they count in no mean),
    but not those whose partitions the run folder's ``partition.json`` named before round 1."""

    def __init__(self, recorder: RunRecorder | None) -> None:
        self.report = None if recorder is None else recorder.directory / PARTITION_FILE
        self.named: set[str] | None = None

    def warn(
        self,
        replies: EvaluateReplies,
        name_of: Callable[[ClientProxy], str],
        partition_of: Mapping[str, int],
    ) -> None:
        if self.named is None:  # the first evaluation: what the report named
            self.named = set()
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
                summary = json.loads(self.report.read_text())
                self.named.update(f"p{partition}" for partition in untested_partitions(summary))
        new = []
        for proxy, res in replies:
            partition = partition_of.get(proxy.cid)
            key = proxy.cid if partition is None else f"p{partition}"
            if res.num_examples == 0 and key not in self.named:
                self.named.add(key)
                new.append(name_of(proxy))
        if new:
            log.warning(
                "client(s) %s have no test data (their split is too small for the test share): they are left "
                "out of the accuracy means, which cover the clients that were tested (clients_evaluated)",
                ", ".join(sorted(new)),
            )
