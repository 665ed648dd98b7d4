"""PEP-FedPT's class-contextualised mixed prompts (CCMP), without Flower.

At class layer l, sample x on client k mixes the global class prompts with

    w_c(x) ∝ prior_k[c] · exp(cos(cls_{l-1}(x), mu^l_c) / tau),

normalised over classes, where ``prior_k`` is the client's label distribution
and ``mu^l`` the global class prototypes (means of ``cls_{l-1}`` pooled on the
server with momentum, see :func:`fedapp.methods.per_class.merge_per_class`).

Our readings where the paper is silent: a class without a prototype yet (no
training client has held it) scores a cosine of 0, so in round 1 the mixture
is the prior-weighted mean of the class prompts, the optimum of the paper's
quadratic bound; prototypes travel flattened as ``(classes, layers * width)``
so one per-class merge serves every class layer.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedapp.models.vpt import ClassMixer


def class_prior(label_counts: np.ndarray) -> Tensor:
    """The client's empirical label distribution ``(classes,)``."""
    counts = torch.as_tensor(np.asarray(label_counts), dtype=torch.float32)
    total = counts.sum()
    if total <= 0:
        raise ValueError("a class prior needs at least one labelled sample")
    return counts / total


def mixing_weights(cls: Tensor, prototypes: Tensor, present: Tensor, prior: Tensor, temperature: float) -> Tensor:
    """Per-sample weights of the class prompts at one class layer.

    Parameters
    ----------
    cls
        ``(batch, width)`` CLS tokens entering the layer.
    prototypes
        ``(classes, width)`` global prototypes of that layer.
    present
        ``(classes,)`` 1 where a prototype exists, 0 where it does not yet.
    prior
        ``(classes,)`` the client's label distribution; classes it lacks get weight 0.
    temperature
        tau > 0; smaller is sharper.

    Returns
    -------
    Tensor
        ``(batch, classes)``, each row a probability distribution.
    """
    cosine = F.normalize(cls.float(), dim=-1) @ F.normalize(prototypes.float(), dim=-1).T
    cosine = cosine * (present.float() > 0)
    # log(prior) turns the product with the prior into a sum inside the softmax.
    scores = cosine / temperature + torch.log(prior.float().clamp(min=0))
    return torch.softmax(scores, dim=-1)


def ccmp_mixer(
    prototypes: np.ndarray, present: np.ndarray, prior: Tensor, temperature: float, num_layers: int
) -> ClassMixer:
    """A :data:`~fedapp.models.vpt.ClassMixer` from the flattened global prototypes.

    ``prototypes`` is ``(classes, num_layers * width)`` as the server sends it.
    """
    classes = prototypes.shape[0]
    per_layer = torch.as_tensor(prototypes, dtype=torch.float32).reshape(classes, num_layers, -1).transpose(0, 1)
    mask = torch.as_tensor(present, dtype=torch.float32)

    def mix(j: int, cls: Tensor) -> Tensor:
        return mixing_weights(cls, per_layer[j].to(cls.device), mask.to(cls.device), prior.to(cls.device), temperature)

    return mix
