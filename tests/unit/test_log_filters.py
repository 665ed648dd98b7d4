"""The ServerApp's quiet log: Flower's per-round bookkeeping and its History dump left out (on
both of Flower's APIs), every
warning and our own lines kept, Ray's accelerator FutureWarning hidden, colours off with NO_COLOR."""

from __future__ import annotations

import io
import logging
import re
import warnings

import numpy as np
import pytest
from flwr.app import ArrayRecord, MetricRecord
from flwr.common.logger import console_handler
from flwr.server.history import History
from flwr.serverapp.strategy import Strategy as MessageApiStrategy

from fedapp.server_app import RAY_ACCELERATOR_TIP, QuietFlowerLog, hide_ray_accelerator_tip, quiet_flower_log


@pytest.fixture
def flower_log():
    """A logger that gets Flower's records exactly as Flower's legacy server logs them, and what it let through."""
    logger = logging.getLogger("test-quiet-flower-log")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    logger.addHandler(handler)
    logger.addFilter(QuietFlowerLog())
    yield logger, seen
    logger.removeHandler(handler)
    logger.filters.clear()


def a_history() -> History:
    history = History()
    for server_round, loss in ((1, 1.43), (2, 2.28)):
        history.add_loss_distributed(server_round, loss)
        history.add_metrics_distributed_fit(server_round, {"train_loss": 1.8})
        history.add_metrics_distributed(server_round, {"acc_mean": 0.62, "acc_worst": 0.57})
    return history


def legacy_server_run(log, failures: int = 0) -> None:
    """The INFO records of flwr.server.Server.fit and run_fl for one round, with our round line in it."""
    log.info("Starting Flower ServerApp, config: %s", "num_rounds=1, no round_timeout")
    log.info("")
    log.info("[INIT]")
    log.info("Using initial global parameters provided by strategy")
    log.info("Starting evaluation of initial global parameters")
    log.info("Evaluation returned no results (`None`)")
    log.info("")
    log.info("[ROUND %s]", 1)
    log.info("configure_fit: strategy sampled %s clients (out of %s)", 10, 10)
    log.info("aggregate_fit: received %s results and %s failures", 10 - failures, failures)
    log.info("configure_evaluate: strategy sampled %s clients (out of %s)", 10, 10)
    log.info("aggregate_evaluate: received %s results and %s failures", 10, 0)
    log.info("round 1/1 | acc mean 0.623 worst 0.571 | ... | ETA 0s")
    log.info("done: round 1/1 | final acc mean 0.623 | 40.01 MB | 19s | results in /r")
    log.info("")
    log.info("[SUMMARY]")
    log.info("Run finished %s round(s) in %.2fs", 1, 20.95)
    for line in io.StringIO(str(a_history())):  # as run_fl logs the History
        log.info("\t%s", line.strip("\n"))
    log.info("")


def test_flowers_bookkeeping_and_history_are_left_out_our_lines_kept(flower_log):
    log, seen = flower_log
    legacy_server_run(log)
    assert seen.getvalue().splitlines() == [
        "round 1/1 | acc mean 0.623 worst 0.571 | ... | ETA 0s",
        "done: round 1/1 | final acc mean 0.623 | 40.01 MB | 19s | results in /r",
    ]


def test_failures_and_warnings_stay(flower_log):
    log, seen = flower_log
    legacy_server_run(log, failures=2)
    log.warning("")
    log.warning("[ROUND %s]", 3)  # only INFO records are Flower's bookkeeping
    assert seen.getvalue().splitlines() == [
        "aggregate_fit: received 8 results and 2 failures",
        "round 1/1 | acc mean 0.623 worst 0.571 | ... | ETA 0s",
        "done: round 1/1 | final acc mean 0.623 | 40.01 MB | 19s | results in /r",
        "",
        "[ROUND 3]",
    ]


def test_the_history_dump_of_the_workflow_api_is_left_out_and_what_follows_kept(flower_log):
    log, seen = flower_log
    log.info("Run finished %s round(s) in %.2fs", 2, 3.0)
    for index, line in enumerate(io.StringIO(str(a_history()))):  # as DefaultWorkflow logs it
        log.info("%s" if index == 0 else "\t%s", line.strip("\n"))
    log.info("Secure aggregation commencing.")
    log.info("%s", "an ordinary line after the dump")
    assert seen.getvalue().splitlines() == ["Secure aggregation commencing.", "an ordinary line after the dump"]


