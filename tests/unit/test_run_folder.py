"""A run folder is never written over: a fresh run refuses one that holds results, a resume one
that does not exist, and a second writer is refused by the folder's lock."""

from __future__ import annotations

import fcntl
import json
import threading
import time

import numpy as np
import pytest

from fedapp.checkpoint import ServerCheckpoint, rng_state, save_checkpoint
from fedapp.config import resolve_run_config
from fedapp.errors import StateError
from fedapp.metrics import RunRecorder, check_clients_trained
from fedapp.runfolder import LOCK_FILE, lock_folder, release_folder, unwritable
from fedapp.strategies import FedAvgStrategy


def recorder(tmp_path, fresh: bool = True) -> RunRecorder:
    return RunRecorder(tmp_path, "run", {"method": "fedavg"}, 0.8, fresh=fresh)


def test_a_fresh_run_refuses_a_folder_that_holds_results_and_touches_nothing(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"round": 1}\n')
    (folder / "config.yaml").write_text("lr: 0.5\n")
    with pytest.raises(StateError, match=r"already holds a run \(metrics.jsonl\): set resume=true"):
        recorder(tmp_path)
    assert (folder / "config.yaml").read_text() == "lr: 0.5\n"
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "metrics.jsonl"]


def test_an_empty_or_new_folder_is_taken(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")  # what a run that died before round 1 leaves
    made = recorder(tmp_path)
    assert (made.directory / "config.yaml").is_file()
    made.close()


def test_resume_of_a_missing_folder_creates_nothing(tmp_path):
    with pytest.raises(StateError, match=r"resume=true, but run folder .*run does not exist"):
        recorder(tmp_path, fresh=False)
    assert list(tmp_path.iterdir()) == []


def test_a_second_writer_is_refused_by_the_lock(tmp_path):
    first = recorder(tmp_path)
    release_folder(first.directory)
    # Another process's lock: flock conflicts between open file descriptions, as between processes.
    with (first.directory / LOCK_FILE).open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (first.directory / "metrics.jsonl").write_text("")
        with pytest.raises(StateError, match=r"is being written by another run \(its lock is held\)"):
            recorder(tmp_path)
    recorder(tmp_path).close()  # released: taken again


def test_a_resume_waits_for_a_stopped_runs_server_to_release_the_folder(tmp_path):
    """After ``flwr stop`` the stopped run's ServerApp holds the lock until its next heartbeat:
    a resume submitted meanwhile waits for it instead of being refused."""
    recorder(tmp_path).close()
    with (tmp_path / "run" / LOCK_FILE).open("a") as stopped_server:
        fcntl.flock(stopped_server, fcntl.LOCK_EX | fcntl.LOCK_NB)
        threading.Timer(1.0, stopped_server.close).start()
        started = time.monotonic()
        resumed = recorder(tmp_path, fresh=False)
    assert 0.9 < time.monotonic() - started < 5
    resumed.close()


def test_a_lock_still_held_after_the_wait_is_refused_in_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    with (tmp_path / "run" / LOCK_FILE).open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(StateError, match=r"its lock is held after 1 s\): wait for that run to end"):
            lock_folder(tmp_path / "run", wait_s=1.0)


def test_a_refused_resume_leaves_the_run_folder_as_it_was(tmp_path):
    base = {"method": "fedavg", "results-dir": str(tmp_path), "run-name": "run", "num-partitions": 2}
    saved = resolve_run_config(base).as_dict()
    checkpoint = ServerCheckpoint(round=1, config=saved, global_arrays=[np.zeros(3, np.float32)], rng=rng_state())
    save_checkpoint(tmp_path / "run" / "checkpoint.npz", checkpoint)
    (tmp_path / "run" / "config.yaml").write_text("the first run's config\n")
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    strategy = FedAvgStrategy.from_config(resolve_run_config({**base, "resume": True, "lr": 0.5}), record=True)
    with pytest.raises(StateError, match="lr"):
        strategy.resume()
    strategy.recorder.close()
    after = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.name != LOCK_FILE}
    assert after == before


def test_a_run_in_which_no_client_trained_is_an_error(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    rows = [{"round": r, "clients_fit": 0, "left_out_reasons": ["client 1: StateError: disk full"]} for r in (1, 2)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(StateError, match=r"no client trained in any of the 2 rounds of run \(left out: client 1: St"):
        check_clients_trained(folder)
    rows[1]["clients_fit"] = 1  # one client in one round is a run
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    check_clients_trained(folder)
    # Trained, but no client tested in any round (every test split empty): no accuracy, an error too.
    rows = [{**row, "clients_evaluated": 0} for row in rows]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(StateError, match=r"no client was tested in any of the 2 rounds of run: every evaluated"):
        check_clients_trained(folder)
    rows[0]["clients_evaluated"] = 2
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    check_clients_trained(folder)


def test_the_writability_probe_leaves_the_disk_as_it_was(tmp_path):
    assert unwritable(tmp_path / "a" / "b" / "results") is None
    assert list(tmp_path.iterdir()) == []  # the folders it made to probe are gone again
    (tmp_path / "file").write_text("x")
    assert unwritable(tmp_path / "file" / "results") == "Not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
