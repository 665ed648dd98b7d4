"""The integration tier pays Ray's start-up once (``ray_kept_running`` in tests/conftest.py).

Every simulation here asks for the same resources (1 CPU per client, 2 CPUs in all), so the
first start serves them all.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_ray_start_for_the_tier(ray_kept_running):
    yield
