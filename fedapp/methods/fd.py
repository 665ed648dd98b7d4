"""FD, federated distillation (Jeong et al., 2018): clients share per-class mean logits.

The client trains on ``CE + gamma * T^2 * KL(softmax(g_y / T) || softmax(f(x) / T))``
where ``g_y`` is the federation's mean logit vector for the sample's class, then
uploads its own per-class mean logits and counts. Our reading: the teacher is
the global mean including the client's own contribution (the paper subtracts
it; with many clients the difference is small).
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.methods.per_class import class_distillation_loss
from fedapp.training import LossFn


def logits(model: nn.Module, x: Tensor) -> Tensor:
    return model(x)


def distillation_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """Hinton's KL(teacher || student) at temperature T, scaled by T^2, per batch."""
    log_student = F.log_softmax(student_logits / temperature, dim=1)
    teacher = F.softmax(teacher_logits / temperature, dim=1)
    return F.kl_div(log_student, teacher, reduction="batchmean") * temperature**2


def sample_distillation_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """:func:`distillation_kl` per sample (its batch mean is :func:`distillation_kl`)."""
    log_student = F.log_softmax(student_logits / temperature, dim=1)
    teacher = F.softmax(teacher_logits / temperature, dim=1)
    return F.kl_div(log_student, teacher, reduction="none").sum(dim=1) * temperature**2


def fd_loss(global_logits: np.ndarray, present: np.ndarray, weight: float, temperature: float) -> LossFn:
    """Cross-entropy plus distillation towards the global logits of each sample's class."""
    return class_distillation_loss(
        global_logits, present, weight, lambda student, teacher: sample_distillation_kl(student, teacher, temperature)
    )
