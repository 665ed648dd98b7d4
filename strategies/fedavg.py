"""FedAvg: one global model, the example-weighted average of the clients' models."""

from __future__ import annotations

import torch

from fedapp.aggregation import Arrays, weighted_average
from fedapp.models import build_model
from fedapp.params import get_arrays
from strategies.base import ClientUpdate, FedAppStrategy


class FedAvgStrategy(FedAppStrategy):
    """Federated averaging of the full model (McMahan et al., 2017)."""

    has_global_model = True

    def initial_arrays(self) -> Arrays:
        torch.manual_seed(int(self.config["seed"]))
        model = build_model(str(self.config["model"]), self.num_classes, image_size=int(self.config["image-size"]))
        return get_arrays(model)

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> Arrays:
        return weighted_average([(u.arrays, u.num_examples) for u in updates])
