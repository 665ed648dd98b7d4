"""The README's default path: ``flwr run`` on a local SuperLink, through fedapp.launch."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from fedapp.errors import ConfigError, FedAppError
from fedapp.launch import expand_preset, federation_overrides, parse_overrides, prepare_run, run


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


def test_resuming_clients_whose_personal_state_was_in_memory_is_refused_before_any_process_starts(tmp_path):
    """Before the fix, such a run resumed: the server went on at its checkpoint's round while every
    client started again from scratch (FedD2P even ran its warm-up again), and nothing said so."""
    with pytest.raises(ConfigError, match=r"'resume' = true and 'state' = \"memory\": standalone's clients keep"):
        run({"method": "standalone", "resume": True}, flwr_home=tmp_path / "home")
    assert not (tmp_path / "home").exists()


def test_a_missing_clip_checkpoint_fails_before_any_process_starts(tmp_path):
    """Before, the SuperLink and the simulation started and the ServerApp failed on the path."""
    missing = tmp_path / "small-clip.pt"
    with pytest.raises(ConfigError, match=rf"'pretrained' = '{missing}': checkpoint not found"):
        run({"method": "fedd2p", "pretrained": str(missing)}, flwr_home=tmp_path / "home")
    assert not (tmp_path / "home").exists()
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        run({"method": "sdfed", "pretrained": str(tmp_path)}, flwr_home=tmp_path / "home")
    # A method that loads no CLIP ignores the key, as its run always has.
    assert prepare_run({"method": "fedavg", "pretrained": str(missing)}).config.pretrained == str(missing)


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


# Flower's own FAB build reads patterns with pathspec's deprecated 'gitwildmatch' (108 times a build).
@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")
def test_flwr_run_gets_a_copy_of_the_app_that_packs_to_the_same_fab(tmp_path, monkeypatch):
    """``flwr run`` walks every file under the app folder to build the FAB (4 s of every launch
    with the README's .venv inside the checkout); the launcher gives it a copy of the files the
    FAB can hold, which packs to the same bytes, and removes the copy after the run."""
    from flwr.cli.build import build_fab_from_disk  # noqa: PLC0415

    from fedapp.config import APP_ROOT  # noqa: PLC0415
    from fedapp.launch import federation  # noqa: PLC0415
    from fedapp.launch.app_copy import app_files, copy_app  # noqa: PLC0415
    from fedapp.launch.settings import prepare_run  # noqa: PLC0415

    files = app_files(APP_ROOT)
    assert "pyproject.toml" in files and "fedapp/launch/app_copy.py" in files and "conf/fedavg-digits.yaml" in files
    assert not [path for path in files if path.startswith((".venv/", ".git/", "results/")) or "__pycache__" in path]
    assert build_fab_from_disk(copy_app(APP_ROOT, tmp_path / "copy")) == build_fab_from_disk(APP_ROOT)

    home, seen = tmp_path / "home", {}

    def stream(command, **_):
        seen["app"] = Path(command[2])
        seen["files"] = sorted(str(p.relative_to(seen["app"])) for p in seen["app"].rglob("*") if p.is_file())
        raise subprocess.CalledProcessError(1, command)  # stop here: what was handed over is what matters

    monkeypatch.setattr(federation, "stream_command", stream)
    prepared = prepare_run({"results-dir": str(tmp_path / "results"), "num-rounds": 1})
    with pytest.raises(subprocess.CalledProcessError):
        federation.submit(prepared, {"FLWR_HOME": str(home)})
    assert seen["app"] == home / "fedapp-app" and seen["files"] == files
    assert not seen["app"].exists()


def test_the_app_copy_declares_the_keys_of_plugin_methods_that_flower_would_refuse(tmp_path):
    """Flower refuses a --run-config key its app's pyproject.toml does not declare: the launcher's copy
    of the app declares a plug-in method's keys under ours (issue 64), and leaves ours as they are."""
    from fedapp.launch.app_copy import declare_plugin_keys  # noqa: PLC0415

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "app"\n\n[tool.flwr.app.config]\nlr = 0.05\n\n[tool.other]\nx = 1\n')
    added = declare_plugin_keys(pyproject, {"lr": "0.1", "myplugin-depth": "1", "tag": '"a b"'})
    assert added == ["myplugin-depth", "tag"]
    parsed = tomllib.loads(pyproject.read_text())
    assert parsed["tool"]["flwr"]["app"]["config"] == {"lr": 0.05, "myplugin-depth": 1, "tag": "a b"}
    assert parsed["tool"]["other"] == {"x": 1}
    assert declare_plugin_keys(pyproject, {"lr": "0.1", "tag": '"c"'}) == []
