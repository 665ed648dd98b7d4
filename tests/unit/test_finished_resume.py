"""A finished run resumed is a no-op that says so and exits 0, every file of the run byte for byte
unchanged (issue 63): through the launcher, and through the ServerApp that ``flwr run .`` starts."""

from __future__ import annotations

import hashlib
import logging
import runpy
import sys
from pathlib import Path

import pytest
from flwr.common import Context, RecordDict

from fedapp.inprocess import run_in_process
from fedapp.server_app import make_server_app

RUN = {"num-rounds": 1, "num-partitions": 2, "model": "cnn-5", "run-name": "A"}


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file()}  # fmt: skip


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    run_in_process({**RUN, "results-dir": str(tmp_path)}, record=True)
    return tmp_path / "A"


def test_the_launcher_resuming_a_finished_run_starts_nothing_and_changes_nothing(finished, monkeypatch, capsys):
    before = digests(finished)
    home = finished.parent / "home"
    run_config = f'num-rounds=1 num-partitions=2 model="cnn-5" run-name="A" resume=true results-dir="{finished.parent}"'
    monkeypatch.setattr(sys, "argv", ["fedapp.launch", "--run-config", run_config, "--flwr-home", str(home)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("fedapp.launch", run_name="__main__")
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert f"run folder {finished} finished all 1 rounds before: nothing to resume, its files are unchanged" in out
    assert digests(finished) == before and not home.exists()


def test_more_rounds_than_it_finished_is_not_a_finished_run(finished):
    from fedapp.runfolder import nothing_to_resume  # noqa: PLC0415

    assert nothing_to_resume(finished, 1) is not None
    assert nothing_to_resume(finished, 3) is None  # resume=true with num-rounds=3 goes on from round 1
    assert nothing_to_resume(finished.parent / "never-ran", 1) is None


def test_the_server_app_resuming_a_finished_run_returns_before_touching_it(finished, caplog):
    before = digests(finished)
    run_config = {**RUN, "results-dir": str(finished.parent), "resume": True}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    with caplog.at_level(logging.INFO, logger="flwr.fedapp"):
        make_server_app()._main(grid=None, context=context)  # no grid needed: nothing is sent
    assert "nothing to resume, its files are unchanged" in caplog.text
    assert digests(finished) == before
