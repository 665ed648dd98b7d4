"""The GPU tier pays Ray's start-up once, as the integration tier does (``ray_kept_running``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_ray_start_for_the_tier(ray_kept_running):
    yield
