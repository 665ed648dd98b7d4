"""Mutual learning between a private local model and a shared small model: the pair
that FML (:mod:`fedapp.methods.fml`) and FedKD (:mod:`fedapp.methods.fedkd`) train together."""

from __future__ import annotations

from torch import Tensor, nn


class MutualPair(nn.Module):
    """The private model and the shared model as one module for the shared train loop."""

    def __init__(self, local: nn.Module, shared: nn.Module) -> None:
        super().__init__()
        self.local = local
        self.shared = shared

    def forward(self, x: Tensor) -> Tensor:
        return self.local(x)
