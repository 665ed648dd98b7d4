"""The launcher's view of a run's log: colour codes removed off a terminal, lines that are false for a
launched run or repeated by every worker dropped, and a progress bar on a terminal only."""

from __future__ import annotations

import io

import pytest

from fedapp.launch.stream import LogCleaner, RunEnding, is_terminal, show_log, strip_ansi, wants_colour

# What `flwr run --stream` printed for a two-round launch before this cleaning (colours as Flower sends them).
GREEN, YELLOW, CYAN, RESET = "\x1b[92m", "\x1b[93m", "\x1b[36m", "\x1b[0m"
ROUND_1 = "round 1/2 | acc mean 0.623 worst 0.571 | loss 1.803 | fit 2 | 40.01 MB | 18.5s | elapsed 19s | ETA 19s"
ROUND_2 = "round 2/2 | acc mean 0.161 worst 0.000 | loss 1.583 | fit 2 | 80.01 MB | 1.4s | elapsed 20s | ETA 0s"
DEVICE = "device = auto: CUDA not available (no GPU visible); using CPU"
RAY_TIP = (
    "/venv/lib/python3.11/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of Ray, "
    "Ray will no longer override accelerator visible devices env var if num_gpus=0 or num_gpus=None (default)."
)
STREAMED = [
    f"{GREEN}INFO {RESET}:      Starting Flower Simulation\n",
    f"{YELLOW}WARNING {RESET}:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
    f"{GREEN}INFO {RESET}:      Federation `@none/default` (2 simulated SuperNodes)\n",
    f"{GREEN}INFO {RESET}:      To change federation size, use the following command:\n",
    f"{GREEN}INFO {RESET}:      \tflwr federation simulation-config @none/default <superlink> --num-supernodes <N>\n",
    f"{RAY_TIP}\n",
    "  warnings.warn(\n",
    f"{CYAN}(ClientAppActor pid=27758){RESET} {GREEN}INFO {RESET}:      {DEVICE}\n",
    f"{GREEN}INFO {RESET}:      {ROUND_1}\n",
    f"{GREEN}INFO {RESET}:      {ROUND_2}\n",
    f"{CYAN}(ClientAppActor pid=27756){RESET} {GREEN}INFO {RESET}:      {DEVICE}\n",
    f"{CYAN}(ClientAppActor pid=27756){RESET} {YELLOW}WARNING {RESET}:   Manually terminating ClientAppActor\n",
]
SHOWN = [
    "INFO :      Starting Flower Simulation",
    "INFO :      Federation `@none/default` (2 simulated SuperNodes)",
    f"(ClientAppActor pid=27758) INFO :      {DEVICE}",
    f"INFO :      {ROUND_1}",
    f"INFO :      {ROUND_2}",
]


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_colour_codes_are_removed():
    assert strip_ansi(STREAMED[7]) == f"(ClientAppActor pid=27758) INFO :      {DEVICE}\n"
    assert strip_ansi("\x1b[?25lbar\x1b[2K\x1b[1A done") == "bar done"
    assert strip_ansi("no codes | 0.5") == "no codes | 0.5"


def test_colour_and_a_live_bar_only_on_a_terminal_without_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert is_terminal(Terminal()) and wants_colour(Terminal())
    assert not is_terminal(io.StringIO()) and not wants_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert is_terminal(Terminal()) and not wants_colour(Terminal())
    monkeypatch.setenv("TERM", "dumb")
    assert not is_terminal(Terminal())
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)


def test_the_cleaner_drops_false_and_repeated_lines_and_keeps_the_rest():
    cleaner = LogCleaner()
    kept = [strip_ansi(line).rstrip("\n") for line in STREAMED if cleaner.keep(strip_ansi(line))]
    assert kept == SHOWN


def test_a_continuation_is_dropped_only_right_after_its_line():
    cleaner = LogCleaner()
    assert cleaner.keep("  warnings.warn(")  # not after Ray's tip: someone else's warning, kept
    assert not cleaner.keep(RAY_TIP)
    assert cleaner.keep("INFO :      results go to /x")
    assert cleaner.keep("  warnings.warn(")


def test_a_workers_line_is_dropped_only_when_another_worker_gave_the_same_text():
    cleaner = LogCleaner()
    assert cleaner.keep("(ClientAppActor pid=1) WARNING :   round 3: left out a client that failed: disk full")
    assert cleaner.keep("(ClientAppActor pid=2) WARNING :   round 3: left out a client that failed: no memory")
    assert not cleaner.keep("(ClientAppActor pid=3) WARNING :   round 3: left out a client that failed: disk full")
    assert cleaner.keep("INFO :      same text twice")
    assert cleaner.keep("INFO :      same text twice")  # the server's own lines are never deduplicated


def test_off_a_terminal_the_log_is_plain_lines(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    show_log(STREAMED, out, num_rounds=2)
    assert out.getvalue().splitlines() == SHOWN
    assert "\x1b" not in out.getvalue()


@pytest.mark.parametrize("no_color", ["", "1"])
def test_on_a_terminal_a_progress_bar_follows_the_round_lines(monkeypatch, no_color):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", no_color)
    out = Terminal()
    show_log(STREAMED, out, num_rounds=2)
    screen = strip_ansi(out.getvalue())
    assert "0/2" in screen and "2/2" in screen and "acc mean 0.161" in screen and "ETA 0s" in screen
    assert ROUND_1 in screen and "changed from 10 to 2" not in screen
    assert (GREEN in out.getvalue()) is (not no_color)  # Flower's colours pass on, unless NO_COLOR


def test_the_run_ending_is_read_from_the_servers_own_lines():
    """flwr run --stream exits 0 whatever became of the run: the launcher reads the ServerApp's
    done: and error: lines as they pass (issue 42)."""
    lines = [
        "\x1b[92mINFO \x1b[0m:      round 1/1 | acc mean 0.5 worst 0.5 | loss 1.0 | fit 2 | 1 MB\n",
        "\x1b[91mERROR \x1b[0m:     error: run folder /r/x is being written by another run\n",
        "ERROR :     error: a later one\n",
    ]
    ending = RunEnding()
    assert list(ending.watch(lines)) == lines  # passed through unchanged
    assert ending.error == "run folder /r/x is being written by another run" and ending.done is None
    finished = RunEnding()
    list(finished.watch(["INFO :      done: round 2/2 | final acc mean 0.807 | 2.01 MB | 56s | results in /r/y\n"]))
    assert finished.done.startswith("INFO :      done: round 2/2 |") and finished.error is None
