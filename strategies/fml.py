"""FML server: averages the shared small model that clients mutually learn with."""

from __future__ import annotations

from torch import nn

from fedapp.methods.distillation_options import MutualOptions
from fedapp.strategies.shared_module import SharedModuleStrategy


class FMLStrategy(SharedModuleStrategy):
    """Federated mutual learning (Shen et al., 2020): only the shared model travels."""

    options: MutualOptions

    has_global_model = False

    def build_shared_module(self) -> nn.Module:
        return self.zoo_model(self.options.shared_model)
