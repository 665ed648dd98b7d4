"""FML client: federated mutual learning with a shared small model."""

from __future__ import annotations

from fedapp.clients.mutual import MutualClient
from fedapp.methods.distillation_options import FMLOptions
from fedapp.methods.fml import fml_loss
from fedapp.training import LossFn


class FMLClient(MutualClient):
    """Federated mutual learning."""

    options: FMLOptions

    def loss(self) -> LossFn:
        return fml_loss(self.options.fml_alpha, self.options.fml_beta, self.options.kd_temperature)
