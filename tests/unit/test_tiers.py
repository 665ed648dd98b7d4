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
