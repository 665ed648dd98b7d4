"""FedKD client: adaptive mutual distillation with a shared small model."""

from __future__ import annotations

from fedapp.clients.mutual import MutualClient
from fedapp.methods.fedkd import fedkd_loss
from fedapp.training import LossFn


class FedKDClient(MutualClient):
    """Adaptive mutual distillation with hidden-state alignment."""

    def loss(self) -> LossFn:
        return fedkd_loss(self.options.kd_temperature)
