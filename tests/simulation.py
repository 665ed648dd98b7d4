"""Flower's simulation engine in this process, for the integration tests.

``flwr.simulation.run_simulation`` is deprecated in Flower 1.42 in favour of
``flwr run`` (which the system tests and the docs use). The integration tests still
want Flower's Ray engine in process (fast, and the strategies stay inspectable), so
they call the engine that ``run_simulation`` wraps, without its deprecation notice:
a run's log then shows only what our apps cause. Flower is pinned in
``pyproject.toml``, so this private entry point cannot move under us unnoticed.
"""

from __future__ import annotations

from typing import Any

from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp
from flwr.simulation.run_simulation import _run_simulation
from flwr.supercore.telemetry import EventType

#: One CPU per simulated client, on a 2-core machine.
BACKEND = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 2}}


def simulate(
    server_app: ServerApp, client_app: ClientApp, num_supernodes: int, backend_config: dict[str, Any] | None = None
) -> None:
    """Run ``server_app`` against ``num_supernodes`` simulated nodes of ``client_app`` (Ray backend)."""
    _run_simulation(
        num_supernodes=num_supernodes,
        client_app=client_app,
        server_app=server_app,
        backend_name="ray",
        backend_config=BACKEND if backend_config is None else backend_config,
        exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
    )
