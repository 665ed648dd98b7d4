"""The README's default path: ``flwr run`` on a local SuperLink, through fedapp.launch."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fedapp.launch as launch_module
from fedapp.launch import run, stop_processes, superlink_pids
from fedapp.metrics import read_metrics


class _HealthyHandler(http.server.BaseHTTPRequestHandler):
    """Answers like a healthy SuperLink that accepts no runs."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_temporary_flower_home_is_removed_even_when_the_run_fails(tmp_path, monkeypatch):
    made = tmp_path / "made-by-launch"

    def mkdtemp(prefix=""):
        made.mkdir()
        return str(made)

    real_run = subprocess.run

    def failing_flwr_run(command, **kwargs):
        if Path(command[0]).name != "flwr":  # pgrep/ps looking for a SuperLink to stop: none was started
            return real_run(command, **kwargs)
        assert (Path(kwargs["env"]["FLWR_HOME"]) / "config.toml").exists()  # the connection file is in the home
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(launch_module.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(launch_module.subprocess, "run", failing_flwr_run)
    with pytest.raises(subprocess.CalledProcessError):
        run({"num-rounds": 1, "results-dir": str(tmp_path / "results")}, num_clients=2)
    assert not made.exists()
    # A home the caller names is the caller's: it stays.
    given = tmp_path / "given"
    with pytest.raises(subprocess.CalledProcessError):
        run({"num-rounds": 1, "results-dir": str(tmp_path / "results")}, num_clients=2, flwr_home=given)
    assert (given / "config.toml").exists()


def test_flwr_run_completes_and_stops_its_superlink(tmp_path):
    # Something already answers on Flower's default local SuperLink port (another
    # user's or another launch's SuperLink): the launch must use its own.
    try:
        impostor = http.server.HTTPServer(("127.0.0.1", 39091), _HealthyHandler)
    except OSError:
        impostor = None  # the port is taken by a real one already: the same situation
    if impostor is not None:
        threading.Thread(target=impostor.serve_forever, daemon=True).start()
    home = tmp_path / "home"
    run_dir = run(
        {"num-rounds": 2, "model": "cnn-5", "results-dir": str(tmp_path / "results"), "run-name": "launch"},
        num_clients=3,
        flwr_home=home,
    )
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["clients_fit"] for r in rows] == [3, 3]
    assert superlink_pids(home.resolve()) == []
    if impostor is not None:
        impostor.shutdown()


def test_sigterm_to_the_launcher_stops_its_superlink(tmp_path):
    home = (tmp_path / "home").resolve()
    config = f'num-rounds=100 results-dir="{tmp_path / "results"}"'
    launcher = subprocess.Popen(
        [sys.executable, "-m", "fedapp.launch", "--flwr-home", str(home), "--num-clients", "2", "--run-config", config],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not superlink_pids(home) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert superlink_pids(home), "the launcher never started its SuperLink"
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
        assert superlink_pids(home) == []
    finally:
        launcher.kill()
        stop_processes(superlink_pids(home))


@pytest.mark.parametrize("name", ["../escaped", "/tmp/escaped-absolute"])
def test_a_run_name_that_leaves_results_dir_is_one_line_from_the_launcher(tmp_path, name):
    """Through the user's entry point: one 'error:' line naming the key, exit 2, nothing written anywhere."""
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "fedapp.launch", "--flwr-home", str(tmp_path / "home"),
         "--run-config", f'results-dir="{results}" run-name="{name}" num-rounds=1'],
        check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: config key 'run-name' = {name!r} must be a single folder name (no '/', '\\', '..' or surrounding "
        "spaces): runs are written to results-dir/<run-name>"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert not (tmp_path / "escaped").exists()
