"""No deprecation notice from Flower in a run of this project's own ServerApp and ClientApp.

Flower 1.42 tells a user of a deprecated API in its log: a ``DEPRECATED FEATURE: ...``
warning through the ``flwr`` logger (``flwr.supercore.logger.warn_deprecated_feature``),
and, rarely, a Python ``DeprecationWarning``. A simulation logs in two kinds of
process, so :func:`flower_notices` watches both:

* this process, where the ServerApp runs (a thread of Flower's simulation engine): a
  handler on the ``flwr`` logger, and Python's warnings;
* the simulated clients, Ray actors in worker processes of their own: Ray writes each
  worker's output to files in its session's log folder (and forwards it to this
  process's stdout, late and asynchronously), so the bytes each file gained during
  the run are read back from there.

Some notices are logged once per process (``Grid.create_message``, ``Message.create_reply``,
the compat records); :func:`flower_notices` lets them show again, so a notice that an
earlier test in the same pytest process had caused still shows here.
``test_the_capture_sees_flowers_notices`` proves the capture sees a notice in each kind of
process, with ``flwr.simulation.run_simulation`` (deprecated) and a client that calls
``Message.create_reply`` (deprecated).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import flwr.app.message.message as flower_message
import flwr.app.message.recorddict as flower_recorddict
import pytest
import ray
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.compat.common.record.arrayrecord import ParametersRecord
from flwr.compat.common.record.configrecord import ConfigsRecord
from flwr.compat.common.record.metricrecord import MetricsRecord
from flwr.compat.common.record.recorddict import RecordSet
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from fedapp.client_app import make_client_app
from fedapp.metrics import read_metrics
from fedapp.server_app import make_server_app
from tests.simulation import BACKEND, simulate

#: How Flower's notices begin: "DEPRECATED FEATURE: ...".
FLOWER_NOTICE = "DEPRECATED"
#: Our own logger, a child of Flower's: its records are ours, not Flower's.
OUR_LOGGER = "flwr.fedapp"
#: The header Ray writes at the top of an actor's output files.
CLIENT_ACTOR_HEADER = ":actor_name:ClientAppActor"
DEPRECATION_CATEGORIES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


@dataclass
class FlowerNotices:
    """What a run showed of Flower's deprecations, and how much of the run was watched."""

    server: list[str] = field(default_factory=list)  # Flower's records in this process that say "deprecated"
    clients: list[str] = field(default_factory=list)  # lines of the clients' output with a notice
    warnings: list[str] = field(default_factory=list)  # Flower's DeprecationWarning / FutureWarning here
    records_seen: int = 0  # every record the handler got, so an empty capture shows
    client_actors_seen: int = 0  # client actors whose output was read

    def found(self) -> list[str]:
        """Every notice, from all three sources."""
        return [*self.server, *self.clients, *self.warnings]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _show_once_per_process_notices_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(InMemoryGrid, "_deprecation_warning_logged", False)
    for compat_record in (RecordSet, ConfigsRecord, MetricsRecord, ParametersRecord):
        monkeypatch.setattr(compat_record, "_warning_logged", False)
    for module in (flower_message, flower_recorddict):
        monkeypatch.setattr(module, "_warning_tracker", type(module._warning_tracker)())


def ray_worker_outputs() -> dict[Path, int]:
    """The size of every Ray worker's output file (a simulated client logs there); none
    while Ray is not running (the integration tier keeps it running once started)."""
    node = ray._private.worker._global_node if ray.is_initialized() else None
    if node is None:
        return {}
    return {path: path.stat().st_size for path in Path(node.get_logs_dir_path()).glob("worker-*")}


def worker_output_since(before: dict[Path, int]) -> str:
    """What the Ray workers wrote since ``before`` (:func:`ray_worker_outputs`)."""
    after = ray_worker_outputs()
    assert after, "Ray's worker output files were not found: the clients' log cannot be checked"
    parts = []
    for path in sorted(after):
        with path.open("rb") as output:
            output.seek(before.get(path, 0))
            parts.append(output.read().decode(errors="replace"))
    return "\n".join(parts)


