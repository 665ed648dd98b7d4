"""The GPU tier pays Ray's start-up once, as the integration tier does (tests/integration/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_ray_start_for_the_tier(_private_cache):
    import ray  # noqa: PLC0415 - only the Ray simulations need it

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray, "shutdown", lambda *args, **kwargs: None)
        yield
    ray.shutdown()
