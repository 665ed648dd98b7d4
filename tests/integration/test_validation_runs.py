"""Every method scores its clients on the validation data they hold back from training, every
round, beside the test accuracy: ``val_acc_mean``, ``val_acc_worst`` and ``client_val_acc`` in
metrics.jsonl, what a sweep selects on (issue 62)."""

from __future__ import annotations

import pytest

from fedapp.config import METHODS
from fedapp.inprocess import run_in_process
from tests.unit.test_protocols import METHOD_SETTINGS

SMALL = {"num-partitions": 3, "num-rounds": 2, "partition": "iid", "shots-per-class": 4, "batch-size": 16}


@pytest.mark.parametrize("method", METHODS)
def test_every_method_records_its_clients_validation_accuracy_every_round(method):
    strategy = run_in_process({"method": method, **SMALL, **METHOD_SETTINGS[method]})
    assert len(strategy.history) == 2
    for record in strategy.history:
        extra = record.extra
        assert set(extra["client_val_acc"]) == set(extra["client_acc"])  # every tested client validated too
        values = list(extra["client_val_acc"].values())
        assert all(0.0 <= value <= 1.0 for value in values)
        assert extra["val_acc_mean"] == pytest.approx(sum(values) / len(values))
        assert extra["val_acc_worst"] == min(values)


def test_a_split_without_validation_data_records_no_validation_accuracy():
    strategy = run_in_process({"method": "fedavg", **SMALL, "local-split": "0.9,0,0.1", "model": "cnn-5"})
    for record in strategy.history:
        assert "val_acc_mean" not in record.extra and "client_val_acc" not in record.extra