def is_flower_warning(warning: warnings.WarningMessage) -> bool:
    """A deprecation-like Python warning raised in Flower's code or about Flower."""
    text = str(warning.message)
    in_flower = f"{os.sep}flwr{os.sep}" in warning.filename or "flwr" in text or "Flower" in text
    return issubclass(warning.category, DEPRECATION_CATEGORIES) and in_flower


def is_client_notice(line: str) -> bool:
    """A line of a client's output with Flower's notice or a Python deprecation warning from Flower."""
    python_warning = any(category.__name__ in line for category in DEPRECATION_CATEGORIES) and "flwr" in line
    return FLOWER_NOTICE in line or python_warning


@contextmanager
def flower_notices(monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowerNotices]:
    """Collect Flower's deprecation notices of the simulation run inside the block (see the module docstring)."""
    notices = FlowerNotices()
    _show_once_per_process_notices_again(monkeypatch)
    handler = _Records()
    flower_log = logging.getLogger("flwr")
    flower_log.addHandler(handler)
    before = ray_worker_outputs()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield notices
    finally:
        flower_log.removeHandler(handler)
    notices.records_seen = len(handler.records)
    notices.server = [
        r.getMessage() for r in handler.records if r.name != OUR_LOGGER and "deprecated" in r.getMessage().lower()
    ]
    notices.warnings = [f"{w.category.__name__}: {w.message} ({w.filename})" for w in caught if is_flower_warning(w)]
    output = worker_output_since(before)
    notices.client_actors_seen = output.count(CLIENT_ACTOR_HEADER)
    notices.clients = [line for line in output.splitlines() if is_client_notice(line)]


@pytest.mark.parametrize("api", ["legacy", "message"])
def test_our_apps_run_without_a_flower_deprecation_notice(api, tmp_path, monkeypatch):
    overrides = {
        "api": api,
        "method": "fedavg",
        "model": "cnn-1",
        "num-partitions": 2,
        "num-rounds": 1,
        "batch-size": 32,
        "results-dir": str(tmp_path / "results"),
        "run-name": "run",
    }
    with flower_notices(monkeypatch) as notices:
        simulate(make_server_app(overrides), make_client_app(overrides), num_supernodes=2, backend_config=BACKEND)
    assert [row["round"] for row in read_metrics(tmp_path / "results" / "run" / "metrics.jsonl")] == [1]
    assert notices.records_seen > 0 and notices.client_actors_seen > 0  # both kinds of process were watched
    assert notices.found() == []


def notice_causing_apps() -> tuple[ServerApp, ClientApp, list[int]]:
    """A ServerApp that queries every node once and a ClientApp that answers with the deprecated
    ``Message.create_reply`` (its notice is logged in the client's worker process); the list
    gets the number of replies the ServerApp received."""
    replies: list[int] = []
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        nodes = list(grid.get_node_ids())
        deadline = time.monotonic() + 120
        while len(nodes) < 2 and time.monotonic() < deadline:  # the engine registers the nodes as the app starts
            time.sleep(0.1)
            nodes = list(grid.get_node_ids())
        content = RecordDict({"query": ConfigRecord({"round": 1})})
        queries = [Message(content, dst_node_id=node, message_type=MessageType.QUERY) for node in nodes]
        replies.append(sum(reply.has_content() for reply in grid.send_and_receive(queries, timeout=120)))

    client_app = ClientApp()

    @client_app.query()
    def query(msg: Message, context: Context) -> Message:
        return msg.create_reply(RecordDict({"answer": ConfigRecord({"ok": 1})}))

    return server_app, client_app, replies


def test_the_capture_sees_flowers_notices(monkeypatch):
    from flwr.simulation import run_simulation  # noqa: PLC0415 - the deprecated API, on purpose

    server_app, client_app, replies = notice_causing_apps()
    with flower_notices(monkeypatch) as notices:
        run_simulation(server_app, client_app, num_supernodes=2, backend_config=BACKEND)
    assert replies == [2]
    assert any("`run_simulation` function is deprecated" in text for text in notices.server), notices.server
    assert any("`Message.create_reply` is deprecated" in line for line in notices.clients), notices.clients
