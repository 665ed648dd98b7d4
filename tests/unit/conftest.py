"""The unit tier starts no processes: no subprocess, no fork, hence no Ray and no Flower runtime.

A test that needs one belongs in ``tests/integration`` (in-process driver, Ray
simulations) or ``tests/system`` (``flwr run``, SuperLink and SuperNodes, linters).
"""

from __future__ import annotations

import os
import subprocess

import pytest

# torch's first import runs ldconfig (a process) to find its CUDA libraries: import it before
# the guard, so a unit test whose code imports torch lazily is not refused for that.
import torch  # noqa: F401

MOVE = "unit tests start no processes (no subprocess, fork or Ray): move this test to tests/integration or tests/system"


class ProcessStartRefused(AssertionError):
    """Raised when a unit test tries to start a process."""


def _refuse(*args, **kwargs):
    raise ProcessStartRefused(MOVE)


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse)


@pytest.fixture
def task_identity(monkeypatch):
    """Messages built outside a running SuperLink (a ClientApp called directly) need a task identity."""
    from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415 - only ClientApp tests pay the import

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
