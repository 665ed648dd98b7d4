"""The integration tier pays Ray's start-up once.

Flower's Ray backend starts Ray when it is not running and shuts it down at the
end of every simulation (``RayBackend.terminate``). Every simulation here asks
for the same resources (1 CPU per client, 2 CPUs in all), so the first start
serves them all: ``ray.shutdown`` waits until the tier is done. Each simulation
still gets fresh actors (Flower kills its actor pool at the end of a run), so no
worker state is carried from one simulation to the next.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_ray_start_for_the_tier(_private_cache):
    import ray  # noqa: PLC0415 - only this tier needs it

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray, "shutdown", lambda *args, **kwargs: None)
        yield
    ray.shutdown()
