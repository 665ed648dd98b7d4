"""fedapp.flower.recording on its own: a round's log, the run's totals, metrics means,
held-out / per-domain / base-to-novel statistics, and a round's record written out."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from flwr.common import Code, EvaluateRes, Status

from fedapp.config import resolve_run_config
from fedapp.flower.driver import PartitionProxy
from fedapp.flower.recording import (
    RoundLog,
    RunTotals,
    accuracy_stats,
    close_round,
    domain_accuracies,
    evaluation_order,
    mean_metrics,
    novel_metrics,
    num_params,
    open_recorder,
    summarize_evaluation,
    write_round,
)
from fedapp.metrics import MB, AccuracyStats


def evaluated(partition: int, accuracy: float, n: int = 10, loss: float = 1.0, **metrics):
    return PartitionProxy(partition), EvaluateRes(Status(Code.OK, ""), loss, n, {"accuracy": accuracy, **metrics})


def no_domain(cid: str) -> None:
    return None


def test_refuse_and_skip_note_the_reason(caplog):
    round_log = RoundLog()
    with caplog.at_level(logging.WARNING, logger="flwr.fedapp"):
        round_log.refuse(3, "client a: broken")
        round_log.skip(3, "secure aggregation halted")
    assert round_log.clients_failed == 1 and round_log.skipped
    assert round_log.left_out == ["client a: broken", "secure aggregation halted"]
    assert "round 3: left out client a: broken" in caplog.text
    assert "round 3: secure aggregation halted; keeping the previous global state" in caplog.text


def test_fit_metrics_are_example_weighted():
    round_log = RoundLog()
    round_log.add_fit_metrics([({"train_loss": 1.0, "kd_loss": 2.0}, 10), ({"train_loss": 4.0}, 30)])
    assert round_log.train_loss == pytest.approx((10 + 120) / 40)
    assert round_log.extra == {"fit_kd_loss": 2.0}
    empty = RoundLog()
    empty.add_fit_metrics([({}, 5)])
    assert math.isnan(empty.train_loss) and empty.extra == {}


def test_mean_metrics_skip_bookkeeping_text_and_empty_clients():
    replies = [
        ({"loss_a": 1.0, "accuracy": 0.9, "partition_id": 1, "note": "x", "count": 3}, 10),
        ({"loss_a": 3.0, "count": 5}, 30),
        ({"loss_a": 100.0}, 0),  # no examples: no weight
    ]
    assert mean_metrics(replies, "eval") == {"eval_count": pytest.approx(4.5), "eval_loss_a": pytest.approx(2.5)}
    assert mean_metrics([], "fit") == {}


def test_accuracy_statistics_ignore_clients_without_an_accuracy():
    results = [evaluated(0, 0.5), evaluated(1, 0.9), (PartitionProxy(2), EvaluateRes(Status(Code.OK, ""), 0, 1, {}))]
    stats = accuracy_stats(results)
    assert (stats.mean, stats.worst, stats.clients) == (pytest.approx(0.7), 0.5, 2)
    assert stats.std == pytest.approx(0.2)


def test_evaluation_order_sorts_by_accuracy_then_examples():
    results = [evaluated(0, 0.5, 20), evaluated(1, 0.2), evaluated(2, 0.5, 10)]
    assert [p.partition for p, _ in sorted(results, key=evaluation_order)] == [1, 2, 0]


def test_novel_metrics_are_the_harmonic_mean_with_the_base_accuracy():
    base = AccuracyStats.of([0.8, 0.6])
    results = [evaluated(0, 0.8, novel_accuracy=0.4), evaluated(1, 0.6, novel_accuracy=0.2)]
    got = novel_metrics(base, results)
    assert got["novel_acc_mean"] == pytest.approx(0.3) and got["novel_acc_worst"] == pytest.approx(0.2)
    assert got["harmonic_mean"] == pytest.approx(2 * 0.7 * 0.3 / 1.0)
    assert novel_metrics(base, [evaluated(0, 0.8)]) == {}
    assert novel_metrics(AccuracyStats.of([0.0]), [evaluated(0, 0.0, novel_accuracy=0.0)])["harmonic_mean"] == 0.0


def test_domain_accuracies_are_named_and_in_domain_order():
    results = [evaluated(3, 0.2), evaluated(0, 0.4), evaluated(1, 0.6), evaluated(9, 1.0)]
    domain = {"node-0": 0, "node-1": 0, "node-3": 2}  # node-9: unknown
    got = domain_accuracies(results, domain.get, ("clean",))
    assert list(got) == ["clean", "domain-2"]
    assert got["clean"] == pytest.approx(0.5) and got["domain-2"] == pytest.approx(0.2)
    assert domain_accuracies(results, no_domain, ()) == {}


def test_an_evaluation_keeps_held_out_clients_apart_and_pools_the_global_model():
    results = [evaluated(0, 0.5, 10, loss=2.0, eval_extra=1.0), evaluated(1, 1.0, 30, loss=1.0, eval_extra=3.0)]
    held_out = [evaluated(2, 0.1), evaluated(3, 0.3)]
    evaluation = summarize_evaluation(results, held_out, no_domain, (), pooled=True)
    assert evaluation.stats.mean == pytest.approx(0.75) and evaluation.stats.clients == 2
    assert evaluation.global_acc == pytest.approx((5 + 30) / 40)
    assert evaluation.loss == pytest.approx((20 + 30) / 40)
    assert evaluation.extra == {
        "eval_eval_extra": pytest.approx(2.5),
        "held_out_acc_mean": pytest.approx(0.2),
        "held_out_acc_worst": pytest.approx(0.1),
        "held_out_clients": 2,
    }
    personal = summarize_evaluation(results, [], lambda cid: 0, ("only",), pooled=False)
    assert personal.global_acc is None and "held_out_acc_mean" not in personal.extra
    assert personal.extra["domain_acc"] == {"only": pytest.approx(0.75)}
    nothing = summarize_evaluation([], [], no_domain, (), pooled=True)
    assert nothing.global_acc is None and nothing.loss is None and nothing.stats.clients == 0


def a_round(**fields) -> RoundLog:
    round_log = RoundLog(**fields)
    round_log.started -= 0.5
    return round_log


def test_closing_rounds_adds_up_the_totals():
    totals = RunTotals()
    evaluation = summarize_evaluation([evaluated(0, 0.5), evaluated(1, 0.7)], [], no_domain, (), pooled=True)
    first = a_round(
        clients_fit=2,
        train_loss=1.5,
        bytes_up=[MB, 3 * MB],
        bytes_down=[MB, MB],
        bytes_eval_down=2 * MB,
        params_up=[10, 10],
        params_down=[10, 10],
        train_flops=7,
        left_out=["client x: late"],
        extra={"generator_loss": 0.25},
        sampled={"evaluate": ["client 7 (partition 0)", "client 8 (partition 1)", "client 9 (partition 2)"]},
    )
    answered = ["client 7 (partition 0)", "client 8 (partition 1)"]
    record = close_round(1, first, totals, evaluation, eval_failures=1, evaluated=answered)
    assert (record.round, record.clients_fit, record.train_loss) == (1, 2, 1.5)
    assert (record.acc_mean, record.acc_worst, record.clients_evaluated) == (pytest.approx(0.6), 0.5, 2)
    assert record.bytes_up_per_client == 2 * MB and record.bytes_down_per_client == MB
    assert record.bytes_round_total == 6 * MB and record.mb_cumulative == 6.0
    assert (record.params_round_total, record.train_flops_round) == (40, 7)
    assert record.round_seconds >= 0.5
    assert record.extra == {
        "eval_failures": 1,
        "eval_subset": True,  # one of the three asked never answered: the accuracies are a subset's
        "eval_missing_clients": ["client 9 (partition 2)"],
        "left_out_reasons": ["client x: late"],
        "round_skipped": False,
        "bytes_eval_down_round": 2 * MB,
        "mb_eval_cumulative": 2.0,
        "generator_loss": 0.25,
    }
    second = close_round(2, a_round(skipped=True, bytes_down=[MB], params_down=[5]), totals, evaluation, 0)
    assert second.bytes_up_per_client == 0.0 and second.extra["round_skipped"]
    assert second.extra["eval_missing_clients"] == [] and not second.extra["eval_subset"]
    assert (second.mb_cumulative, second.params_cumulative, second.train_flops_cumulative) == (7.0, 45, 7)
    assert totals == RunTotals(mb_cumulative=7.0, mb_eval_cumulative=2.0, params_cumulative=45, flops_cumulative=7)


def test_totals_survive_a_checkpoint_and_an_old_one_without_evaluation_traffic():
    totals = RunTotals(1.5, 0.5, 12, 7)
    assert RunTotals.from_checkpoint(totals.as_checkpoint()) == totals
    old = {"mb_cumulative": 1.5, "params_cumulative": 12.0, "flops_cumulative": 7.0}
    assert RunTotals.from_checkpoint(old) == RunTotals(1.5, 0.0, 12, 7)
    assert isinstance(RunTotals.from_checkpoint(old).params_cumulative, int)


def test_num_params_counts_every_number():
    assert num_params([np.zeros((2, 3)), np.zeros(4, np.int64)]) == 10
    assert num_params([]) == 0


class FakeRecorder:
    def __init__(self):
        self.events = []

    def add(self, record):
        self.events.append(("add", record.round))

    def finish(self):
        self.events.append(("finish",))


def test_a_written_round_is_recorded_then_checkpointed_and_the_last_one_finishes_the_run(caplog):
    evaluation = summarize_evaluation([evaluated(0, 0.5)], [], no_domain, (), pooled=True)
    recorder = FakeRecorder()
    for server_round in (1, 2):
        record = close_round(server_round, a_round(), RunTotals(), evaluation, 0)
        with caplog.at_level(logging.INFO, logger="flwr.fedapp"):
            write_round(record, recorder, 2, lambda r: recorder.events.append(("checkpoint", r)))
    assert recorder.events == [("add", 1), ("checkpoint", 1), ("add", 2), ("checkpoint", 2), ("finish",)]
    assert caplog.text  # the progress line
    saved = []
    write_round(record, None, 2, saved.append)
    assert saved == []  # no results folder: nothing to checkpoint


def test_the_recorder_of_a_run_names_its_domains(tmp_path):
    config = resolve_run_config({"results-dir": str(tmp_path), "run-name": "r"})
    recorder = open_recorder(config, ("clean", "blur"))
    try:
        assert recorder.directory == tmp_path / "r"
        assert recorder.summary_extra["domain_names"] == ["clean", "blur"]
        assert (tmp_path / "r" / "metrics.jsonl").read_text() == ""
        nothing = summarize_evaluation([], [], no_domain, (), pooled=True)
        recorder.add(close_round(1, a_round(), RunTotals(), nothing, 0))
        assert json.loads((tmp_path / "r" / "metrics.jsonl").read_text())["round"] == 1
    finally:
        recorder.close()
    plain = open_recorder(resolve_run_config({"results-dir": str(tmp_path), "run-name": "s"}), ())
    plain.close()
    assert "domain_names" not in plain.summary_extra


def test_a_client_without_test_data_counts_in_no_mean():
    """Issue 42: a client with an empty test split made global_acc NaN (0 x NaN in the pooled sum)."""
    empty = (PartitionProxy(2), EvaluateRes(Status(Code.OK, ""), 0.0, 0, {"accuracy": math.nan}))
    evaluation = summarize_evaluation(
        [evaluated(0, 0.5, n=10), evaluated(1, 1.0, n=30), empty], [], no_domain, (), pooled=True
    )
    assert evaluation.global_acc == pytest.approx((0.5 * 10 + 1.0 * 30) / 40)
    assert evaluation.stats.clients == 2 and evaluation.stats.mean == pytest.approx(0.75)
