"""pFedLoRA: a small homogeneous low-rank adapter shared by heterogeneous CNNs.

The adapter reads the model's 500-d representation R and predicts classes.
Each round a client (1) freezes the received global adapter and trains its own
model on ``(1 - mu) CE(head(R)) + mu CE(adapter(R))`` (the adapter's gradient
reaches the encoder), then (2) freezes its model and trains the adapter on
``CE(adapter(R))``; only the adapter is uploaded and averaged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.training import LossFn, TrainResult, frozen

ADAPTER_KINDS = ("matrix", "direct")
ADAPTER_INITS = ("default", "lora")
INFERENCE_READINGS = ("head", "adapter", "combined")


class LowRankAdapter(nn.Module):
    """``Linear(d -> h) -> [ReLU] -> Linear(h -> classes)`` on the representation.

    ``kind="matrix"`` is a rank-h factorisation of one linear map (no
    non-linearity, h in 20..80 in the paper); ``kind="direct"`` is a
    dimension-reduced FC2 + FC3 pair with a ReLU (h in 100..500).
    """

    def __init__(self, in_dim: int, hidden: int, num_classes: int, kind: str = "matrix", init: str = "default") -> None:
        super().__init__()
        if kind not in ADAPTER_KINDS:
            raise ValueError(f"adapter kind {kind!r} is not one of {ADAPTER_KINDS}")
        if init not in ADAPTER_INITS:
            raise ValueError(f"adapter init {init!r} is not one of {ADAPTER_INITS}")
        self.kind = kind
        self.down = nn.Linear(in_dim, hidden)
        self.up = nn.Linear(hidden, num_classes)
        if init == "lora":
            # LoRA's start (Hu et al., as pFedLoRA's Section 3 recalls it): A Gaussian, B zero, so
            # the adapter first adds nothing (here: uniform logits) and B learns from A's features.
            nn.init.normal_(self.down.weight, std=1.0 / hidden)
            nn.init.zeros_(self.down.bias)
            nn.init.zeros_(self.up.weight)
            nn.init.zeros_(self.up.bias)

    def forward(self, representation: Tensor) -> Tensor:
        hidden = self.down(representation)
        if self.kind == "direct":
            hidden = F.relu(hidden)
        return self.up(hidden)


class ModelWithAdapter(nn.Module):
    """The local model and the adapter as one module, so one train loop serves both steps."""

    def __init__(self, model: nn.Module, adapter: LowRankAdapter) -> None:
        super().__init__()
        self.model = model
        self.adapter = adapter

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def adapter_logits(self, x: Tensor) -> Tensor:
        return self.adapter(self.model.features(x))

    def combined_log_probs(self, x: Tensor, mu: float) -> Tensor:
        """``log((1 - mu) softmax(head) + mu softmax(adapter))``: both branches, weighted as step 1's loss."""
        representation = self.model.features(x)
        head = F.softmax(self.model.head(representation), dim=1)
        adapter = F.softmax(self.adapter(representation), dim=1)
        return torch.log(((1 - mu) * head + mu * adapter).clamp_min(torch.finfo(head.dtype).tiny))


class PFedLoRAPredictor(nn.Module):
    """The model a client predicts with under a reading of pFedLoRA's inference (the paper does
    not say): its own model's head (``head``), the adapter on its representation
    (``adapter``), or both mixed as step 1 weighs them (``combined``). Returns log-scores
    whose argmax is the prediction."""

    def __init__(self, net: ModelWithAdapter, reading: str, mu: float) -> None:
        super().__init__()
        if reading not in INFERENCE_READINGS:
            raise ValueError(f"pFedLoRA inference {reading!r} is not one of {INFERENCE_READINGS}")
        self.net, self.reading, self.mu = net, reading, mu

    def forward(self, x: Tensor) -> Tensor:
        if self.reading == "head":
            return self.net.model(x)
        if self.reading == "adapter":
            return self.net.adapter_logits(x)
        return self.net.combined_log_probs(x, self.mu)


def local_model_loss(mu: float) -> LossFn:
    """Step 1: the weighted hard losses of the model's head and the adapter branch."""

    def loss(net: ModelWithAdapter, x: Tensor, y: Tensor) -> Tensor:
        representation = net.model.features(x)
        return (1 - mu) * F.cross_entropy(net.model.head(representation), y) + mu * F.cross_entropy(
            net.adapter(representation), y
        )

    return loss


def adapter_loss(net: ModelWithAdapter, x: Tensor, y: Tensor) -> Tensor:
    """Step 2: the adapter's hard loss on the (frozen) model's representation."""
    return F.cross_entropy(net.adapter_logits(x), y)


@dataclass(frozen=True)
class RoundResult:
    model_step: TrainResult
    adapter_step: TrainResult


def train_round(
    net: ModelWithAdapter, mu: float, train: Callable[[nn.Module, LossFn, list[nn.Parameter]], TrainResult]
) -> RoundResult:
    """Run pFedLoRA's two local steps; ``train(module, loss_fn, params)`` is the shared loop."""
    with frozen(net.adapter):
        model_step = train(net, local_model_loss(mu), list(net.model.parameters()))
    with frozen(net.model):
        adapter_step = train(net, adapter_loss, list(net.adapter.parameters()))
    return RoundResult(model_step, adapter_step)
