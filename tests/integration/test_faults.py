"""Fault injection: a failing client is left out of its round, with a logged reason, and counted.

A test-only ClientApp wraps this project's own client (built by
:func:`fedapp.client_app.make_client_fn`, exactly as a real node builds it) so
that chosen partitions misbehave in ``fit`` in chosen rounds: they raise, die,
stall, or reply with NaN/Inf values, arrays of the wrong shape, dtype or count,
a zero or negative example count, a NaN loss, or (per-class methods) a negative
class count. Every strategy validates replies in one place
(:meth:`fedapp.flower.strategy.FedAppStrategy.aggregate_fit`), so FedAvg carries most
cases and FedProto, whose uploads are per-class statistics, shows the same step
guards another method.

Several faults share one simulation, one per round, so that Ray starts only a
few times; each round's metrics line and log lines still name its fault.

How the failures reach the server in Flower's simulation engine:

* **raises**: the ClientApp's exception becomes an error reply
  (``CLIENT_APP_RAISED_EXCEPTION``); the server's client proxy raises on it, and
  the legacy server puts the exception into ``failures``.
* **disconnects**: simulated SuperNodes never go offline (the engine registers
  them with an infinite heartbeat interval), so the deployment-time reply
  ``NODE_UNAVAILABLE`` cannot occur here. What the engine does know as a lost
  client is the process running the ClientApp dying mid-message: the wrapper
  ends its Ray actor with ``os._exit``; Ray fails the task (``ActorDiedError``)
  and the engine answers the server with an error reply in place of the result,
  the same ``failures`` path as a lost node. Flower (1.42) puts the dead actor
  back into its pool, so every later message handed to it fails too (with Ray's
  ``max_restarts``, those sent while it restarts fail with
  ``ActorUnavailableError`` instead). This case therefore runs in the last
  round, and that round's evaluations lost to the dead actor are counted in
  ``eval_failures``.
* **times out**: ``round-timeout`` becomes Flower's ``ServerConfig.round_timeout``,
  which the legacy server passes on as each message's TTL. The simulation engine
  enforces it: once the TTL passes, the SuperLink answers with an "expired" error
  reply and the round goes on without the slow client; its late reply is dropped.
  Two things it does not do: stop the expired message (the slow client's actor
  stays busy until it returns), or exempt start-up (Ray starts its actors when
  round 1's messages arrive, inside their TTL); see :class:`Spy`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.client import Client, ClientApp
from flwr.common import (
    Context,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import Server, ServerApp, ServerAppComponents, ServerConfig, SimpleClientManager

from fedapp.client_app import make_client_fn
from fedapp.metrics import read_metrics
from fedapp.server_app import make_server_fn
from tests import simulation
from tests.simulation import BACKEND

CHEAP = {"num-partitions": 4, "min-clients": 2, "batch-size": 32, "model": "cnn-5", "run-name": "run"}

# Schedule: round -> {partition: fault}. Each round of the FedAvg run has one faulty
# client of four, except the round where three fail and the round is skipped, and a
# healthy one. The disconnect comes last: its Ray actor stays dead (see above).
FEDAVG_FAULTS = {
    1: {0: "raise"},
    2: {1: "nan"},
    3: {2: "inf"},
    4: {3: "shape"},
    5: {0: "dtype"},
    6: {1: "extra-array"},
    7: {2: "missing-array"},
    8: {3: "zero-examples"},
    9: {0: "negative-examples"},
    10: {1: "nan-loss"},
    11: {0: "nan", 1: "raise", 3: "shape"},  # one usable update < min-clients = 2
    12: {},
    13: {2: "disconnect"},
}
SKIPPED_ROUND = 11
HEALTHY_ROUND = 12
# FedProto clients upload per-class [means, counts]; this run also has a round timeout.
FEDPROTO_FAULTS = {
    1: {0: "negative-count"},
    2: {2: "timeout"},
    3: {1: "nan"},
}
# What the server's log line and the metrics line say about each fault.
REASONS = {
    "raise": "injected fault: the client crashed",
    "nan": "NaN or Inf",
    "inf": "NaN or Inf",
    "shape": "has shape",
    "dtype": "has dtype float64, expected float32",
    "extra-array": "arrays, expected",
    "missing-array": "arrays, expected",
    "zero-examples": "non-positive example count 0",
    "negative-examples": "non-positive example count -5",
    "nan-loss": "metric train_loss = nan is NaN or Inf",
    "disconnect": "ActorDiedError",
    "timeout": "timed out (no reply within round-timeout",
    "negative-count": "holds negative counts",
}
ROUND_TIMEOUT = 10.0
SLOW_CLIENT_SECONDS = ROUND_TIMEOUT + 6.0
# A disconnecting client first lets the round's other clients finish, so that none of
# their messages is handed to its dead actor.
DISCONNECT_AFTER_SECONDS = 5.0


class FaultyClient(Client):
    """Our real client, except that ``fit`` misbehaves as ``faults`` says for this partition."""

    def __init__(self, inner: Client, partition: int, faults: Mapping[int, Mapping[int, str]]) -> None:
        self.inner = inner
        self.partition = partition
        self.faults = faults

    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        return self.inner.get_properties(ins)

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        return self.inner.get_parameters(ins)

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        return self.inner.evaluate(ins)

    def fit(self, ins: FitIns) -> FitRes:
        fault = self.faults.get(int(ins.config["server-round"]), {}).get(self.partition)
        if fault == "raise":
            raise RuntimeError(REASONS["raise"])
        if fault == "disconnect":
            time.sleep(DISCONNECT_AFTER_SECONDS)
            os._exit(1)  # the process running this ClientApp dies mid-message
        if fault == "timeout":
            time.sleep(SLOW_CLIENT_SECONDS)
        res = self.inner.fit(ins)
        arrays = parameters_to_ndarrays(res.parameters)
        num_examples, metrics = res.num_examples, dict(res.metrics)
        if fault == "nan":
            arrays[0] = arrays[0].copy()
            arrays[0].flat[0] = np.nan
        elif fault == "inf":
            arrays[-1] = arrays[-1].copy()
            arrays[-1].flat[-1] = np.inf
        elif fault == "shape":
            arrays[0] = arrays[0].reshape(-1)  # same values and bytes, wrong layout
        elif fault == "dtype":
            arrays[0] = arrays[0].astype(np.float64)
        elif fault == "extra-array":
            arrays.append(np.zeros(3, np.float32))
        elif fault == "missing-array":
            arrays.pop()
        elif fault == "zero-examples":
            num_examples = 0
        elif fault == "negative-examples":
            num_examples = -5
        elif fault == "nan-loss":
            metrics["train_loss"] = float("nan")
        elif fault == "negative-count":
            arrays[-1] = arrays[-1].copy()
            arrays[-1][0] = -3
        return FitRes(res.status, ndarrays_to_parameters(arrays), num_examples, metrics)


def faulty_client_app(overrides: Mapping[str, Any], faults: Mapping[int, Mapping[int, str]]) -> ClientApp:
    """This project's ClientApp with :class:`FaultyClient` around each client it builds."""
    real_client_fn = make_client_fn(overrides)

    def client_fn(context: Context) -> Client:
        return FaultyClient(real_client_fn(context), int(context.node_config["partition-id"]), faults)

    return ClientApp(client_fn=client_fn)


