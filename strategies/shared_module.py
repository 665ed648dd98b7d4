"""Averaging one module that every client holds in the same shape.

FedAvg averages the whole model; pFedLoRA the adapter, LG-FedAvg the head,
FML and FedKD the shared small model. They differ only in which module that is.
"""

from __future__ import annotations

import torch
from torch import nn

from fedapp.aggregation import Arrays, weighted_average
from fedapp.params import get_arrays
from strategies.base import ClientUpdate, FedAppStrategy

#: FML and FedKD share a small model but score each client on its own local one.
LOCAL_MODEL_NOTE = "clients are scored on their own local model, which a new client has not trained"


class SharedModuleStrategy(FedAppStrategy):
    """FedAvg over the arrays of :meth:`build_shared_module`."""

    def build_shared_module(self) -> nn.Module:
        """The module whose arrays travel (built under the run's seed)."""
        raise NotImplementedError

    def initial_arrays(self) -> Arrays:
        torch.manual_seed(int(self.config["seed"]))
        return get_arrays(self.build_shared_module())

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> Arrays:
        return weighted_average([(u.arrays, u.num_examples) for u in updates])
