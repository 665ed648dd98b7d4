"""One local training loop and one evaluation loop, shared by every method.

Methods differ in *what* they optimise (the loss) and *which* parameters move;
both are arguments here, so no method carries its own copy of the loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.data.tensors import iterate_batches

log = logging.getLogger(__name__)

LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]
"""``loss_fn(model, x, y)`` returns the scalar loss of one mini-batch."""


@dataclass(frozen=True)
class TensorData:
    """Images as a normalised float tensor (N, C, H, W) and labels (N,)."""

    x: Tensor
    y: Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class TrainResult:
    """Mean loss over the mini-batches of the last epoch, and how much was seen."""

    loss: float
    num_examples: int
    steps: int


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float
    num_examples: int


@contextlib.contextmanager
def frozen(*modules: nn.Module) -> Iterator[None]:
    """Stop gradients into ``modules``' parameters inside the block, then restore."""
    params = [p for m in modules for p in m.parameters()]
    previous = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(params, previous, strict=True):
            p.requires_grad_(flag)


def cross_entropy_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Plain supervised loss: the default of every method."""
    return F.cross_entropy(model(x), y)


def select_device(name: str) -> torch.device:
    """Map the ``device`` config value to a torch device, falling back to CPU."""
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if name == "cuda":
        log.warning("device = cuda requested but CUDA is not available; using CPU")
    return torch.device("cpu")


def train(
    model: nn.Module,
    data: TensorData,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    loss_fn: LossFn = cross_entropy_loss,
    params: Iterable[nn.Parameter] | None = None,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    device: torch.device | str = "cpu",
) -> TrainResult:
    """Run ``epochs`` of SGD on ``data`` over ``params`` (default: all trainable).

    The data order depends only on ``seed``, so a client's training is
    reproducible from (seed, round, partition).
    """
    if len(data) == 0:
        return TrainResult(loss=float("nan"), num_examples=0, steps=0)
    device = torch.device(device)
    model.to(device)
    model.train()
    trainable = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    if not trainable:
        raise ValueError("train() was given no trainable parameters")
    optimizer = torch.optim.SGD(trainable, lr=lr, momentum=momentum, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    steps = 0
    epoch_loss = 0.0
    for _ in range(epochs):
        total, batches = 0.0, 0
        for xb, yb in iterate_batches(data.x, data.y, batch_size, shuffle=True, generator=generator):
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model, xb, yb)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            batches += 1
        steps += batches
        epoch_loss = total / max(batches, 1)
    return TrainResult(loss=epoch_loss, num_examples=len(data), steps=steps)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: TensorData,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    forward: Callable[[nn.Module, Tensor], Tensor] | None = None,
) -> EvalResult:
    """Cross-entropy loss and top-1 accuracy of ``forward(model, x)`` (default ``model(x)``)."""
    if len(data) == 0:
        return EvalResult(loss=float("nan"), accuracy=float("nan"), num_examples=0)
    device = torch.device(device)
    model.to(device)
    model.eval()
    loss_sum, correct = 0.0, 0
    for xb, yb in iterate_batches(data.x, data.y, batch_size, shuffle=False):
        xb, yb = xb.to(device), yb.to(device)
        logits = forward(model, xb) if forward is not None else model(xb)
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(dim=1) == yb).sum())
    n = len(data)
    return EvalResult(loss=loss_sum / n, accuracy=correct / n, num_examples=n)
