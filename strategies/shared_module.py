"""Averaging one module that every client holds in the same shape.

FedAvg averages the whole model; pFedLoRA the adapter, LG-FedAvg the head,
FML and FedKD the shared small model. They differ only in which module that is.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from fedapp.aggregation import Arrays, min_updates
from fedapp.flower.robust import robust_aggregate
from fedapp.flower.strategy import ClientUpdate, FedAppStrategy
from fedapp.params import get_arrays

log = logging.getLogger("flwr.fedapp")


class SharedModuleStrategy(FedAppStrategy):
    """FedAvg over the arrays of :meth:`build_shared_module`."""

    def build_shared_module(self) -> nn.Module:
        """The module whose arrays travel (built under the run's seed)."""
        raise NotImplementedError

    def initial_arrays(self) -> Arrays:
        torch.manual_seed(self.config.seed)
        return get_arrays(self.build_shared_module())

    def global_array_names(self) -> list[str]:
        """The shared module's ``state_dict`` names (:meth:`initial_arrays`' order)."""
        return list(self._shared_names)

    @functools.cached_property
    def _shared_names(self) -> tuple[str, ...]:
        # Building draws initial weights: naming them must not move the run's random streams.
        with torch.random.fork_rng(devices=[]):
            return tuple(self.build_shared_module().state_dict())

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> Arrays:
        """The example-weighted mean, or the robust rule named by ``aggregation``."""
        rule = self.config.aggregation
        byzantine = self.config.byzantine_clients
        if len(updates) < min_updates(rule, byzantine):
            # Failures left fewer updates than the rule is sound for: keep the global state.
            log.warning(
                "round %d: %d usable updates, fewer than %s with byzantine-clients = %d needs (%d); "
                "keeping the previous global state",
                server_round,
                len(updates),
                rule,
                byzantine,
                min_updates(rule, byzantine),
            )
            return self.global_arrays
        return robust_aggregate(
            [(u.arrays, u.num_examples) for u in updates],
            rule,
            trim_fraction=self.config.trim_fraction,
            byzantine=byzantine,
        )
