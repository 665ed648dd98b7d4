"""Flower ServerApp: validates the run config, checks the data, builds the strategy."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.common import Context
from flwr.common.logger import update_console_handler
from flwr.server import ClientManager, Grid, Server, ServerApp, ServerAppComponents, ServerConfig, SimpleClientManager
from flwr.server.compat import start_grid
from flwr.server.strategy import Strategy

from fedapp.config import RunConfig, resolve_run_config, unread_keys_warning
from fedapp.errors import error_line
from fedapp.extras import check_server_extras
from fedapp.flower.message_api import NO_TIMEOUT, MessageStrategy
from fedapp.flower.pending_index import index_pending_messages
from fedapp.flower.privacy import wrap_for_privacy
from fedapp.flower.secure_aggregation import run_secagg
from fedapp.metrics import check_clients_trained
from fedapp.registry import strategy_class
from fedapp.runfolder import nothing_to_resume, release_folder

log = logging.getLogger("flwr.fedapp")


def build_strategy(config: RunConfig, *, record: bool = True):
    """The configured method's strategy, after the data has been checked.

    Loading and partitioning the source here means a missing folder, a corrupt
    image or an empty client stops the run before any client trains; a missing optional
    package (an extra: plots, a tracker, CLIP) stops it before the data is loaded.
    """
    if record:
        check_server_extras(config)
    return strategy_class(config.method).from_config(config, record=record)


def server_config(config: RunConfig, num_rounds: int | None = None) -> ServerConfig:
    """Flower's round schedule: ``num_rounds`` rounds (default ``num-rounds``); with
    ``round-timeout`` > 0, a client that has not replied within that many seconds
    counts as failed in that round."""
    timeout = config.round_timeout
    rounds = config.num_rounds if num_rounds is None else num_rounds
    return ServerConfig(num_rounds=rounds, round_timeout=timeout if timeout > 0 else None)


class ResumingServer(Server):
    """Flower's legacy server, numbering rounds after those a resumed run had completed.

    Flower's loop always counts from 1; a run resumed after round ``k`` runs
    ``num-rounds - k`` more rounds, which are rounds ``k + 1 ...`` for the
    strategy and the clients (their seeds and schedules depend on it).
    """

    def __init__(self, *, client_manager: ClientManager, strategy: Strategy, completed_rounds: int = 0) -> None:
        super().__init__(client_manager=client_manager, strategy=strategy)
        self.completed_rounds = completed_rounds

    def fit_round(self, server_round: int, timeout: float | None):
        return super().fit_round(server_round + self.completed_rounds, timeout)

    def evaluate_round(self, server_round: int, timeout: float | None):
        return super().evaluate_round(server_round + self.completed_rounds, timeout)


# Flower's legacy server sends each client's message from a thread of its own that polls for
# the reply (every 0.1 s in simulation). Its default pool (cores + 4 threads) keeps at most
# that many messages in flight, so with light clients the workers wait on the polls; one
# thread per client puts every message of a round in flight at once.
MAX_IN_FLIGHT = 256


def in_flight_messages(config: RunConfig) -> int:
    """Threads the server sends a round's messages from: one per client, at most ``MAX_IN_FLIGHT``."""
    return max(1, min(config.num_partitions, MAX_IN_FLIGHT))


def prepared_strategy(config: RunConfig) -> tuple[Strategy, int]:
    """The configured method's strategy, resumed from its checkpoint when ``resume`` and
    wrapped for DP when ``dp`` is on, and the rounds it had completed."""
    if unread := unread_keys_warning(config.values):
        log.warning(unread)
    strategy = build_strategy(config)
    completed = strategy.resume() if config.resume else 0
    if completed >= config.num_rounds:
        log.info("the checkpoint has all %d rounds already; nothing left to run", completed)
    return wrap_for_privacy(strategy, config), completed  # itself unless dp is on


def legacy_server(strategy: Strategy, completed: int, config: RunConfig) -> tuple[ResumingServer, ServerConfig]:
    """Flower's legacy server for ``strategy`` and its schedule of the rounds after ``completed``."""
    server = ResumingServer(client_manager=SimpleClientManager(), strategy=strategy, completed_rounds=completed)
    server.set_max_workers(in_flight_messages(config))
    return server, server_config(config, max(config.num_rounds - completed, 0))


