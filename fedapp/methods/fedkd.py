"""FedKD (Wu et al., 2022): adaptive mutual distillation between the local mentor
and the shared student.

The distillation and hidden-state losses are divided by the sum of both models'
task losses, so they weigh more when both predict well:
``L = CE_t + CE_s + (KL_t + KL_s + MSE_t + MSE_s) / (CE_t + CE_s)``. All zoo CNNs
share the 500-d representation, so the hidden loss needs no projection. The
paper's SVD compression of the uploaded gradients is not applied (our reading:
it changes bytes, not the learning rule; see the docs' FedKD page).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from fedapp.methods.fd import distillation_kl
from fedapp.methods.mutual import MutualPair
from fedapp.training import LossFn


def fedkd_loss(temperature: float) -> LossFn:
    """FedKD's adaptive mutual distillation of outputs and hidden representations."""

    def loss(pair: MutualPair, x: Tensor, y: Tensor) -> Tensor:
        hidden_t, hidden_s = pair.local.features(x), pair.shared.features(x)
        out_t, out_s = pair.local.head(hidden_t), pair.shared.head(hidden_s)
        task_t, task_s = F.cross_entropy(out_t, y), F.cross_entropy(out_s, y)
        scale = (task_t + task_s).detach().clamp(min=1e-6)
        distill = distillation_kl(out_t, out_s.detach(), temperature) + distillation_kl(
            out_s, out_t.detach(), temperature
        )
        hidden = F.mse_loss(hidden_t, hidden_s.detach()) + F.mse_loss(hidden_s, hidden_t.detach())
        return task_t + task_s + (distill + hidden) / scale

    return loss
