"""The tiers hold: the unit tier refuses to start processes, and every test has its tier's marker."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.unit.conftest import ProcessStartRefused


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(ProcessStartRefused, match="move this test to tests/integration"):
        subprocess.run(["true"], check=False)
    with pytest.raises(ProcessStartRefused):
        os.fork()


def test_unit_tests_carry_the_unit_marker(request):
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("system") is None


def test_a_librarys_own_probe_of_the_machine_is_let_through():
    """ctypes.util.find_library runs ldconfig (torch and triton do the same on a GPU machine to
    find CUDA's libraries): such a probe is not the test starting a process, and is let through."""
    ctypes_util = pytest.importorskip("ctypes.util")
    ctypes_util.find_library("m")  # refused before issue 40's change when it starts ldconfig
    probe = {"__name__": "torch.cuda._probe", "subprocess": subprocess}
    exec("result = subprocess.run(['true'], check=False)", probe)  # as if torch ran it
    assert probe["result"].returncode == 0
    # matplotlib builds its font cache with fc-list on its first import in a fresh home; the
    # uncached call is that build's probe (refused before issue 43's change, in any order that
    # imported matplotlib in a unit test first).
    font_manager = pytest.importorskip("matplotlib.font_manager")
    assert isinstance(font_manager._get_fontconfig_fonts.__wrapped__(), list)
    ours = {"__name__": "fedapp.launch", "subprocess": subprocess}
    with pytest.raises(ProcessStartRefused):
        exec("subprocess.run(['true'], check=False)", ours)


def test_the_unit_tier_computes_on_the_cpu_wherever_it_runs():
    import torch  # noqa: PLC0415

    from fedapp.training import select_device  # noqa: PLC0415

    assert not torch.cuda.is_available() and select_device("auto") == torch.device("cpu")