class Spy:
    """Watches the ServerApp this project builds: what each round sent and aggregated.

    It also lifts the round timeout in round 1 alone. Ray starts its actors (and
    each imports torch and loads its data) only once round 1's messages have
    been sent, inside their TTL, which on a busy machine can take longer than any
    timeout worth waiting for in a test; and the engine still runs a message
    whose TTL has passed, delaying the rounds after it. With round 1 as a
    warm-up without a deadline, the timeout case is about the slow client alone.
    """

    def __init__(self) -> None:
        self.sent: dict[int, list[np.ndarray]] = {}
        self.aggregated: dict[int, bool] = {}
        self.after: dict[int, list[np.ndarray]] = {}
        self.config: ServerConfig | None = None

    def server_app(self, overrides: Mapping[str, Any]) -> ServerApp:
        real_server_fn = make_server_fn(overrides)

        def server_fn(context: Context) -> ServerAppComponents:
            components = real_server_fn(context)
            server = components.server or Server(
                client_manager=components.client_manager or SimpleClientManager(), strategy=components.strategy
            )
            self.watch(server)
            self.config = components.config
            return ServerAppComponents(server=server, config=components.config)

        return ServerApp(server_fn=server_fn)

    def watch(self, server: Server) -> None:
        strategy = server.strategy
        configure_fit, aggregate_fit = strategy.configure_fit, strategy.aggregate_fit
        fit_round, evaluate_round = server.fit_round, server.evaluate_round

        def spy_configure_fit(server_round, parameters, client_manager):
            self.sent[server_round] = parameters_to_ndarrays(parameters)
            return configure_fit(server_round, parameters, client_manager)

        def spy_aggregate_fit(server_round, results, failures):
            parameters, metrics = aggregate_fit(server_round, results, failures)
            self.aggregated[server_round] = parameters is not None
            self.after[server_round] = strategy.global_arrays
            return parameters, metrics

        strategy.configure_fit = spy_configure_fit
        strategy.aggregate_fit = spy_aggregate_fit
        server.fit_round = lambda server_round, timeout: fit_round(server_round, None if server_round == 1 else timeout)
        server.evaluate_round = lambda server_round, timeout: evaluate_round(
            server_round, None if server_round == 1 else timeout
        )


