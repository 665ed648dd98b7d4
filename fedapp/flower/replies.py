"""Judging what clients send back: which fit replies are usable (:func:`validated_updates`),
what a usable one is (:class:`ClientUpdate`), the fixed order they are summed in
(:func:`reply_order`), one line on why a client sent nothing usable (:func:`failure_reason`),
and :class:`AggregateReplies`, what stands in for per-reply validation when every reply
carries the round's aggregate (SecAgg+).

A refused reply never stops a round: it is logged, counted as failed and its reason kept
for the round's metrics line (:meth:`fedapp.flower.recording.RoundLog.refuse`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from flwr.common import FitRes, Scalar
from flwr.server.client_proxy import ClientProxy

from fedapp.aggregation import Arrays, metrics_problem, update_norm, update_problem
from fedapp.errors import client_error_message
from fedapp.flower.recording import RoundLog, num_params
from fedapp.metrics import payload_bytes
from fedapp.params import decode_parameters

#: What Flower's error reply says when a client's message outlived its TTL (the round timeout).
TIMEOUT_HINT = "expired"
# Terminal colour codes that Ray puts into its error texts.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")

FitReplies = list[tuple[ClientProxy, FitRes]]
#: Names a client in log lines and left-out reasons, from its proxy and the metrics it sent.
ClientNamer = Callable[[ClientProxy, Mapping[str, Scalar] | None], str]


@dataclass(frozen=True)
class ClientUpdate:
    """One client's validated reply to a fit instruction."""

    cid: str
    arrays: Arrays
    num_examples: int
    metrics: dict[str, Scalar]
    bytes_up: int


def reply_order(update: ClientUpdate) -> tuple[int, str]:
    """Replies arrive in completion order; a fixed order keeps float sums, and so runs, reproducible."""
    return int(update.metrics.get("partition_id", -1)), update.cid


class ReplyJudge(Protocol):
    """What an :class:`AggregateReplies` asks of the strategy whose replies it stands in for (a
    :class:`~fedapp.flower.strategy.FedAppStrategy`, which composes this module and so is not
    named here)."""

    def expected_update(self) -> Arrays | None: ...

    def leave_out(
        self, server_round: int, round_log: RoundLog, proxy: ClientProxy, metrics: dict[str, Scalar], problem: str
    ) -> None: ...

    def accept(self, round_log: RoundLog, update: ClientUpdate, params: int) -> ClientUpdate: ...


class AggregateReplies(Protocol):
    """What stands in for per-reply validation when every fit reply carries the round's
    aggregate instead of one client's arrays (SecAgg+: :class:`fedapp.flower.secure_aggregation.SecAggReplies`)."""

    def updates(
        self,
        strategy: ReplyJudge,
        server_round: int,
        results: FitReplies,
        round_log: RoundLog,
    ) -> tuple[list[ClientUpdate], list[ClientUpdate]]:
        """``(participants, to_aggregate)``: one update per usable participant, and the aggregate."""
        ...


def client_name(proxy: ClientProxy, partition_of: Mapping[str, int], metrics: Mapping[str, Scalar] | None) -> str:
    """The client's node id, and its partition when known (asked, else as reported with its reply)."""
    partition = partition_of.get(proxy.cid, (metrics or {}).get("partition_id"))
    return f"client {proxy.cid}" + ("" if partition is None else f" (partition {partition})")


def round_problem(metrics: Mapping[str, Scalar], server_round: int) -> str | None:
    """A reply that says it was trained for another round (a late or replayed message) is refused."""
    replied = metrics.get("server_round")
    if replied is not None and replied != server_round:
        return f"reply for round {replied} arrived in round {server_round}"
    return None


def norm_problem(arrays: Arrays, expected: Arrays | None, bound: float) -> str | None:
    """An update farther than ``bound`` (``update-norm-bound``; 0 = no bound) from the
    global arrays (a scaled or poisoned one)."""
    if bound <= 0 or expected is None:
        return None
    norm = update_norm(arrays, expected)
    return None if norm <= bound else f"update norm {norm:.4g} exceeds update-norm-bound = {bound:g}"


def accept(round_log: RoundLog, update: ClientUpdate, params: int) -> ClientUpdate:
    """Count one usable reply's traffic (bytes and ``params`` numbers) and training FLOPs in the round."""
    round_log.bytes_up.append(update.bytes_up)
    round_log.params_up.append(params)
    round_log.train_flops += int(update.metrics.get("train_flops", 0))
    return update


def validated_updates(
    server_round: int,
    results: FitReplies,
    round_log: RoundLog,
    expected: Arrays | None,
    norm_bound: float,
    name_of: ClientNamer,
) -> list[ClientUpdate]:
    """The usable fit replies of a round, in :func:`reply_order`.

    A reply is refused when its payload cannot be decoded, it answers another
    round, its arrays do not match ``expected`` (shapes, dtypes; None: no check)
    or hold NaN/Inf, its example count or metrics are unusable, or its update is
    longer than ``norm_bound``. Each refused one is counted in ``round_log`` with
    its reason, named by ``name_of``; each usable one's traffic is counted.
    """
    updates = []
    for proxy, res in results:
        up = payload_bytes(res.parameters.tensors)
        try:
            arrays = decode_parameters(res.parameters.tensors)
        except Exception as err:
            problem = f"undecodable payload ({err})"
        else:
            problem = (
                round_problem(res.metrics, server_round)
                or update_problem(arrays, res.num_examples, expected)
                or metrics_problem(res.metrics)
                or norm_problem(arrays, expected, norm_bound)
            )
        if problem is not None:
            round_log.refuse(server_round, f"{name_of(proxy, res.metrics)}: {problem}")
            continue
        update = ClientUpdate(proxy.cid, arrays, res.num_examples, dict(res.metrics), up)
        updates.append(accept(round_log, update, num_params(arrays)))
    return sorted(updates, key=reply_order)


def failure_reason(
    failure: tuple[ClientProxy, FitRes] | BaseException, name_of: ClientNamer, round_timeout: float
) -> str:
    """One line on why a client sent no usable reply (an error, a lost node, a timeout
    after ``round_timeout`` seconds; 0 = none)."""
    if isinstance(failure, BaseException):
        # Flower's legacy server hands over the bare exception, without the client's proxy.
        text = client_error_message(f"{type(failure).__name__}: {failure}")
        if round_timeout > 0 and TIMEOUT_HINT in text:
            text = f"timed out (no reply within round-timeout = {round_timeout:g}s): {text}"
        return "a client that failed: " + shortened(text)
    proxy, res = failure
    name = name_of(proxy, res.metrics)
    return shortened(f"{name}: status {res.status.code.name}: {client_error_message(res.status.message)}")


def shortened(text: str, head: int = 150, tail: int = 250) -> str:
    """An error text on one line: its first line and its last (where a remote
    traceback ends in the client's own message), each cut to length."""
    lines = [" ".join(line.split()) for line in _ANSI_ESCAPE.sub("", text).splitlines() if line.strip()]
    if not lines:
        return ""
    first, last = lines[0], lines[-1]
    if len(lines) == 1:
        return first if len(first) <= head + tail else f"{first[:head]} ... {first[-tail:]}"
    return f"{first[:head]} ... {last[-tail:]}"
