"""FML (Shen et al., 2020): federated mutual learning.

Both models learn from the labels and from each other,
``L_local = a CE(local) + (1 - a) KL(shared || local)`` and
``L_shared = b CE(shared) + (1 - b) KL(local || shared)``; only the shared model
is averaged.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from fedapp.methods.fd import distillation_kl
from fedapp.methods.mutual import MutualPair
from fedapp.training import LossFn


def fml_loss(alpha: float, beta: float, temperature: float) -> LossFn:
    """Both FML objectives at once; detached targets keep their gradients apart."""

    def loss(pair: MutualPair, x: Tensor, y: Tensor) -> Tensor:
        local_out, shared_out = pair.local(x), pair.shared(x)
        local_loss = alpha * F.cross_entropy(local_out, y) + (1 - alpha) * distillation_kl(
            local_out, shared_out.detach(), temperature
        )
        shared_loss = beta * F.cross_entropy(shared_out, y) + (1 - beta) * distillation_kl(
            shared_out, local_out.detach(), temperature
        )
        return local_loss + shared_loss

    return loss
