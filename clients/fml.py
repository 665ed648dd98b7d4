"""FML client: federated mutual learning with a shared small model."""

from __future__ import annotations

from fedapp.clients.mutual import MutualClient
from fedapp.methods.fml import fml_loss
from fedapp.training import LossFn


class FMLClient(MutualClient):
    """Federated mutual learning."""

    def loss(self) -> LossFn:
        cfg = self.config
        return fml_loss(cfg.fml_alpha, cfg.fml_beta, cfg.kd_temperature)