def server_components(config: RunConfig) -> ServerAppComponents:
    """The strategy (:func:`prepared_strategy`) and a legacy server for the remaining rounds."""
    server, schedule = legacy_server(*prepared_strategy(config), config)
    return ServerAppComponents(server=server, config=schedule)


class OneLineErrors(logging.Filter):
    """Flower's error records in the ServerApp's process, each as one line a user reads.

    Flower logs an exception that ends the ServerApp (or the simulation) with its
    traceback, then an "Exit Code" paragraph; a failing simulated client's error
    comes as three records (Ray's error text and a traceback). The first becomes
    ``error: <the problem>`` (:func:`fedapp.errors.error_line`), the paragraph after
    it is dropped, and a client's records are dropped because the strategy logs the
    client's own message in its one "left out" line. ``traceback = true`` keeps them.
    """

    def __init__(self) -> None:
        super().__init__("fedapp-one-line-errors")
        self.reported = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        if record.exc_info and record.exc_info[1] is not None:
            record.msg, record.args = "error: %s", (error_line(record.exc_info[1]),)
            record.exc_info = record.exc_text = None
            self.reported = True
            return True
        text = record.getMessage()
        if _is_client_failure_record(text):
            return False
        return not (self.reported and text.startswith("Exit Code:"))


_CLIENT_FAILURE_RECORDS = ("An exception was raised when processing a message", "An exception occurred !!")


def _is_client_failure_record(text: str) -> bool:
    return text.startswith(_CLIENT_FAILURE_RECORDS) or "Traceback (most recent call last)" in text or "ray::" in text


def show_errors_as_one_line(run_config: Mapping[str, Any]) -> None:
    """Install :class:`OneLineErrors` on Flower's logger (once per process) unless the run
    config asks for tracebacks; read raw, since a bad config is one of the errors to show."""
    flower_log = logging.getLogger("flwr")
    if run_config.get("traceback") is True:
        return
    if not any(isinstance(f, OneLineErrors) for f in flower_log.filters):
        flower_log.addFilter(OneLineErrors())


# Flower's legacy server logs these INFO records around every round: our progress line says it all.
_FLOWER_BOOKKEEPING = frozenset(
    {
        "",  # blank lines between Flower's sections
        "[INIT]",
        "[ROUND %s]",  # counted from 1, also in a run resumed after its checkpoint's rounds
        "[SUMMARY]",
        "Starting Flower ServerApp, config: %s",  # the rounds left, not the run's num-rounds
        "Using initial global parameters provided by strategy",
        "Starting evaluation of initial global parameters",
        "Evaluation returned no results (`None`)",  # every method evaluates on the clients, by design
        "configure_fit: strategy sampled %s clients (out of %s)",
        "configure_evaluate: strategy sampled %s clients (out of %s)",
        # Strategy.start of the Message API (api = message)
        "Starting %s strategy:",
        "\t├── Number of rounds: %d",
        "\t├── ArrayRecord (%.2f MB)",
        "\t├── ConfigRecord (train): %s",
        "\t├── ConfigRecord (evaluate): %s",
        "[ROUND %s/%s]",
        "\t└──> Aggregated MetricRecord: %s",
        "Strategy execution finished in %.2fs",
    }
)
# Kept only when some client failed: "received 10 results and 0 failures" is no news.
_FLOWER_FAILURE_COUNTS = frozenset(
    {"aggregate_fit: received %s results and %s failures", "aggregate_evaluate: received %s results and %s failures"}
)
# Each is followed by a dump of every round's metrics (one record per line, with blank ones).
_FLOWER_RUN_FINISHED = frozenset({"Run finished %s round(s) in %.2fs", "Final results:"})


class QuietFlowerLog(logging.Filter):
    """Flower's per-round bookkeeping left out of the ServerApp's log, where our one progress
    line per round (:mod:`fedapp.flower.progress`) and the run's ``done:`` line say what happened.

    Dropped, at INFO only (every warning and error stays): the section headers and blank
    lines, the sampling lines, "received N results and 0 failures" (kept when a client
    failed), the start-up lines about initial parameters and a server-side evaluation that no
    method does, and after the run its "Run finished" line with the ``History`` dump of
    every round's losses and metrics (all in ``metrics.jsonl``); on the Message API
    likewise ``Strategy.start``'s header, round headers, aggregated-metrics lines and
    "Final results" dump.
    """

    def __init__(self) -> None:
        super().__init__("fedapp-quiet-flower-log")
        self.in_history = False

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.msg
        if record.levelno != logging.INFO or not isinstance(text, str):
            return True
        if text in _FLOWER_RUN_FINISHED:
            self.in_history = True  # the History dump follows, one record per line
            return False
        if self.in_history and text in ("\t%s", "%s", ""):
            return False
        self.in_history = False
        if text in _FLOWER_FAILURE_COUNTS:
            return bool(isinstance(record.args, tuple) and len(record.args) == 2 and record.args[1])
        return text not in _FLOWER_BOOKKEEPING


