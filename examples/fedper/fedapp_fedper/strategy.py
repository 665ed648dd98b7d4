"""FedPer server: averages the base layers; every client keeps its own head."""

from __future__ import annotations

from torch import nn

from fedapp.strategies.shared_module import SharedModuleStrategy
from fedapp_fedper.base_layers import BaseLayers
from fedapp_fedper.options import FedPerOptions


class FedPerStrategy(SharedModuleStrategy):
    """Federated base layers, personal heads (Arivazhagan et al., 2019)."""

    options: FedPerOptions
    has_global_model = False  # a client predicts through its own personal layers

    def build_shared_module(self) -> nn.Module:
        return BaseLayers(self.zoo_model(self.config.model), self.options.fedper_personal_layers)
