"""open_clip's log lines, in the app's log.

open_clip logs through the root logger (``logging.warning(...)``), and a root logger
without handlers then configures itself (``logging.basicConfig``): from that moment
every line of the app's logger printed twice, once through Flower's handler and once
as ``INFO:flwr.fedapp:...`` (seen on FedD2P's GPU runs, issue 40).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger("flwr.fedapp")

_RANDOM_INIT = "No pretrained weights loaded"


class _ToAppLog(logging.Handler):
    """Hands a root-logger record to the app's logger, marked as open_clip's."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != "root":  # the app's own records reach the root logger too
            return
        message = record.getMessage()
        # A random initialisation is what a run without `pretrained` asked for: said, not warned.
        level = logging.INFO if message.startswith(_RANDOM_INIT) else record.levelno
        log.log(level, "open_clip: %s", message)


@contextlib.contextmanager
def open_clip_logging() -> Iterator[None]:
    """Inside the block, what open_clip logs reaches the app's log, in Flower's format, and the
    root logger is left as it was found (a handler of ours on it while open_clip runs)."""
    root = logging.getLogger()
    bridge = _ToAppLog()
    root.addHandler(bridge)
    try:
        yield
    finally:
        root.removeHandler(bridge)
