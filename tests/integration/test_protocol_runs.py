"""Evaluation protocols run for every method: domains, held-out clients and domains, base-to-novel.

The per-method runs use :mod:`fedapp.inprocess` (the real strategies and
clients, without Flower's transport), so all nineteen methods go through each
protocol in seconds; one Ray simulation checks the same end to end.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedapp.clientdata import base_class_count, held_out_clients, load_client_data, load_dataset
from fedapp.config import METHODS, resolve_run_config
from fedapp.data.domains import SYNTHETIC_DOMAINS
from fedapp.flower.driver import drive_rounds, stand_in_manager
from fedapp.inprocess import InProcessClients
from fedapp.metrics import read_metrics
from fedapp.report import load_run
from fedapp.server_app import build_strategy
from tests.simulation import BACKEND, simulate
from tests.unit.test_protocols import DOMAIN_PROTOCOL, METHOD_SETTINGS


class RecordingClients(InProcessClients):
    """The in-process clients, remembering which partitions were asked to train."""

    def __init__(self, overrides):
        super().__init__(overrides)
        self.trained: list[set[int]] = []

    def run(self, kind, instructions):
        if kind == "fit":
            self.trained.append({node.partition for node, _ in instructions})
        return super().run(kind, instructions)


def run_protocol(overrides, tmp_path):
    config = resolve_run_config({**overrides, "results-dir": str(tmp_path / "results"), "run-name": "run"})
    strategy = build_strategy(config, record=True)
    pool = RecordingClients(config.as_dict())
    drive_rounds(strategy, pool, stand_in_manager(int(config["num-partitions"])), int(config["num-rounds"]))
    return config, strategy, pool


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_the_domain_and_held_out_protocols(tmp_path, method):
    config, strategy, pool = run_protocol({"method": method, **DOMAIN_PROTOCOL, **METHOD_SETTINGS[method]}, tmp_path)
    held = held_out_clients(config)
    training = set(range(6)) - held
    assert len(pool.trained) == 2
    for trained, record in zip(pool.trained, strategy.history, strict=True):
        assert trained == training  # held-out clients and the held-out domain never train
        assert record.clients_fit == len(training) and record.clients_failed == 0
        # Per-domain means over the training clients, beside the overall mean.
        domains = record.extra["domain_acc"]
        trained_domains = sorted({p // 2 for p in training})
        assert list(domains) == [SYNTHETIC_DOMAINS[d] for d in trained_domains]
        assert all(0.0 <= acc <= 1.0 for acc in domains.values())
    for client in pool.clients.values():
        # Few-shot holds for every method: at most 4 training images per class.
        assert np.bincount(client.numpy_client.data.splits["train"].labels).max() <= 4
    summary = json.loads((tmp_path / "results" / "run" / "summary.json").read_text())
    assert summary["final_domain_acc"] == strategy.history[-1].extra["domain_acc"]
    if strategy.new_client_note:
        # A method that cannot serve a new client says so and prints no number.
        assert "held_out_acc_mean" not in strategy.history[-1].extra
        assert summary["final_held_out_acc_mean"] is None
        assert summary["held_out_note"].startswith(f"{method} cannot serve a client that never trained")
    else:
        assert strategy.history[-1].extra["held_out_clients"] == len(held)
        assert 0.0 <= summary["final_held_out_acc_mean"] <= 1.0
        assert "held_out_note" not in summary


def test_base_to_novel_client_data_never_mixes_base_and_novel_classes(tmp_path):
    config = resolve_run_config(
        {"method": "promptfl", "base-to-novel": True, "partition": "iid", "num-partitions": 3, "shots-per-class": 6}
    )
    source = load_dataset(config)
    base = base_class_count(source.num_classes)
    assert base == 5
    for client in range(3):
        data = load_client_data(config, client, 3)
        assert data.class_names == source.class_names[:5] and data.novel_class_names == source.class_names[5:]
        for split in ("train", "val", "test"):
            assert data.splits[split].labels.max() < base
        # Few-shot applies to the base classes the client trains on.
        assert np.bincount(data.splits["train"].labels).max() <= 6
        novel = data.splits["test_novel"]
        assert len(novel) > 0 and novel.labels.min() >= 0 and novel.labels.max() < source.num_classes - base


@pytest.mark.parametrize("method", ["coop-local", "promptfl", "sdfed"])
def test_prompt_methods_run_base_to_novel(tmp_path, method):
    overrides = {
        "method": method,
        "base-to-novel": True,
        "partition": "iid",
        "num-partitions": 3,
        "num-rounds": 2,
        "shots-per-class": 4,
        "prompt-length": 2,
    }
    _, strategy, pool = run_protocol(overrides, tmp_path)
    for client in pool.clients.values():
        prompt_client = client.numpy_client
        # The classifier trained over the five base class names only.
        assert prompt_client.encoder.class_names == prompt_client.data.class_names
        assert len(prompt_client.data.class_names) == 5
        assert int(prompt_client.data.splits["train"].labels.max()) < 5
    for record in strategy.history:
        base, novel, harmonic = record.acc_mean, record.extra["novel_acc_mean"], record.extra["harmonic_mean"]
        assert 0.0 <= novel <= 1.0
        assert harmonic == pytest.approx(2 * base * novel / (base + novel))
    summary = json.loads((tmp_path / "results" / "run" / "summary.json").read_text())
    assert summary["final_harmonic_mean"] == strategy.history[-1].extra["harmonic_mean"]


def test_domain_held_out_and_base_to_novel_in_a_ray_simulation(tmp_path):
    from fedapp.client_app import make_client_app  # noqa: PLC0415
    from fedapp.server_app import make_server_app  # noqa: PLC0415

    overrides = {
        "method": "promptfl",
        "partition": "domain",
        "synthetic-domains": 2,
        "clients-per-domain": 2,
        "num-partitions": 4,
        "held-out-domain": 1,
        "base-to-novel": True,
        "num-rounds": 2,
        "shots-per-class": 4,
        "prompt-length": 2,
        "results-dir": str(tmp_path / "results"),
        "run-name": "run",
    }
    simulate(
        make_server_app(overrides),
        make_client_app(overrides),
        num_supernodes=4,
        backend_config=BACKEND,
    )
    rows = read_metrics(tmp_path / "results" / "run" / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["clients_fit"] == 2 and row["clients_evaluated"] == 2  # domain 0's two clients
        assert row["held_out_clients"] == 2  # domain 1's, evaluated with the global prompt only
        assert list(row["domain_acc"]) == ["grayscale"]
        assert 0.0 <= row["novel_acc_mean"] <= 1.0 and 0.0 <= row["harmonic_mean"] <= 1.0
    # The comparison report reads back exactly these numbers.
    report = load_run(tmp_path / "results" / "run", target=0.0)
    last = rows[-1]
    assert (report.acc_mean, report.acc_worst, report.acc_std) == (last["acc_mean"], last["acc_worst"], last["acc_std"])
    assert (report.novel_acc_mean, report.harmonic_mean) == (last["novel_acc_mean"], last["harmonic_mean"])
    assert report.total_mb == last["mb_cumulative"] and report.rounds_to_target == 1
    assert report.bytes_per_round == pytest.approx(sum(r["bytes_round_total"] for r in rows) / 2)
    assert dict(report.domain_acc) == last["domain_acc"]
    assert "leave-one-domain-out: blur" in report.protocol
