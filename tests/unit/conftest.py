"""The unit tier starts no processes: no subprocess, no fork, hence no Ray and no Flower runtime.

A test that needs one belongs in ``tests/integration`` (in-process driver, Ray
simulations) or ``tests/system`` (``flwr run``, SuperLink and SuperNodes, linters).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# torch's first import runs ldconfig (a process) to find its CUDA libraries: import it before
# the guard, so a unit test whose code imports torch lazily is not refused for that.
import torch

MOVE = "unit tests start no processes (no subprocess, fork or Ray): move this test to tests/integration or tests/system"

# Libraries whose own probes of the machine may start a process, because a GPU is there:
# ctypes.util.find_library runs ldconfig, triton runs ldconfig and a C compiler for its
# CUDA launcher, torch looks for its CUDA libraries; matplotlib's first import in a home
# without its font cache runs fc-list to build it. These are not the processes the rule
# is about (Ray, Flower's runtime, a test's own subprocess): on a GPU machine the unit tier
# met one (issue 40), and on a fresh machine whichever unit test first imports matplotlib
# (flwr-datasets' partitioners do) met the other, in some orders only (issue 43).
LIBRARY_PROBES = ("ctypes.util", "matplotlib.font_manager", "torch", "triton")
_STARTERS = ("subprocess", "os", __name__)


class ProcessStartRefused(AssertionError):
    """Raised when a unit test tries to start a process."""


def process_starter(depth: int = 2) -> str:
    """The module that asked for the process: the first caller outside ``subprocess``, ``os`` and this guard."""
    frame = sys._getframe(depth)
    while frame is not None and frame.f_globals.get("__name__", "") in _STARTERS:
        frame = frame.f_back
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


def is_library_probe(module: str) -> bool:
    return any(module == probe or module.startswith(probe + ".") for probe in LIBRARY_PROBES)


def _guarded(original):
    def start(*args, **kwargs):
        if not is_library_probe(process_starter()):
            raise ProcessStartRefused(MOVE)
        return original(*args, **kwargs)

    return start


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch):
    """The unit tier computes on the CPU wherever it runs: ``device = "auto"`` resolves to the CPU
    on a GPU machine too, so its figures are CI's (what needs a GPU is tests/gpu's, and the
    placement checks run on the stand-in of tests/fake_device.py, which makes CUDA available)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "__init__", _guarded(subprocess.Popen.__init__))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _guarded(getattr(os, name)))


@pytest.fixture
def task_identity(monkeypatch):
    """Messages built outside a running SuperLink (a ClientApp called directly) need a task identity."""
    from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415 - only ClientApp tests pay the import

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
