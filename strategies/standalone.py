"""Standalone: every client trains its own model; the server only keeps time and metrics."""

from __future__ import annotations

from fedapp.aggregation import Arrays
from fedapp.flower.strategy import ClientUpdate, FedAppStrategy


class StandaloneStrategy(FedAppStrategy):
    """No communication of model state: the lower bound of collaboration."""

    has_global_model = False

    def initial_arrays(self) -> Arrays:
        return []

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> Arrays:
        return []
