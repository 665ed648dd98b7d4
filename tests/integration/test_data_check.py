"""Every run's data is loaded and partitioned before anything starts (issue 63: the ServerApp refused
``num-partitions=5000`` on the 1,797 digits only after Flower had started 5,000 simulated SuperNodes).
The launcher's case is in tests/system/test_launch.py (its bad-input table)."""

from __future__ import annotations

import json
import re

import pytest

from fedapp import sweep
from fedapp.errors import ConfigError
from fedapp.launch.data_check import check_runs_data

REFUSAL = "num_partitions must be between 1 and the number of samples (1797), got 5000"


def test_the_sweep_refuses_a_run_whose_data_cannot_be_partitioned_before_any_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep, "local_federation", lambda: pytest.fail("a Flower federation was started"))
    argv = ["--results-dir", str(tmp_path / "r"), "--methods", "fedavg", "--grid", "num-partitions=[2, 5000]"]
    assert sweep.main([*argv, "--run-config", "num-rounds=1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(rf"error: sweep run fedavg-num-partitions5000-\w{{6}}-s0: {re.escape(REFUSAL)}", line), line
    # No run folder and no report: only the sweep's own lock (an flock file stays, as such files do).
    assert sorted(path.name for path in (tmp_path / "r").glob("*")) == [".sweep.lock"]


def test_good_data_passes_and_a_refusal_names_its_run():
    check_runs_data([{"num-partitions": 2}, {"num-partitions": 3}])
    with pytest.raises(ConfigError, match=rf"^second: {re.escape(REFUSAL)}$"):
        check_runs_data([{"num-partitions": 2}, {"num-partitions": 5000}], ["first", "second"])
    with pytest.raises(ConfigError, match=r"^config key 'data-dir' = '/no/such/data': path does not exist$"):
        check_runs_data([{"dataset": "imagefolder", "data-dir": "/no/such/data"}])


def test_data_that_passed_is_not_checked_again_until_its_setting_or_files_change(tmp_path, monkeypatch):
    """The check leaves a stamp in the cache, named by what it depends on: a second launch of the
    same data starts no child process (seconds a launch, many in a sweep)."""
    from fedapp.launch import data_check  # noqa: PLC0415

    run = {"num-partitions": 3, "cache-dir": str(tmp_path / "cache")}
    check_runs_data([run])
    assert data_check.passed_before(run).is_file()
    inputs = []
    real_run = data_check.subprocess.run
    monkeypatch.setattr(data_check.subprocess, "run", lambda *a, **k: inputs.append(k["input"]) or real_run(*a, **k))
    check_runs_data([run, {**run, "seed": 1}, {**run, "lr": 0.5}])  # the partition depends on the seed, not lr
    assert [[item.get("seed") for item in json.loads(sent)] for sent in inputs] == [[1]]
    check_runs_data([{**run, "seed": 1}])
    assert len(inputs) == 1  # its stamp was written by that child
