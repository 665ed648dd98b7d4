"""One local training loop and one evaluation loop, shared by every method.

Methods differ in *what* they optimise (the loss) and *which* parameters move;
both are arguments here, so no method carries its own copy of the loop.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.sgd import sgd

from fedapp.data.tensors import iterate_batches
from fedapp.flops import training_flops

# Flower's logger, as elsewhere in fedapp: it has a handler that prints INFO (the root logger drops it).
log = logging.getLogger("flwr.fedapp")

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
    """Mean loss over the mini-batches of the last epoch, how much was seen, and what it cost
    (FLOPs of every step, forward and backward, counted by :func:`fedapp.flops.training_flops`)."""

    loss: float
    num_examples: int
    steps: int
    flops: int = 0


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


def select_device(name: str, *, no_gpu_reason: str = "") -> torch.device:
    """Map the ``device`` config value to a torch device, falling back to CPU.

    ``"auto"`` picks CUDA when torch sees a GPU, else the CPU, and says which
    at INFO; ``"cuda"`` without a usable GPU falls back to the CPU with a
    WARNING. Each line is logged once per process, not once per client.

    Parameters
    ----------
    name : str
        ``"auto"``, ``"cpu"`` or ``"cuda"`` (the config key's choices).
    no_gpu_reason : str, optional
        Why this process must not take a GPU although torch may see one (a simulation
        worker given none): the CPU, with this reason in the line.

    Returns
    -------
    torch.device
        ``cpu`` or ``cuda`` (the current CUDA device).
    """
    if name == "cpu":
        return torch.device("cpu")
    if not no_gpu_reason and torch.cuda.is_available():
        # A Ray simulation worker sees only the GPU Ray assigned it (Ray sets
        # CUDA_VISIBLE_DEVICES per worker), so plain "cuda" is that GPU there.
        index = torch.cuda.current_device()
        _log_once(logging.INFO, f"device = {name}: using cuda:{index} ({_gpu_description(index)})")
        return torch.device("cuda")
    reason = no_gpu_reason or _no_cuda_reason()
    if name == "cuda":
        _log_once(logging.WARNING, f"device = cuda requested but CUDA is not available ({reason}); using CPU")
    else:
        _log_once(logging.INFO, f"device = {name}: CUDA not available ({reason}); using CPU")
    return torch.device("cpu")


@functools.cache
def _log_once(level: int, message: str) -> None:
    # select_device runs for every client a worker builds; the line matters once.
    log.log(level, message)


def _gpu_description(index: int) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    name = torch.cuda.get_device_name(index)
    return name if visible is None else f"{name}; CUDA_VISIBLE_DEVICES={visible}"


def _no_cuda_reason() -> str:
    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        # Ray 2.x sets it to "" in simulation workers that were given no GPU.
        hint = "simulated clients get one with --gpus-per-client"
        return f"no GPU visible with CUDA_VISIBLE_DEVICES={visible!r}; {hint}"
    return "no CUDA device found"


class FunctionalSGD:
    """SGD with momentum and weight decay, computed by torch's own kernel (``torch.optim.sgd.sgd``).

    The update is ``torch.optim.SGD``'s, bit for bit. What it leaves out is
    ``torch.optim.Optimizer``'s step wrapper, which imports ``torch._dynamo`` on its
    first call: 1.2 s of CPU on an idle core and more under load. A deployed
    ClientApp is a new process for every message, so every message would pay it.
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        *,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        lr_scale: Callable[[nn.Parameter], float] | None = None,
    ):
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        # Each parameter's own learning rate: lr times its scale (a prompt learning-rate multiplier).
        self.lrs = [lr * (1.0 if lr_scale is None else float(lr_scale(param))) for param in self.params]
        self.momentum_buffers: list[Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for lr in dict.fromkeys(self.lrs):  # one kernel call per learning rate, as torch's param groups
            stepped = [i for i, param in enumerate(self.params) if param.grad is not None and self.lrs[i] == lr]
            buffers = [self.momentum_buffers[i] for i in stepped]
            sgd(
                [self.params[i] for i in stepped],
                [self.params[i].grad for i in stepped],
                buffers,
                weight_decay=self.weight_decay,
                momentum=self.momentum,
                lr=lr,
                dampening=0.0,
                nesterov=False,
                maximize=False,
            )
            if self.momentum != 0:
                for i, buffer in zip(stepped, buffers, strict=True):
                    self.momentum_buffers[i] = buffer


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
    lr_scale: Callable[[nn.Parameter], float] | None = None,
) -> TrainResult:
    """Run ``epochs`` of SGD on ``data`` over ``params`` (default: all trainable), each
    parameter at ``lr`` times ``lr_scale(parameter)`` (default 1).

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
    optimizer = FunctionalSGD(trainable, lr=lr, momentum=momentum, weight_decay=weight_decay, lr_scale=lr_scale)
    generator = torch.Generator().manual_seed(seed)
    steps = 0
    epoch_loss = 0.0
    for _ in range(epochs):
        # Summed where the loss is, in float64 as a Python float would, and read once an epoch:
        # reading it every step would make the host wait for the GPU at every step.
        total, batches = torch.zeros((), dtype=torch.float64, device=device), 0
        for xb, yb in iterate_batches(data.x, data.y, batch_size, shuffle=True, generator=generator):
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = loss_fn(model, xb, yb)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            batches += 1
        steps += batches
        epoch_loss = float(total) / max(batches, 1)
    # Counted after the loop on meta stand-ins: the training itself and its random stream are untouched.
    flops = training_flops(model, loss_fn, data.x, data.y, batch_size=batch_size, epochs=epochs)
    return TrainResult(loss=epoch_loss, num_examples=len(data), steps=steps, flops=flops)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: TensorData,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    forward: Callable[[nn.Module, Tensor, Tensor], Tensor] | None = None,
) -> EvalResult:
    """Cross-entropy loss and top-1 accuracy of ``forward(model, x, y)`` (default ``model(x)``;
    ``y``, the batch's labels, is there for ablations that read them, such as an oracle)."""
    if len(data) == 0:
        return EvalResult(loss=float("nan"), accuracy=float("nan"), num_examples=0)
    device = torch.device(device)
    model.to(device)
    model.eval()
    # On the device and read once at the end (see train).
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for xb, yb in iterate_batches(data.x, data.y, batch_size, shuffle=False):
        xb, yb = xb.to(device), yb.to(device)
        logits = forward(model, xb, yb) if forward is not None else model(xb)
        loss_sum += F.cross_entropy(logits, yb, reduction="sum")
        correct += (logits.argmax(dim=1) == yb).sum()
    n = len(data)
    return EvalResult(loss=float(loss_sum) / n, accuracy=int(correct) / n, num_examples=n)
