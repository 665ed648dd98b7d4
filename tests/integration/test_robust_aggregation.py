"""Poisoned updates: 2 of 10 clients send finite, well-shaped but malicious updates (their real
update, sign-flipped and scaled by 10). The plain mean takes them in and its accuracy falls;
Flower's robust rules, offered by the ``aggregation`` key, leave them out and hold; the
norm bound refuses them by name.

Run with the real strategy and clients in this process (:mod:`fedapp.inprocess`).
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import FitRes, ndarrays_to_parameters, parameters_to_ndarrays

from fedapp.config import resolve_run_config
from fedapp.flower.driver import drive_rounds, stand_in_manager
from fedapp.inprocess import InProcessClients
from fedapp.server_app import build_strategy

POISONED = (0, 1)
SETTING = {
    "method": "fedavg",
    "model": "cnn-5",
    "num-partitions": 10,
    "partition": "iid",
    "num-rounds": 6,
    "batch-size": 32,
    "lr": 0.02,
    "momentum": 0.9,
}


class PoisoningClients(InProcessClients):
    """The in-process clients; partitions in :data:`POISONED` turn their update into ``-10 x`` itself."""

    def run(self, kind, instructions):
        replies = super().run(kind, instructions)
        if kind != "fit":
            return replies
        poisoned = []
        for (node, ins), (_, res) in zip(instructions, replies, strict=True):
            if node.partition in POISONED:
                sent = parameters_to_ndarrays(ins.parameters)
                got = parameters_to_ndarrays(res.parameters)
                arrays = [
                    (s - 10.0 * (g - s)).astype(g.dtype) if np.issubdtype(g.dtype, np.floating) else g
                    for s, g in zip(sent, got, strict=True)
                ]
                res = FitRes(res.status, ndarrays_to_parameters(arrays), res.num_examples, res.metrics)
            poisoned.append((node, res))
        return poisoned


def final_accuracy(attack: bool, **overrides) -> tuple[float, list]:
    config = resolve_run_config({**SETTING, **overrides})
    strategy = build_strategy(config, record=False)
    pool = (PoisoningClients if attack else InProcessClients)(config.as_dict())
    drive_rounds(strategy, pool, stand_in_manager(10), int(config["num-rounds"]))
    return strategy.history[-1].acc_mean, strategy.history


@pytest.fixture(scope="module")
def clean() -> float:
    return final_accuracy(attack=False)[0]


def test_the_plain_mean_falls_under_poisoning(clean):
    poisoned, _ = final_accuracy(attack=True)
    assert clean > 0.2  # twice chance after six short rounds
    assert poisoned < 0.1


@pytest.mark.parametrize(
    "rule",
    [{"aggregation": "median"}, {"aggregation": "trimmed-mean"}, {"aggregation": "multi-krum", "byzantine-clients": 2}],
)
def test_a_robust_rule_holds_under_poisoning(clean, rule):
    accuracy, _ = final_accuracy(attack=True, **rule)
    assert accuracy > max(clean - 0.05, 0.2)


def test_the_norm_bound_leaves_the_poisoned_updates_out_by_name(clean):
    accuracy, history = final_accuracy(attack=True, **{"update-norm-bound": 0.2})
    reasons = history[0].extra["left_out_reasons"]
    assert all(record.clients_fit == 8 and record.clients_failed == 2 for record in history), reasons
    assert len(reasons) == 2 and all("exceeds update-norm-bound = 0.2" in reason for reason in reasons)
    assert accuracy > max(clean - 0.05, 0.2)
