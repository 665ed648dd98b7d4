"""LG-FedAvg server: averages the classifier head; representations stay local."""

from __future__ import annotations

from torch import nn

from fedapp.config import client_model_names
from fedapp.methods.per_class import require_same_feature_dim
from fedapp.strategies.shared_module import SharedModuleStrategy


class LGFedAvgStrategy(SharedModuleStrategy):
    """Local representations, global head (Liang et al., 2020)."""

    has_global_model = False

    def build_shared_module(self) -> nn.Module:
        dim = require_same_feature_dim(client_model_names(self.config), self.num_classes, "lg-fedavg")
        return nn.Linear(dim, self.num_classes)
