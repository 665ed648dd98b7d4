"""Pieces several methods share: per-class statistics and architecture checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.data.tensors import iterate_batches
from fedapp.errors import ConfigError
from fedapp.models import build_model
from fedapp.training import LossFn, TensorData


@torch.no_grad()
def per_class_means(
    module: nn.Module,
    outputs: Callable[[nn.Module, Tensor, Tensor], Tensor],
    data: TensorData,
    num_classes: int,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``outputs(module, x, y)`` over each class's samples, and the class counts.

    ``outputs`` sees the batch's labels ``y`` too (an oracle ablation reads them). Classes
    the client does not hold get a zero row and a zero count.
    """
    module.to(device)
    module.eval()
    sums: Tensor | None = None
    counts = torch.zeros(num_classes, dtype=torch.float64)
    for xb, yb in iterate_batches(data.x, data.y, batch_size, shuffle=False):
        out = outputs(module, xb.to(device), yb.to(device)).double().cpu()
        if sums is None:
            sums = torch.zeros(num_classes, out.shape[1], dtype=torch.float64)
        sums.index_add_(0, yb, out)
        counts += torch.bincount(yb, minlength=num_classes).double()
    if sums is None:
        raise ValueError("per_class_means() needs at least one sample")
    means = sums / counts.clamp(min=1).unsqueeze(1)
    return means.float().numpy(), counts.long().numpy()


def merge_per_class(
    uploads: Sequence[tuple[np.ndarray, np.ndarray]],
    previous: np.ndarray | None = None,
    *,
    momentum: float = 0.0,
    previous_present: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Count-weighted per-class average of client means; absent classes keep ``previous``.

    With ``momentum`` m, a class held both now and before becomes
    ``m * previous + (1 - m) * pooled``; a class seen for the first time takes
    the pooled mean. ``previous_present`` says which rows of ``previous`` hold
    a value (default: its non-zero rows).

    Returns the merged ``(classes, dim)`` means and a 0/1 presence mask.
    """
    total = np.zeros_like(uploads[0][0], dtype=np.float64)
    counts = np.zeros(uploads[0][0].shape[0], dtype=np.float64)
    for means, class_counts in uploads:
        total += means.astype(np.float64) * class_counts[:, None]
        counts += class_counts
    present = counts > 0
    merged = np.where(present[:, None], total / np.maximum(counts, 1)[:, None], 0.0)
    if previous is not None:
        held = np.any(previous != 0, axis=1) if previous_present is None else np.asarray(previous_present) > 0
        smoothed = momentum * previous.astype(np.float64) + (1.0 - momentum) * merged
        merged = np.where(present[:, None], np.where(held[:, None], smoothed, merged), previous)
        present = present | held
    return merged.astype(np.float32), present.astype(np.float32)


def class_distillation_loss(
    teacher: np.ndarray, present: np.ndarray, weight: float, distil: Callable[[Tensor, Tensor], Tensor]
) -> LossFn:
    """``CE(f(x), y) + weight * mean distil(f(x), teacher[y])``, the mean over the samples
    whose class has a teacher row (``present``); plain CE when no sample's class has one.

    FD distils per-class mean logits, FedD2P the server's per-class distributions;
    they differ only in ``distil(student_logits, teacher_rows)``, which returns one value
    per sample. The mean is a masked one (absent classes' rows are zeros, hence finite):
    no data-dependent shape and no read of a value, so a GPU step does not wait on the
    host and :mod:`fedapp.flops` can count the step.
    """
    rows = torch.as_tensor(teacher, dtype=torch.float32)
    mask = torch.as_tensor(present, dtype=torch.float32)

    def loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        out = model(x)
        ce = F.cross_entropy(out, y)
        if weight == 0:
            return ce
        keep = mask.to(x.device)[y]
        per_sample = distil(out, rows.to(x.device)[y])
        return ce + weight * (per_sample * keep).sum() / keep.sum().clamp(min=1)

    return loss


def require_same_feature_dim(model_names: Sequence[str], num_classes: int, method: str) -> int:
    """The representation width every client model shares; refuse a mix of widths."""
    dims = {name: build_model(name, num_classes).feature_dim for name in set(model_names)}
    if len(set(dims.values())) > 1:
        raise ConfigError(
            f"method '{method}' needs client models with one representation width, got "
            + ", ".join(f"{name}: {dim}" for name, dim in sorted(dims.items()))
        )
    return next(iter(dims.values()))
