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
from fedapp.errors import ConfigError
from fedapp.launch import expand_preset, federation_overrides, parse_overrides, run, stop_processes, superlink_pids
from fedapp.metrics import read_metrics


def test_parse_overrides_reads_flower_style_toml_values():
    values = parse_overrides(['method="standalone" num-rounds=3', "alpha=0.5 download=true"])
    assert values == {"method": "standalone", "num-rounds": 3, "alpha": 0.5, "download": True}


def test_expand_preset_lets_an_explicit_default_value_beat_the_preset(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("local-epochs: 5\nmethod: standalone\n")
    expanded = expand_preset({"preset": str(preset), "local-epochs": 1})
    assert expanded == {"local-epochs": 1, "method": "standalone", "preset": ""}


def test_federation_overrides_size_the_local_simulation():
    assert federation_overrides(7, 1, 0.0) == "num-supernodes=7 client-resources-num-cpus=1"
    assert federation_overrides(2, 2, 0.5).endswith("client-resources-num-gpus=0.5")


def test_bad_config_fails_before_any_process_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"'alpha' = -1\.0"):
        run({"alpha": -1.0}, flwr_home=tmp_path / "home")
    assert not (tmp_path / "home").exists()


class _HealthyHandler(http.server.BaseHTTPRequestHandler):
    """Answers like a healthy SuperLink that accepts no runs."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_a_temporary_flower_home_is_removed_even_when_the_run_fails(tmp_path, monkeypatch):
    made = tmp_path / "made-by-launch"

    def mkdtemp(prefix=""):
        made.mkdir()
        return str(made)

    real_run = subprocess.run

    def failing_flwr_run(command, **kwargs):
        if command[0] == "pgrep":  # looking for a SuperLink to stop: none was started
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


@pytest.mark.slow
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
