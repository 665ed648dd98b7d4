"""The log of a launched run as the user sees it: ``flwr run --stream``'s output, cleaned, with a
live progress bar on a terminal.

Flower's log arrives coloured whatever reads it; here colour codes are removed unless the
output is a terminal (and ``NO_COLOR`` is unset), lines that are false for a launched run or
repeated by every simulated worker are dropped (:class:`LogCleaner`), and on a terminal a
rich progress bar (rounds done, last mean accuracy, elapsed time, ETA) follows the server's
round lines (:func:`fedapp.flower.progress.parse_round_line`). Elsewhere (CI, files, pipes):
plain lines only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from fedapp.flower.progress import RoundProgress, parse_round_line

# CSI sequences (colours, cursor moves) and the two-byte escapes: what a terminal interprets.
_ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape codes (Flower's and Ray's colours)."""
    return _ANSI_ESCAPE.sub("", text)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal that can show a live progress bar."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


def wants_colour(stream: TextIO) -> bool:
    """Whether to pass colour codes on to ``stream``: a terminal, and no ``NO_COLOR`` (no-color.org)."""
    return is_terminal(stream) and not os.environ.get("NO_COLOR")


# A line of a simulated client's worker, as Ray prefixes it: "(ClientAppActor pid=123) text".
_RAY_WORKER_LINE = re.compile(r"^\((?P<actor>[\w.]+) pid=\d+(?:, ip=[^)]*)?\) (?P<text>.*)$", re.DOTALL)


class LogCleaner:
    """Decides which lines of a launched run's log to show (:meth:`keep`, given colourless text).

    Dropped: Flower's warning that the default number of simulated SuperNodes changed from
    10 to 2, which it gives even when the federation is sized explicitly, as the launcher
    always does, and its hint on how to resize the federation, which for a launched run is
    ``--num-clients``; the warning each simulated worker gives when it is stopped at the
    normal end of a run; Ray's FutureWarning about accelerator variables (with its source
    line) when the ServerApp could not hide it first; and a simulated client's worker line
    that another worker already gave word for word (each worker says which device it uses).
    """

    DROPPED = (
        "default simulated SuperNodes changed from 10 to 2",  # the launcher sizes the federation itself
        "Manually terminating ClientAppActor",  # a WARNING for each worker's normal end
    )
    # A dropped line whose next line belongs to it: (text of the line, start of the next one).
    CONTINUED = (
        ("To change federation size, use the following command:", "flwr federation simulation-config"),
        ("FutureWarning: Tip: In future versions of Ray", "warnings.warn("),
    )

    def __init__(self) -> None:
        self._continuation: str | None = None
        self._worker_lines: set[tuple[str, str]] = set()

    def keep(self, text: str) -> bool:
        """Whether to show the line ``text`` (colour codes already removed)."""
        content = text.strip()
        continuation, self._continuation = self._continuation, None
        if continuation is not None and continuation in content:
            return False
        for line, next_line in self.CONTINUED:
            if line in content:
                self._continuation = next_line
                return False
        if any(dropped in content for dropped in self.DROPPED):
            return False
        worker = _RAY_WORKER_LINE.match(content)
        if worker is not None:
            key = (worker["actor"], worker["text"].strip())
            if key in self._worker_lines:
                return False
            self._worker_lines.add(key)
        return True


