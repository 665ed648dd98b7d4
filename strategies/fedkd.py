"""FedKD server: averages the shared student that local mentors distil with."""

from __future__ import annotations

from torch import nn

from fedapp.config import client_model_names
from fedapp.methods.distillation_options import MutualOptions
from fedapp.methods.per_class import require_same_feature_dim
from fedapp.strategies.shared_module import SharedModuleStrategy


class FedKDStrategy(SharedModuleStrategy):
    """Adaptive mutual distillation (Wu et al., 2022): only the student travels."""

    options: MutualOptions

    has_global_model = False

    def build_shared_module(self) -> nn.Module:
        names = (*client_model_names(self.config), self.options.shared_model)
        require_same_feature_dim(names, self.num_classes, "fedkd")
        return self.zoo_model(self.options.shared_model)
