"""The README's default path: ``flwr run`` on a local SuperLink, through fedapp.launch."""

from __future__ import annotations

import runpy
import sys

import pytest

from fedapp.errors import ConfigError, FedAppError
from fedapp.launch import expand_preset, federation_overrides, parse_overrides, run


def test_parse_overrides_reads_flower_style_toml_values():
    values = parse_overrides(['method="standalone" num-rounds=3', "alpha=0.5 download=true"])
    assert values == {"method": "standalone", "num-rounds": 3, "alpha": 0.5, "download": True}


def test_parse_overrides_keeps_quoted_spaces_and_names_a_bad_item():
    assert parse_overrides(['run-name="a b" lr=0.1', '  x="it\'s"  ']) == {"run-name": "a b", "lr": 0.1, "x": "it's"}
    with pytest.raises(FedAppError, match=r'quote a string, method="fedavg"'):
        parse_overrides(["method=fedavg"])
    with pytest.raises(FedAppError, match=r"item 'stray' is not key=value"):
        parse_overrides(["lr=0.1 stray"])
    with pytest.raises(FedAppError, match=r"item 'a=\"x\"y' is not key=value"):
        parse_overrides(['a="x"y'])


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


def test_python_dash_m_runs_the_launcher_command_line(tmp_path, monkeypatch, capsys):
    """``python -m fedapp.launch`` runs the package's ``__main__``: the same flags, the same exit codes."""
    monkeypatch.setattr(sys, "argv", ["fedapp.launch", "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("fedapp.launch", run_name="__main__")
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage: python -m fedapp.launch")
    for flag in ("--preset", "--run-config", "--num-clients", "--cpus-per-client", "--gpus-per-client", "--flwr-home"):
        assert flag in usage
    home = tmp_path / "home"
    monkeypatch.setattr(sys, "argv", ["fedapp.launch", "--run-config", "alpha=-1.0", "--flwr-home", str(home)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("fedapp.launch", run_name="__main__")
    assert exited.value.code == 2 and "error: " in capsys.readouterr().err
    assert not home.exists()
