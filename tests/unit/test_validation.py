"""Clients score the same model on their validation split (held back from training, never the
test data) beside the test split; the server keeps the clients' mean, worst and per-partition
validation accuracy (issue 62)."""

from __future__ import annotations

import pytest
import torch
from flwr.common import Code, EvaluateRes, Status

from fedapp.clientdata import load_client_data
from fedapp.clients.fedavg import FedAvgClient
from fedapp.config import resolve_run_config
from fedapp.flower.driver import PartitionProxy
from fedapp.flower.recording import summarize_evaluation
from fedapp.params import set_arrays
from fedapp.state import MemoryStateStore
from fedapp.strategies import FedAvgStrategy
from fedapp.training import evaluate


def _reply(partition: int, accuracy: float, val: float | None, examples: int = 10):
    metrics = {"accuracy": accuracy, "partition_id": partition}
    if val is not None:
        metrics["val_accuracy"] = val
    return PartitionProxy(partition), EvaluateRes(Status(Code.OK, ""), 1.0, examples, metrics)


def no_domain(cid: str) -> None:
    return None


def test_the_validation_figures_are_the_unweighted_client_mean_worst_and_each_partitions():
    replies = [_reply(0, 0.9, 0.5, examples=100), _reply(1, 0.8, 1.0, examples=1), _reply(2, 0.7, None)]
    extra = summarize_evaluation(replies, [], no_domain, (), pooled=False).extra
    assert extra["val_acc_mean"] == pytest.approx(0.75)  # per client, as acc_mean: not weighted by examples
    assert extra["val_acc_worst"] == 0.5
    assert extra["val_clients"] == 2
    assert extra["client_val_acc"] == {"0": 0.5, "1": 1.0}
    assert "eval_val_accuracy" not in extra  # not averaged a second time by examples


def test_no_validation_figures_when_no_client_reports_one():
    extra = summarize_evaluation([_reply(0, 0.9, None)], [], no_domain, (), pooled=False).extra
    assert not {"val_acc_mean", "val_acc_worst", "client_val_acc"} & set(extra)


def test_a_client_scores_the_same_model_on_its_validation_split_and_on_its_test_split():
    config = resolve_run_config({"method": "fedavg", "num-partitions": 3, "partition": "iid", "model": "cnn-5"})
    data = load_client_data(config, 1, 3)
    client = FedAvgClient(config, data, MemoryStateStore({}), torch.device("cpu"))
    arrays = FedAvgStrategy(config, 10).initial_arrays()
    _loss, _n, metrics = client.evaluate(arrays, {"server-round": 1})
    model = client.new_model()
    set_arrays(model, arrays)
    assert metrics["val_accuracy"] == pytest.approx(evaluate(model, data.val, device=torch.device("cpu")).accuracy)
    assert metrics["accuracy"] == pytest.approx(evaluate(model, data.test, device=torch.device("cpu")).accuracy)
    assert len(data.splits["val"]) > 0  # split_stratified keeps it apart from train and test (test_data.py)


def test_with_a_test_pool_the_validation_split_is_the_clients_own_data_and_not_the_pool():
    config = resolve_run_config(
        {"method": "fedavg", "num-partitions": 2, "partition": "iid", "reserve-test": 0.2, "model": "cnn-5"}
    )
    data = load_client_data(config, 0, 2)
    total = len(data.splits["train"]) + len(data.splits["val"])
    assert len(data.splits["val"]) == pytest.approx(0.1 * total, abs=10)  # local-split's val share of its own data
    pool_images = {image.tobytes() for image in data.splits["test"].images}
    assert not pool_images & {image.tobytes() for image in data.splits["val"].images if image.any()}
