"""FedAvg: one global model, the example-weighted average of the clients' models."""

from __future__ import annotations

from torch import nn

from fedapp.strategies.shared_module import SharedModuleStrategy


class FedAvgStrategy(SharedModuleStrategy):
    """Federated averaging of the full model (McMahan et al., 2017)."""

    has_global_model = True

    def build_shared_module(self) -> nn.Module:
        return self.zoo_model(self.config.model)