def test_a_record_with_a_non_text_message_passes():
    record = logging.LogRecord("flwr", logging.INFO, __file__, 1, {"a": 1}, (), None)
    assert QuietFlowerLog().filter(record)


def test_rays_accelerator_tip_is_hidden_and_other_future_warnings_are_not():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hide_ray_accelerator_tip()
        warnings.warn(f"{RAY_ACCELERATOR_TIP} visible devices env var if num_gpus=0", FutureWarning, stacklevel=1)
        warnings.warn("another future change", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another future change"]


@pytest.fixture
def flower_logger_state(monkeypatch):
    """Flower's logger filters and console colours as they were, after the test."""
    flower = logging.getLogger("flwr")
    monkeypatch.setattr(flower, "filters", list(flower.filters))
    monkeypatch.setattr(console_handler, "colored", console_handler.colored)
    return flower


def test_the_quiet_filter_is_installed_once_and_no_color_turns_colours_off(flower_logger_state, monkeypatch):
    monkeypatch.delenv("FLWR_LOG_LEVEL", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    quiet_flower_log()
    quiet_flower_log()
    assert sum(isinstance(f, QuietFlowerLog) for f in flower_logger_state.filters) == 1
    assert console_handler.colored is False


def test_flowers_debug_level_keeps_its_whole_log(flower_logger_state, monkeypatch):
    monkeypatch.setenv("FLWR_LOG_LEVEL", "debug")
    monkeypatch.delenv("NO_COLOR", raising=False)
    colored = console_handler.colored
    quiet_flower_log()
    assert not any(isinstance(f, QuietFlowerLog) for f in flower_logger_state.filters)
    assert console_handler.colored is colored


class RoundLineStrategy(MessageApiStrategy):
    """A Message-API strategy with no clients that logs one line per round, as ours do."""

    def configure_train(self, server_round, arrays, config, grid):
        return []

    def aggregate_train(self, server_round, replies):
        return ArrayRecord([np.zeros(2)]), MetricRecord({"train_loss": 1.5})

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        logging.getLogger("flwr").info("round %d/2 | acc mean 0.5", server_round)
        return MetricRecord({"acc_mean": 0.5})

    def summary(self):
        logging.getLogger("flwr").info("RoundLineStrategy on Flower's Message API")


class NoNodes:
    def send_and_receive(self, messages, *, timeout=None):
        return list(messages)


def test_the_message_apis_start_logs_only_our_lines(flower_logger_state):
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    flower_logger_state.addHandler(handler)
    flower_logger_state.addFilter(QuietFlowerLog())
    try:
        RoundLineStrategy().start(grid=NoNodes(), initial_arrays=ArrayRecord([np.zeros(2)]), num_rounds=2)
    finally:
        flower_logger_state.removeHandler(handler)
    assert seen.getvalue().splitlines() == [
        "RoundLineStrategy on Flower's Message API",
        "round 1/2 | acc mean 0.5",
        "round 2/2 | acc mean 0.5",
    ]


def test_open_clips_root_logger_lines_reach_the_app_log_and_leave_the_root_logger_unconfigured():
    """open_clip logs through the root logger; a root logger without handlers then configures
    itself, and every later line of the app's logger printed twice (FedD2P's GPU run:
    ``INFO :`` and ``INFO:flwr.fedapp:``). Loading a backbone forwards open_clip's lines instead."""
    from fedapp.models import TINY_CLIP  # noqa: PLC0415 - only this test needs open_clip
    from fedapp.models.clip import _load_cached, register_tiny_configs  # noqa: PLC0415

    app_level = logging.getLogger("flwr.fedapp").getEffectiveLevel()
    assert app_level <= logging.INFO  # Flower's logger prints INFO, where the random-init line goes

    register_tiny_configs()
    root, app = logging.getLogger(), logging.getLogger("flwr.fedapp")
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    saved = root.handlers[:]
    for existing in saved:  # as in a ServerApp process, where nothing configured the root logger
        root.removeHandler(existing)
    app.addHandler(handler)
    try:
        _load_cached.__wrapped__(TINY_CLIP, "", "cpu", "fp32")  # random init: open_clip warns through root
        assert root.handlers == []
    finally:
        app.removeHandler(handler)
        for existing in saved:
            root.addHandler(existing)
    random_init, loaded = seen.getvalue().splitlines()
    assert (
        random_init
        == "open_clip: No pretrained weights loaded for model 'fedapp-tiny-clip'. Model initialized randomly."
    )
    assert re.fullmatch(r"backbone fedapp-tiny-clip \(fp32\) loaded on cpu in \d+\.\d s", loaded)
