"""A key given twice is refused with both values named, never the last one silently winning
(issue 63): in a preset, in one --run-config and across several, through the launcher and the sweep."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from fedapp.sweep import main as sweep_main


def launch(monkeypatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["fedapp.launch", *argv])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("fedapp.launch", run_name="__main__")
    return exited.value.code


def test_a_preset_giving_a_key_twice_is_refused_with_both_values_and_lines(tmp_path: Path, monkeypatch, capsys):
    preset = tmp_path / "twice.yaml"
    preset.write_text("method: fedavg\nlr: 0.1\nnum-rounds: 2\nlr: 0.5\n")
    home = tmp_path / "home"
    assert launch(monkeypatch, "--preset", str(preset), "--flwr-home", str(home)) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: config key 'preset' = '{preset}' gives 'lr' twice (line 2: 0.1, line 4: 0.5); keep one"
    assert not home.exists()  # refused before anything started


@pytest.mark.parametrize(
    "run_config",
    [["num-rounds=1 num-rounds=3"], ["num-rounds=1", "num-rounds=3"]],
    ids=["one item", "two items"],
)
def test_run_config_giving_a_key_twice_is_refused_by_the_launcher_and_the_sweep(
    tmp_path: Path, monkeypatch, capsys, run_config
):
    argv = [arg for item in run_config for arg in ("--run-config", item)]
    assert launch(monkeypatch, *argv, "--flwr-home", str(tmp_path / "home")) == 2
    expected = "error: --run-config gives 'num-rounds' twice (1 and 3); give it once"
    assert capsys.readouterr().err.strip() == expected
    assert sweep_main(["--results-dir", str(tmp_path / "sweep"), *argv]) == 2
    assert capsys.readouterr().err.strip() == expected
    assert not (tmp_path / "home").exists() and not (tmp_path / "sweep").exists()


def test_every_shipped_preset_gives_each_key_once():
    from fedapp.config import APP_ROOT, load_preset  # noqa: PLC0415

    for preset in sorted((APP_ROOT / "conf").glob("*.yaml")):
        load_preset(str(preset))  # raises on a key given twice


def test_a_grid_value_repeated_is_one_point_of_the_sweep(tmp_path: Path, capsys):
    from fedapp.sweep import parse_grid, plan_sweep  # noqa: PLC0415

    assert parse_grid(["lr=[0.1, 0.1, 0.01, 0.1]"]) == {"lr": [0.1, 0.01]}
    runs = plan_sweep({}, methods=["fedavg"], seeds=[0], grid=parse_grid(["lr=[0.1, 0.1]"]), results_dir=tmp_path)
    assert len(runs) == 1
    assert sweep_main(["--results-dir", str(tmp_path), "--grid", "lr=[0.1, 0.1]", "--dry-run"]) == 0
    assert "1 runs into" in capsys.readouterr().out


def test_a_launcher_flag_that_contradicts_the_run_config_is_refused(tmp_path: Path, monkeypatch, capsys):
    home = tmp_path / "home"
    assert launch(monkeypatch, "--num-clients", "3", "--run-config", "num-partitions=2", "--flwr-home", str(home)) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --num-clients 3 contradicts num-partitions = 2 (the run config or the preset): "
        "give the number of clients once"
    )
    assert not home.exists()
    from fedapp.launch import prepare_run  # noqa: PLC0415

    assert prepare_run({}, num_clients=3).config.num_partitions == 3  # the flag alone sets it
    assert prepare_run({"num-partitions": 3}, num_clients=3).config.num_partitions == 3  # the same value twice


def test_more_cpus_per_client_than_the_machine_has_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    """Issue 63: ``--cpus-per-client 100`` ended after 31 s with Ray's ``RuntimeError: An error was
    encountered``; the launcher and the sweep now refuse it at once (a Ray cluster may have more)."""
    import os  # noqa: PLC0415

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    too_many = str(os.cpu_count() + 1)
    home = tmp_path / "home"
    assert launch(monkeypatch, "--cpus-per-client", too_many, "--flwr-home", str(home)) == 2
    expected = f"error: --cpus-per-client {too_many}: this machine has {os.cpu_count()} CPUs, so no client could start"
    assert capsys.readouterr().err.startswith(expected) and not home.exists()
    assert sweep_main(["--results-dir", str(tmp_path / "s"), "--cpus-per-client", too_many, "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith(expected)
    from fedapp.launch import cpus_to_check  # noqa: PLC0415

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert cpus_to_check() is None  # a cluster's CPUs are not this machine's to count
