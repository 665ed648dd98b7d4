"""FedProto (Tan et al., 2022): clients share per-class prototypes, not models.

A prototype is the mean 500-d representation of a class. The client trains on
``CE + lambda * MSE(R, global_prototype[y])`` for classes the federation has
seen, then uploads its own class means and counts; the server merges them per
class, weighted by counts.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.training import LossFn


def representation(model: nn.Module, x: Tensor) -> Tensor:
    return model.features(x)


def prototype_loss(prototypes: np.ndarray, present: np.ndarray, weight: float) -> LossFn:
    """Cross-entropy plus the distance of each representation to its class prototype."""
    protos = torch.as_tensor(prototypes, dtype=torch.float32)
    mask = torch.as_tensor(present, dtype=torch.float32)

    def loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        features = model.features(x)
        ce = F.cross_entropy(model.head(features), y)
        if weight == 0:
            return ce
        target, keep = protos.to(x.device)[y], mask.to(x.device)[y]
        per_sample = ((features - target) ** 2).mean(dim=1)
        # A masked mean (0 when no sample's class has a prototype): no read of a value, so a
        # GPU step does not wait on the host and fedapp.flops can count it.
        return ce + weight * (per_sample * keep).sum() / keep.sum().clamp(min=1)

    return loss
