"""The server's one log line per round, with the run's elapsed time and ETA, and its reader.

:func:`log_progress` logs :func:`fedapp.metrics.progress_line` with ``| elapsed 6s | ETA 23s``
appended (:class:`RoundClock` keeps the time of each run) and, after the last round, one
``done:`` line naming the run folder, the final mean accuracy and the total MB.
:func:`parse_round_line` reads a round line back from a streamed log: the launcher's
progress bar (:mod:`fedapp.launch.stream`) follows a run through these lines.
"""

from __future__ import annotations

import logging
import math
import re
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from fedapp.errors import StateError
from fedapp.metrics import RoundRecord, RunRecorder, check_clients_trained, progress_line

log = logging.getLogger("flwr.fedapp")


def format_duration(seconds: float) -> str:
    """``seconds`` as a person reads a duration: ``42s``, ``3m05s``, ``2h07m`` (``?`` when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


@dataclass
class RoundClock:
    """The wall time of one run's rounds in this process: time elapsed since its first round
    began and an estimate of the time its remaining rounds take.

    A resumed run counts only the rounds it runs itself: the clock starts at the first round
    it sees, whatever its number. That first round also pays the one-time start-up (the
    simulation's workers, loading the data), so once a later round has finished the estimate
    uses the mean of the later rounds only; until then, the first round's time.
    """

    now: Callable[[], float] = time.monotonic
    started: float | None = None
    first_round: int = 0
    first_finished: float = 0.0
    last_round: int = 0

    def tick(self, server_round: int, round_seconds: float, num_rounds: int) -> tuple[float, float]:
        """Note that ``server_round`` (which took ``round_seconds``) has finished.

        Returns
        -------
        tuple[float, float]
            Seconds since this run's first round here began, and the estimated seconds
            of its remaining ``num_rounds - server_round`` rounds.
        """
        now = self.now()
        if self.started is None or server_round <= self.last_round:  # the first round, or a new run
            self.started = now - max(round_seconds, 0.0)
            self.first_round, self.first_finished = server_round, now
        self.last_round = server_round
        later_rounds = server_round - self.first_round
        mean = (now - self.first_finished) / later_rounds if later_rounds else now - self.started
        return now - self.started, mean * max(num_rounds - server_round, 0)


# One clock per run, keyed by the run's recorder (a run without one shares the anonymous clock,
# which restarts when the round numbers do).
_CLOCKS: weakref.WeakKeyDictionary[object, RoundClock] = weakref.WeakKeyDictionary()
_ANONYMOUS_CLOCK = RoundClock()


def clock_of(run: object | None) -> RoundClock:
    """The :class:`RoundClock` of the run identified by ``run`` (its recorder), made on first use."""
    if run is None:
        return _ANONYMOUS_CLOCK
    try:
        return _CLOCKS.setdefault(run, RoundClock())
    except TypeError:  # not weak-referenceable: no identity to keep a clock under
        return _ANONYMOUS_CLOCK


def timed_progress_line(record: RoundRecord, num_rounds: int, elapsed: float, remaining: float) -> str:
    """:func:`fedapp.metrics.progress_line` with the run's elapsed time and ETA, e.g.
    ``round 3/15 | acc mean 0.712 worst 0.501 | ... | 12.00 MB | 1.9s | elapsed 6s | ETA 23s``."""
    timing = f"elapsed {format_duration(elapsed)} | ETA {format_duration(remaining)}"
    return f"{progress_line(record, num_rounds)} | {timing}"


def done_line(record: RoundRecord, num_rounds: int, elapsed: float, recorder: RunRecorder | None) -> str:
    """The run's last line: its final mean accuracy, total training MB, time here and results folder."""
    folder = getattr(recorder, "directory", None)
    where = f" | results in {folder}" if folder is not None else ""
    return (
        f"done: round {record.round}/{num_rounds} | final acc mean {record.acc_mean:.3f} | "
        f"{record.mb_cumulative:.2f} MB | {format_duration(elapsed)}{where}"
    )


def log_progress(record: RoundRecord, num_rounds: int, recorder: RunRecorder | None) -> float:
    """Log the round's progress line (with ETA); returns the seconds since the run's first round here began.

    Parameters
    ----------
    record : RoundRecord
        The finished round.
    num_rounds : int
        The rounds of the whole run (a resumed run's included).
    recorder : RunRecorder, optional
        The run's recorder: it identifies the run (its clock).
    """
    elapsed, remaining = clock_of(recorder).tick(record.round, record.round_seconds, num_rounds)
    log.info(timed_progress_line(record, num_rounds, elapsed, remaining))
    return elapsed


def log_done(record: RoundRecord, num_rounds: int, elapsed: float, recorder: RunRecorder | None) -> None:
    """After the last round is written, the run's ``done:`` line, naming the results folder; none for
    a run whose written rounds trained or tested no client, which the ServerApp then ends with that
    error (:func:`fedapp.metrics.check_clients_trained`): "done" would not be true of it."""
    if record.round < num_rounds:
        return
    folder = getattr(recorder, "directory", None)
    if folder is not None:
        try:
            check_clients_trained(folder)
        except StateError:
            return
    log.info(done_line(record, num_rounds, elapsed, recorder))


# A round line as a log shows it (after Flower's "INFO :" prefix): what the progress bar needs.
_ROUND_LINE = re.compile(
    r"(?:^|\s)round (?P<round>\d+)/(?P<total>\d+) \| acc mean (?P<acc>\S+) .*\| ETA (?P<eta>\S+)\s*$"
)


@dataclass(frozen=True)
class RoundProgress:
    """What a round line tells a reader of the log."""

    round: int
    num_rounds: int
    acc_mean: float
    eta: str


def parse_round_line(text: str) -> RoundProgress | None:
    """The progress of a :func:`timed_progress_line` found in a log line ``text`` (colour codes
    removed), or None when the line is something else."""
    match = _ROUND_LINE.search(text)
    if match is None:
        return None
    try:
        acc = float(match["acc"])
    except ValueError:
        acc = math.nan
    return RoundProgress(int(match["round"]), int(match["total"]), acc, match["eta"])