#: The start of the FutureWarning Ray gives when its driver starts: a note about a future
#: default, for Ray's users; Flower sets the devices of its workers itself.
RAY_ACCELERATOR_TIP = "Tip: In future versions of Ray, Ray will no longer override accelerator"


def hide_ray_accelerator_tip() -> None:
    """Ignore Ray's :data:`RAY_ACCELERATOR_TIP` FutureWarning in this process (only that one).

    Setting the variable it names instead would change which GPUs a client without one sees.
    """
    warnings.filterwarnings("ignore", message=RAY_ACCELERATOR_TIP, category=FutureWarning)


def quiet_flower_log() -> None:
    """Install :class:`QuietFlowerLog` on Flower's logger (once per process), uncoloured when
    ``NO_COLOR`` is set; ``FLWR_LOG_LEVEL=DEBUG`` keeps Flower's whole log."""
    if os.environ.get("NO_COLOR"):
        update_console_handler(colored=False)
    if os.environ.get("FLWR_LOG_LEVEL", "").upper() == "DEBUG":
        return
    flower_log = logging.getLogger("flwr")
    if not any(isinstance(f, QuietFlowerLog) for f in flower_log.filters):
        flower_log.addFilter(QuietFlowerLog())


# At import: Ray's driver starts in this process while the ServerApp is still loading.
hide_ray_accelerator_tip()


def make_server_fn(overrides: Mapping[str, Any] | None = None):
    """A ``server_fn`` whose run config is Flower's, with ``overrides`` on top."""

    def server_fn(context: Context) -> ServerAppComponents:
        return server_components(resolve_run_config({**context.run_config, **(overrides or {})}))

    return server_fn


def make_server_app(overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp for this project (``overrides`` let tests and scripts set keys).

    With ``api = legacy`` (the default) it runs :func:`server_components`' legacy
    server, as ``ServerApp(server_fn=...)`` would; with ``secagg = true`` the same strategy
    goes through Flower's ``DefaultWorkflow`` with SecAgg+ fit rounds instead
    (:mod:`fedapp.flower.secure_aggregation`). With ``api = message`` the same strategy
    runs on Flower's Message API, as :class:`~fedapp.flower.message_api.MessageStrategy`.
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        quiet_flower_log()
        show_errors_as_one_line({**context.run_config, **(overrides or {})})
        config = resolve_run_config({**context.run_config, **(overrides or {})})
        run_dir = Path(config.results_dir).expanduser() / config.resolved_run_name
        if config.resume and (finished := nothing_to_resume(run_dir, config.num_rounds)):
            log.info(finished)  # before the strategy: resuming would rewrite the run's summary
            return
        index_pending_messages(grid)  # a simulation's: the engine's poll no longer scales with N x messages
        strategy, completed = prepared_strategy(config)
        try:
            if config.api == "message":
                message_strategy = MessageStrategy(strategy)
                message_strategy.start(
                    grid=grid,
                    initial_arrays=message_strategy.initial_arrays(),
                    num_rounds=message_strategy.rounds_left(),
                    timeout=config.round_timeout if config.round_timeout > 0 else NO_TIMEOUT,
                )
            else:
                server, schedule = legacy_server(strategy, completed, config)
                if config.secagg:
                    run_secagg(grid, context, strategy, config, schedule)
                else:  # what Flower's compatibility mode does with a server_fn's components
                    start_grid(grid=grid, server=server, config=schedule)
        finally:
            # Closing the recorder ends its tracker's run (FAILED unless the last round finished it);
            # a DP wrapper hands on the recorder of the strategy it wraps.
            recorder = getattr(strategy, "recorder", None)
            if recorder is not None:
                recorder.close()
            release_folder(run_dir)
        check_clients_trained(run_dir)

    return app


app = make_server_app()