class Run:
    """One finished simulation: its metrics rows, server warnings and spy."""

    def __init__(self, rows: list[dict[str, Any]], warnings: list[str], spy: Spy, seconds: float) -> None:
        self.rows = {row["round"]: row for row in rows}
        self.warnings = warnings
        self.spy = spy
        self.seconds = seconds

    def warnings_of(self, server_round: int) -> list[str]:
        return [w for w in self.warnings if w.startswith(f"round {server_round}: ")]


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def simulate(directory: Path, faults: Mapping[int, Mapping[int, str]], **overrides: Any) -> Run:
    overrides = {**CHEAP, "results-dir": str(directory / "results"), "num-rounds": len(faults), **overrides}
    spy = Spy()
    handler = _ListHandler()
    logger = logging.getLogger("flwr.fedapp")
    logger.addHandler(handler)
    started = time.perf_counter()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("FEDAPP_CACHE_DIR", str(directory.parent / "fedapp-cache"))
            simulation.simulate(
                spy.server_app(overrides),
                faulty_client_app(overrides, faults),
                num_supernodes=overrides["num-partitions"],
                backend_config=BACKEND,
            )
    finally:
        logger.removeHandler(handler)
    rows = read_metrics(directory / "results" / "run" / "metrics.jsonl")
    return Run(rows, handler.lines, spy, time.perf_counter() - started)


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory) -> Run:
    return simulate(tmp_path_factory.mktemp("fedavg-faults"), FEDAVG_FAULTS, method="fedavg")


def single_fault_rounds(faults: Mapping[int, Mapping[int, str]]) -> list[tuple[int, int, str]]:
    return [(r, p, f) for r, by_partition in faults.items() if len(by_partition) == 1 for p, f in by_partition.items()]


def node_partitions(rows: Mapping[int, dict]) -> dict[str, int]:
    """Node id -> partition, from the run's left-out reasons that name both (``client <id> (partition <p>)``)."""
    named = (
        re.match(r"client (\d+) \(partition (\d+)\)", reason)
        for row in rows.values()
        for reason in row["left_out_reasons"]
    )
    return {match[1]: int(match[2]) for match in named if match}


def assert_left_out_alone(run: Run, server_round: int, partition: int, fault: str, healthy: int) -> None:
    """The round aggregated ``healthy`` updates and left out exactly the faulty one, saying why."""
    row = run.rows[server_round]
    assert row["clients_fit"] == healthy and row["clients_failed"] == 1, row
    assert not row["round_skipped"] and run.spy.aggregated[server_round]
    assert math.isfinite(row["train_loss"])
    [reason] = row["left_out_reasons"]
    assert REASONS[fault] in reason
    warnings = [w for w in run.warnings_of(server_round) if "left out" in w]
    assert len(warnings) == 1 and REASONS[fault] in warnings[0], run.warnings_of(server_round)
    if fault not in ("raise", "disconnect", "timeout"):
        # A reply that arrived names its client (it answered: it is not missing).
        assert f"(partition {partition})" in reason and row["fit_missing_clients"] == []
    else:
        # Flower hands over a failure's exception alone: the sampled client that never answered is named apart,
        # by its node id (its partition is asked only when sampling needs it); other rounds' reasons that name
        # this node with its partition must agree.
        [missing] = row["fit_missing_clients"]
        node = missing.removeprefix("client ").split()[0]
        assert node_partitions(run.rows).get(node, partition) == partition, row["fit_missing_clients"]


@pytest.mark.parametrize(
    ("server_round", "partition", "fault"),
    single_fault_rounds(FEDAVG_FAULTS),
    ids=[f for _, _, f in single_fault_rounds(FEDAVG_FAULTS)],
)
def test_fedavg_leaves_out_the_failing_client(fedavg_run, server_round, partition, fault):
    assert_left_out_alone(fedavg_run, server_round, partition, fault, healthy=3)


