"""fedapp.flower.replies on its own: which fit replies are usable and why the others are not,
the order updates are summed in, one-line failure reasons, and the AggregateReplies stand-in."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters

from fedapp.config import resolve_run_config
from fedapp.flower.driver import PartitionProxy, stand_in_manager
from fedapp.flower.recording import RoundLog
from fedapp.flower.replies import (
    ClientUpdate,
    accept,
    client_name,
    failure_reason,
    norm_problem,
    reply_order,
    round_problem,
    shortened,
    validated_updates,
)
from fedapp.strategies import FedAvgStrategy

GLOBAL = [np.zeros((2, 3), np.float32), np.zeros(4, np.int64)]


def fit_res(arrays, num_examples=10, **metrics) -> FitRes:
    metrics = {"server_round": 1, "train_loss": 0.5, **metrics}
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), num_examples, metrics)


def moved(by: float) -> list[np.ndarray]:
    return [GLOBAL[0] + by, GLOBAL[1] + 1]


def name_of(proxy, metrics) -> str:
    return client_name(proxy, {}, metrics)


def validate(results, norm_bound=0.0, expected=GLOBAL):
    round_log = RoundLog()
    updates = validated_updates(1, results, round_log, expected=expected, norm_bound=norm_bound, name_of=name_of)
    return updates, round_log


def test_usable_replies_are_counted_and_come_back_in_partition_order():
    replies = [
        (PartitionProxy(p), fit_res(moved(0.1 * p), 10 + p, partition_id=p, train_flops=100 * p)) for p in (2, 0, 1)
    ]
    updates, round_log = validate(replies)
    assert [u.cid for u in updates] == ["node-0", "node-1", "node-2"]
    assert [u.num_examples for u in updates] == [10, 11, 12]
    np.testing.assert_allclose(updates[2].arrays[0], 0.2)
    assert updates[0].bytes_up == sum(len(t) for t in replies[1][1].parameters.tensors)
    assert round_log.bytes_up == [u.bytes_up for u in updates]
    assert round_log.params_up == [10, 10, 10]  # 6 + 4 numbers each
    assert round_log.train_flops == 300
    assert round_log.clients_failed == 0 and round_log.left_out == []


BAD_REPLIES = [
    ("undecodable", lambda: FitRes(Status(Code.OK, ""), Parameters([b"junk"], "numpy.ndarray"), 10, {}), "undecodable"),
    ("another round", lambda: fit_res(moved(0.1), server_round=3), "reply for round 3 arrived in round 1"),
    ("wrong shape", lambda: fit_res([np.zeros((3, 2), np.float32), GLOBAL[1]]), "array 0 has shape (3, 2)"),
    ("NaN", lambda: fit_res([np.full((2, 3), np.nan, np.float32), GLOBAL[1]]), "NaN or Inf"),
    ("no examples", lambda: fit_res(moved(0.1), 0), "non-positive example count 0"),
    ("NaN loss", lambda: fit_res(moved(0.1), train_loss=float("nan")), "train_loss = nan is NaN or Inf"),
]


@pytest.mark.parametrize(("make", "reason"), [r[1:] for r in BAD_REPLIES], ids=[r[0] for r in BAD_REPLIES])
def test_a_bad_reply_is_refused_with_the_client_and_the_reason(make, reason, caplog):
    good = (PartitionProxy(0), fit_res(moved(0.1), partition_id=0))
    bad = (PartitionProxy(1), make())
    with caplog.at_level(logging.WARNING, logger="flwr.fedapp"):
        updates, round_log = validate([bad, good])
    assert [u.cid for u in updates] == ["node-0"]
    assert round_log.clients_failed == 1 and len(round_log.left_out) == 1
    assert round_log.left_out[0].startswith("client node-1: ") and reason in round_log.left_out[0]
    assert f"round 1: left out {round_log.left_out[0]}" in caplog.text
    assert round_log.bytes_up == [updates[0].bytes_up]  # only the usable reply's traffic counts


def test_the_norm_bound_refuses_only_updates_beyond_it():
    update = moved(0.5)
    norm = float(np.sqrt(6 * 0.25))  # over the float arrays only: integer ones are counts
    assert norm_problem(update, GLOBAL, 0.0) is None  # 0: no bound
    assert norm_problem(update, None, 1.0) is None  # nothing to compare with
    assert norm_problem(update, GLOBAL, norm + 1e-6) is None
    assert norm_problem(update, GLOBAL, 1.0) == f"update norm {norm:.4g} exceeds update-norm-bound = 1"
    updates, round_log = validate([(PartitionProxy(0), fit_res(update))], norm_bound=1.0)
    assert updates == [] and "update norm 1.225 exceeds update-norm-bound = 1" in round_log.left_out[0]
    updates, _ = validate([(PartitionProxy(0), fit_res(update))], norm_bound=1.3)
    assert len(updates) == 1


def test_without_expected_arrays_any_layout_is_taken():
    updates, _ = validate([(PartitionProxy(0), fit_res([np.ones(7, np.float32)]))], expected=None)
    assert len(updates) == 1 and updates[0].arrays[0].shape == (7,)


def test_round_problem_accepts_a_reply_without_a_round():
    assert round_problem({}, 4) is None
    assert round_problem({"server_round": 4}, 4) is None
    assert round_problem({"server_round": 2}, 4) == "reply for round 2 arrived in round 4"


def test_accept_counts_traffic_and_flops():
    round_log = RoundLog()
    update = ClientUpdate("a", [], 5, {"train_flops": 7}, 123)
    assert accept(round_log, update, 42) is update
    accept(round_log, ClientUpdate("b", [], 5, {}, 1), 2)
    assert round_log.bytes_up == [123, 1] and round_log.params_up == [42, 2] and round_log.train_flops == 7


def test_reply_order_is_by_partition_then_node_id():
    updates = [
        ClientUpdate("b", [], 1, {"partition_id": 1}, 0),
        ClientUpdate("z", [], 1, {}, 0),
        ClientUpdate("a", [], 1, {"partition_id": 1}, 0),
        ClientUpdate("c", [], 1, {"partition_id": 0}, 0),
    ]
    assert [u.cid for u in sorted(updates, key=reply_order)] == ["z", "c", "a", "b"]


def test_a_client_is_named_by_its_node_and_its_partition_when_known():
    proxy = PartitionProxy(3, "n7")
    assert client_name(proxy, {}, None) == "client n7"
    assert client_name(proxy, {}, {"partition_id": 5}) == "client n7 (partition 5)"
    assert client_name(proxy, {"n7": 3}, {"partition_id": 5}) == "client n7 (partition 3)"  # asked beats reported


def test_failure_reasons_are_one_line():
    proxy = PartitionProxy(2, "n2")
    failed = FitRes(Status(Code.FIT_NOT_IMPLEMENTED, "boom"), Parameters([], ""), 0, {"partition_id": 2})
    assert failure_reason((proxy, failed), name_of, 0.0) == "client n2 (partition 2): status FIT_NOT_IMPLEMENTED: boom"
    error = RuntimeError("message expired\nin transit")
    assert failure_reason(error, name_of, 0.0) == "a client that failed: RuntimeError: message expired ... in transit"
    timed_out = failure_reason(error, name_of, 30.0)
    assert timed_out.startswith("a client that failed: timed out (no reply within round-timeout = 30s): RuntimeError")
    assert failure_reason(ValueError("bad"), name_of, 30.0) == "a client that failed: ValueError: bad"


def test_shortened_keeps_the_first_and_last_line_without_colours():
    assert shortened("") == ""
    assert shortened("\x1b[31mTraceback\x1b[0m\n  frame\n\n  ValueError:   the   cause \n") == (
        "Traceback ... ValueError: the cause"
    )
    long = "x" * 150 + "y" * 200 + "z" * 250
    assert shortened(long) == "x" * 150 + " ... " + "z" * 250
    assert shortened("a" * 400) == "a" * 400


class Stand:
    """An AggregateReplies that hands over one pre-averaged update for all participants."""

    def __init__(self, aggregate):
        self.aggregate = aggregate
        self.calls = []

    def updates(self, strategy, server_round, results, round_log):
        self.calls.append(server_round)
        participants = [
            strategy.accept(round_log, ClientUpdate(p.cid, [], r.num_examples, dict(r.metrics), 1), 0)
            for p, r in results
        ]
        return participants, [ClientUpdate("all", self.aggregate, sum(u.num_examples for u in participants), {}, 0)]


def test_an_aggregate_replies_stand_in_takes_the_place_of_per_reply_validation():
    strategy = FedAvgStrategy(resolve_run_config({"model": "cnn-5", "num-partitions": 2}), 10)
    manager = stand_in_manager(2)
    strategy.configure_fit(1, strategy.initialize_parameters(manager), manager)
    aggregate = [a + 1 for a in strategy.global_arrays]
    strategy.secure_aggregation = Stand(aggregate)
    # Replies whose own payloads would be refused: the stand-in decides, not per-reply validation.
    junk = FitRes(Status(Code.OK, ""), Parameters([b"junk"], ""), 5, {"train_loss": 2.0})
    params, metrics = strategy.aggregate_fit(1, [(PartitionProxy(0), junk), (PartitionProxy(1), junk)], [])
    assert params is not None and strategy.secure_aggregation.calls == [1]
    assert strategy.clients_fit(1) == 2 and metrics["train_loss"] == 2.0
    for got, want in zip(strategy.global_arrays, aggregate, strict=True):
        np.testing.assert_allclose(got, want)
