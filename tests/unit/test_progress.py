"""The server's round line: elapsed time and ETA arithmetic, the line's format, the run's done line,
and reading a round line back from a log."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from fedapp.flower.progress import (
    RoundClock,
    RoundProgress,
    clock_of,
    done_line,
    format_duration,
    parse_round_line,
    timed_progress_line,
)
from fedapp.flower.recording import write_round
from fedapp.metrics import RoundRecord, RunRecorder
from tests.unit.records import round_record


def a_record(server_round: int, *, seconds: float = 2.0, acc: float = 0.712, mb: float = 12.0) -> RoundRecord:
    return round_record(
        server_round, acc_mean=acc, acc_worst=0.501, train_loss=0.9, mb_cumulative=mb, round_seconds=seconds
    )


class FakeClock:
    def __init__(self, start: float = 0.0) -> None:
        self.time = start

    def __call__(self) -> float:
        return self.time


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (23.4, "23s"), (59.6, "1m00s"), (245, "4m05s"), (3599, "59m59s"), (7620, "2h07m"), (math.nan, "?")],
)
def test_durations_read_like_a_person_writes_them(seconds, text):
    assert format_duration(seconds) == text


def test_the_eta_is_the_mean_round_time_times_the_rounds_left_after_the_first_rounds_start_up():
    now = FakeClock()
    clock = RoundClock(now=now)
    now.time = 10.0  # round 1 took 10 s, start-up included
    assert clock.tick(1, 10.0, 15) == (10.0, 140.0)  # only the first round known: 10 s x 14 rounds
    now.time = 12.0
    assert clock.tick(2, 2.0, 15) == (12.0, 26.0)  # later rounds: 2 s each x 13 left
    now.time = 15.0
    assert clock.tick(3, 3.0, 15) == (15.0, 30.0)  # mean of rounds 2-3: 2.5 s x 12 left
    now.time = 40.0
    assert clock.tick(15, 2.0, 15)[1] == 0.0  # the last round: nothing left


def test_a_resumed_run_counts_only_its_own_rounds():
    now = FakeClock(start=1000.0)
    clock = RoundClock(now=now)
    assert clock.tick(13, 5.0, 15) == (5.0, 10.0)  # resumed after round 12: its own first round took 5 s
    now.time = 1001.0
    assert clock.tick(14, 1.0, 15) == (6.0, 1.0)


def test_a_clock_starts_over_when_the_round_numbers_do():
    now = FakeClock()
    clock = RoundClock(now=now)
    now.time = 4.0
    clock.tick(1, 4.0, 2)
    now.time = 5.0
    clock.tick(2, 1.0, 2)
    now.time = 100.0  # a new run in the same process
    assert clock.tick(1, 3.0, 3) == (3.0, 6.0)


def test_each_run_has_its_own_clock():
    class Recorder:
        directory = Path("/results/a")

    first, second = Recorder(), Recorder()
    assert clock_of(first) is clock_of(first)
    assert clock_of(first) is not clock_of(second)
    assert clock_of(None) is clock_of(None)
    assert clock_of([]) is clock_of(None)  # nothing to key a clock on: the shared one


def test_the_round_line_ends_with_the_elapsed_time_and_the_eta():
    line = timed_progress_line(a_record(3, seconds=1.9), 15, elapsed=6.2, remaining=23.4)
    assert line == (
        "round 3/15 | acc mean 0.712 worst 0.501 | loss 0.900 | fit 4 | 12.00 MB | 1.9s | elapsed 6s | ETA 23s"
    )


def test_a_round_line_is_read_back_from_a_log_line():
    line = timed_progress_line(a_record(3, seconds=1.9), 15, elapsed=6.2, remaining=245)
    assert parse_round_line(f"INFO :      {line}\n") == RoundProgress(3, 15, 0.712, "4m05s")
    nan_line = timed_progress_line(a_record(1, acc=math.nan), 2, elapsed=1, remaining=1)
    assert math.isnan(parse_round_line(nan_line).acc_mean)
    done = done_line(a_record(15), 15, 30.0, None)
    for other in (done, "INFO :      results go to /x", "round 3/15 | acc mean 0.712 (no ETA)", ""):
        assert parse_round_line(other) is None


def test_the_last_round_is_followed_by_the_done_line_naming_the_results(caplog, tmp_path):
    recorder = RunRecorder(tmp_path, "run-1", {}, 0.8)
    with caplog.at_level(logging.INFO, logger="flwr.fedapp"):
        for record in (a_record(1), a_record(2, acc=0.8, mb=24.5)):
            write_round(record, recorder, 2, lambda server_round: None)
    lines = [line for line in caplog.messages if "round" in line]
    assert len(lines) == 3
    assert [parse_round_line(line).round for line in lines[:2]] == [1, 2]
    assert lines[1].endswith("| ETA 0s")
    assert lines[2].startswith("done: round 2/2 | final acc mean 0.800 | 24.50 MB | ")
    assert lines[2].endswith(f"| results in {recorder.directory}")


def test_a_run_whose_rounds_trained_no_client_gets_no_done_line(caplog, tmp_path):
    """Issue 63: SuperNodes that refused every round (class names not the server's) left a run that
    ended "done: ... final acc mean 0.500"; the ServerApp's error about it is then the last word."""
    recorder = RunRecorder(tmp_path, "run-1", {}, 0.8)
    with caplog.at_level(logging.INFO, logger="flwr.fedapp"):
        for server_round in (1, 2):
            record = a_record(server_round)
            record.clients_fit = 0
            write_round(record, recorder, 2, lambda server_round: None)
    assert not any(line.startswith("done:") for line in caplog.messages), caplog.messages
    assert len([line for line in caplog.messages if parse_round_line(line)]) == 2


def test_write_round_logs_the_round_line_with_its_eta(caplog):
    with caplog.at_level(logging.INFO, logger="flwr.fedapp"):
        write_round(a_record(1), None, 3, lambda server_round: None)
    (line,) = caplog.messages  # no recorder: no folder to name, nothing else logged
    assert parse_round_line(line) is not None and " | ETA " in line


def test_a_round_evaluated_over_fewer_clients_than_it_asked_says_whose_accuracy_is_missing():
    record = a_record(2)
    record.clients_evaluated = 1
    record.extra["eval_missing_clients"] = ["client 9 (partition 1)"]
    line = timed_progress_line(record, 4, elapsed=4, remaining=4)
    assert "acc mean 0.712 worst 0.501 (of 1 clients: client 9 (partition 1) missing) | loss" in line
    assert parse_round_line(line) == RoundProgress(2, 4, 0.712, "4s")