def test_fedavg_completes_every_round_and_still_learns(fedavg_run):
    rows = fedavg_run.rows
    assert sorted(rows) == list(FEDAVG_FAULTS)
    assert fedavg_run.spy.config.round_timeout is None  # round-timeout = 0: no deadline
    last = len(FEDAVG_FAULTS)
    for server_round, row in rows.items():
        assert row["round_skipped"] == (server_round == SKIPPED_ROUND)
        if server_round == last:
            # Evaluations handed to the disconnected client's dead actor fail; they are counted.
            assert row["clients_evaluated"] + row["eval_failures"] == 4
            # ...and named, and the round's accuracies say they are a subset's.
            assert len(row["eval_missing_clients"]) == row["eval_failures"]
            assert row["eval_subset"] == (row["eval_failures"] > 0)
            continue
        # A faulty fit does not keep a client from evaluating.
        assert row["clients_evaluated"] == 4 and row["eval_failures"] == 0
        assert row["eval_subset"] is False and row["eval_missing_clients"] == []
        assert 0.0 <= row["global_acc"] <= 1.0 and 0.0 <= row["acc_mean"] <= 1.0
    healthy = rows[HEALTHY_ROUND]
    assert healthy["clients_fit"] == 4 and healthy["clients_failed"] == 0 and healthy["left_out_reasons"] == []
    # Ten digit classes (chance 0.1): the global model learns despite a faulty client in most rounds.
    assert healthy["global_acc"] > max(rows[1]["global_acc"] + 0.2, 0.5)


def test_fedavg_skips_a_round_with_too_few_usable_updates(fedavg_run):
    run, skipped = fedavg_run, SKIPPED_ROUND
    row = run.rows[skipped]
    assert row["clients_fit"] == 1 and row["clients_failed"] == 3
    assert row["train_loss"] is None  # nothing was aggregated: null, as JSON has no NaN
    # The three left out, then why the round kept the previous global state.
    assert len(row["left_out_reasons"]) == 4
    assert row["left_out_reasons"][-1] == "1 usable updates, fewer than min-clients = 2"
    reasons = " | ".join(row["left_out_reasons"])
    for fault in FEDAVG_FAULTS[skipped].values():
        assert REASONS[fault] in reasons
    assert any("keeping the previous global state" in w for w in run.warnings_of(skipped)), run.warnings_of(skipped)
    # The strategy kept the global arrays of the round before, and the next round started from them.
    assert not run.spy.aggregated[skipped]
    for kept, previous, sent_next in zip(
        run.spy.after[skipped], run.spy.after[skipped - 1], run.spy.sent[skipped + 1], strict=True
    ):
        np.testing.assert_array_equal(kept, previous)
        np.testing.assert_array_equal(sent_next, previous)


@pytest.fixture(scope="module")
def fedproto_run(tmp_path_factory) -> Run:
    return simulate(
        tmp_path_factory.mktemp("fedproto-faults"),
        FEDPROTO_FAULTS,
        method="fedproto",
        **{"num-partitions": 3, "round-timeout": ROUND_TIMEOUT},
    )


@pytest.mark.parametrize(
    ("server_round", "partition", "fault"),
    single_fault_rounds(FEDPROTO_FAULTS),
    ids=[f for _, _, f in single_fault_rounds(FEDPROTO_FAULTS)],
)
def test_fedproto_leaves_out_the_failing_client(fedproto_run, server_round, partition, fault):
    # Per-class uploads ([means, counts]) pass the same validation as FedAvg's models.
    assert_left_out_alone(fedproto_run, server_round, partition, fault, healthy=2)


def test_round_timeout_is_enforced_in_simulation(fedproto_run):
    [timeout_round] = [r for r, faults in FEDPROTO_FAULTS.items() if "timeout" in faults.values()]
    row = fedproto_run.rows[timeout_round]
    assert fedproto_run.spy.config.round_timeout == ROUND_TIMEOUT  # the run config's round-timeout reached Flower
    # The server went on after the timeout instead of waiting for the slow reply.
    assert ROUND_TIMEOUT <= row["round_seconds"] < SLOW_CLIENT_SECONDS, row["round_seconds"]


def test_fedproto_completes_every_round_with_clean_prototypes(fedproto_run):
    rows = fedproto_run.rows
    assert sorted(rows) == list(FEDPROTO_FAULTS)
    for row in rows.values():
        assert row["global_acc"] is None  # personal models only
        assert row["clients_evaluated"] == 3 and 0.0 <= row["acc_mean"] <= 1.0
    prototypes, present = fedproto_run.spy.after[len(FEDPROTO_FAULTS)]
    assert np.all(np.isfinite(prototypes)) and set(np.unique(present)) <= {0.0, 1.0}
