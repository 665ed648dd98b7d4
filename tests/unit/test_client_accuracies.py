"""Each evaluated client's accuracy per round, kept by partition for fairness analyses:
``client_acc`` (and ``held_out_client_acc``) in metrics.jsonl, keyed by ``str(partition id)``,
from the partition id every client now reports with its accuracy."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.common import Code, EvaluateRes, Status

from fedapp.clientdata import load_client_data
from fedapp.clients.fedavg import FedAvgClient
from fedapp.clients.standalone import StandaloneClient
from fedapp.config import resolve_run_config
from fedapp.flower.driver import PartitionProxy, stand_in_manager
from fedapp.flower.recording import client_accuracies, summarize_evaluation
from fedapp.metrics import read_metrics
from fedapp.state import MemoryStateStore
from fedapp.strategies import FedAvgStrategy


def evaluated(partition: int, accuracy: float, **metrics):
    reply = EvaluateRes(Status(Code.OK, ""), 1.0, 10, {"accuracy": accuracy, **metrics})
    return PartitionProxy(partition), reply


def no_domain(cid: str) -> None:
    return None


def test_client_accuracies_are_keyed_by_partition_as_strings_in_partition_order():
    replies = [
        evaluated(10, 0.9, partition_id=10),
        evaluated(2, 0.5, partition_id=2),
        evaluated(7, 0.25, partition_id=7),
        evaluated(3, 0.1),  # reported no partition: not attributable
    ]
    accuracies = client_accuracies(replies)
    assert accuracies == {"2": 0.5, "7": 0.25, "10": 0.9}
    assert list(accuracies) == ["2", "7", "10"]  # numeric order, not text order
    assert client_accuracies([]) == {}


def test_an_evaluation_keeps_training_and_held_out_clients_apart_and_never_averages_the_id():
    results = [evaluated(0, 0.5, partition_id=0), evaluated(1, 1.0, partition_id=1)]
    held_out = [evaluated(4, 0.2, partition_id=4)]
    extra = summarize_evaluation(results, held_out, no_domain, (), pooled=True).extra
    assert extra["client_acc"] == {"0": 0.5, "1": 1.0}
    assert extra["held_out_client_acc"] == {"4": 0.2}
    assert "eval_partition_id" not in extra  # bookkeeping, not a metric to average
    without_held_out = summarize_evaluation(results, [], no_domain, (), pooled=False).extra
    assert "held_out_client_acc" not in without_held_out


@pytest.mark.parametrize("client_class", [FedAvgClient, StandaloneClient])
def test_clients_report_the_partition_they_were_evaluated_on(client_class):
    config = resolve_run_config({"method": "fedavg", "num-partitions": 3, "partition": "iid"})
    client = client_class(config, load_client_data(config, 2, 3), MemoryStateStore({}), torch.device("cpu"))
    arrays = FedAvgStrategy(config, 10).initial_arrays() if client_class is FedAvgClient else []
    _loss, _n, metrics = client.evaluate(arrays, {"server-round": 1})
    assert metrics["partition_id"] == 2 and 0.0 <= metrics["accuracy"] <= 1.0


def test_metrics_jsonl_holds_each_clients_own_accuracy_under_client_acc(tmp_path):
    config = resolve_run_config(
        {
            "method": "fedavg",
            "num-partitions": 3,
            "num-rounds": 1,
            "partition": "iid",
            "results-dir": str(tmp_path),
            "run-name": "r",
        }
    )
    strategy = FedAvgStrategy.from_config(config, record=True)
    try:
        strategy.initialize_parameters(stand_in_manager(3))
        reported, replies = {}, []
        for partition in (2, 0, 1):  # replies arrive in any order
            data = load_client_data(config, partition, 3)
            client = FedAvgClient(config, data, MemoryStateStore({}), torch.device("cpu"))
            loss, n, metrics = client.evaluate(strategy.global_arrays, {"server-round": 1})
            reported[str(partition)] = metrics["accuracy"]
            replies.append((PartitionProxy(partition), EvaluateRes(Status(Code.OK, ""), loss, n, metrics)))
        strategy.aggregate_evaluate(1, replies, [])
    finally:
        strategy.recorder.close()
    (row,) = read_metrics(tmp_path / "r" / "metrics.jsonl")
    assert row["client_acc"] == reported and list(row["client_acc"]) == ["0", "1", "2"]
    assert math.isclose(sum(row["client_acc"].values()) / 3, row["acc_mean"])
    assert "eval_partition_id" not in row and "held_out_client_acc" not in row