class RoundBar:
    """A rich progress bar of a run's rounds, under the log lines printed through :meth:`show`."""

    def __init__(self, stream: TextIO, num_rounds: int) -> None:
        self.progress = Progress(
            TextColumn("rounds"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[accuracy]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            console=Console(file=stream),
        )
        self.task = self.progress.add_task("rounds", total=num_rounds, accuracy="acc mean -", eta="ETA -")

    def __enter__(self) -> RoundBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def show(self, line: str) -> None:
        """Print one log line (with its colour codes, which rich renders) above the bar."""
        self.progress.console.print(Text.from_ansi(line.rstrip("\n")), soft_wrap=True)

    def update(self, progress: RoundProgress) -> None:
        """Move the bar to the round a round line reports."""
        self.progress.update(
            self.task,
            completed=progress.round,
            total=progress.num_rounds,
            accuracy=f"acc mean {progress.acc_mean:.3f}",
            eta=f"ETA {progress.eta}",
        )


def show_log(lines: Iterable[str], stream: TextIO, num_rounds: int) -> None:
    """Write a run's log ``lines`` to ``stream``: cleaned (:class:`LogCleaner`), without colour
    codes unless :func:`wants_colour`, under a :class:`RoundBar` when :func:`is_terminal`."""
    cleaner = LogCleaner()
    colour = wants_colour(stream)
    bar_context = RoundBar(stream, num_rounds) if is_terminal(stream) else contextlib.nullcontext()
    with bar_context as bar:
        for line in lines:
            text = strip_ansi(line)
            if not cleaner.keep(text):
                continue
            shown = line if colour else text
            if bar is None:
                stream.write(shown if shown.endswith("\n") else shown + "\n")
                stream.flush()
                continue
            bar.show(shown)
            progress = parse_round_line(text)
            if progress is not None:
                bar.update(progress)


@dataclasses.dataclass
class RunEnding:
    """How the ServerApp's log said the run ended: its ``done:`` line, and its first
    ``error:`` line (an exception that ended the ServerApp), each None when absent.

    ``flwr run --stream`` exits 0 whatever became of the run (it streams the log and
    stops), so these lines are what tells a launcher whether *its* run finished.
    """

    done: str | None = None
    error: str | None = None

    def watch(self, lines: Iterable[str]) -> Iterator[str]:
        """Pass ``lines`` through, noting the ServerApp's ``done:`` and ``error:`` lines."""
        for line in lines:
            text = strip_ansi(line)
            if DONE_LINE.search(text):
                self.done = text.strip()
            elif self.error is None and (error := ERROR_LINE.search(text)):
                self.error = error.group(1).strip()
            yield line


# Our ServerApp's last line (fedapp.flower.progress) and its one-line errors (fedapp.server_app).
DONE_LINE = re.compile(r"\bdone: round \d+/\d+ \|")
ERROR_LINE = re.compile(r"ERROR\s*:\s+error: (.*)")


def stream_command(
    command: list[str],
    *,
    env: dict[str, str],
    num_rounds: int,
    timeout: float | None = None,
    stream: TextIO | None = None,
) -> RunEnding:
    """Run ``command`` (``flwr run --stream``) and show its output and errors through :func:`show_log`;
    returns how the log said the run ended.

    Raises
    ------
    subprocess.CalledProcessError
        If the command fails.
    subprocess.TimeoutExpired
        If it runs longer than ``timeout`` seconds (it is then killed).
    """
    # Unbuffered: Flower's CLI prints the streamed log as it arrives, not in 8 kB blocks.
    process = subprocess.Popen(
        command,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    timed_out = threading.Event()
    timer = threading.Timer(timeout, _kill, (process, timed_out)) if timeout else None
    try:
        if timer is not None:
            timer.start()
        ending = RunEnding()
        show_log(ending.watch(_lines(process)), stream or sys.stdout, num_rounds)
        code = process.wait()
    except BaseException:  # Ctrl-C, SIGTERM: the CLI goes too (the SuperLink is stopped by PID)
        process.kill()
        process.wait()
        raise
    finally:
        if timer is not None:
            timer.cancel()
    if timed_out.is_set():
        raise subprocess.TimeoutExpired(command, timeout or 0.0)
    if code:
        raise subprocess.CalledProcessError(code, command)
    return ending


def _lines(process: subprocess.Popen) -> Iterator[str]:
    assert process.stdout is not None
    with process.stdout:
        yield from process.stdout


def _kill(process: subprocess.Popen, timed_out: threading.Event) -> None:
    timed_out.set()
    process.kill()
