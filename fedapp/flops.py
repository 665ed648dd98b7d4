"""Training FLOPs counted from the models' shapes.

Only the layers that dominate the cost are counted: convolutions and linear
layers, two FLOPs per multiply-accumulate. A backward pass costs twice its
forward pass when the layer's weights train (input and weight gradients), and
once when the layer is frozen but gradients must cross it to reach a trainable
layer below; a layer that neither trains nor passes gradients costs no backward.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn


def forward_flops(module: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one forward pass of ``module`` on one sample of ``input_shape``."""
    total = 0

    def conv_hook(layer: nn.Conv2d, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        kernel = layer.in_channels // layer.groups * layer.kernel_size[0] * layer.kernel_size[1]
        total += 2 * kernel * output[0].numel()

    def linear_hook(layer: nn.Linear, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        total += 2 * layer.in_features * output[0].numel()

    handles = []
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            handles.append(layer.register_forward_hook(conv_hook))
        elif isinstance(layer, nn.Linear):
            handles.append(layer.register_forward_hook(linear_hook))
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            module(torch.zeros(1, *input_shape))
    finally:
        for handle in handles:
            handle.remove()
        module.train(was_training)
    return total


@functools.lru_cache(maxsize=64)
def model_forward_flops(name: str, num_classes: int, image_size: int) -> int:
    """Forward FLOPs of a zoo model, cached by its shape."""
    from fedapp.models import build_model  # noqa: PLC0415 - avoid a cycle at import time

    return forward_flops(build_model(name, num_classes, image_size=image_size), (3, image_size, image_size))


def train_step_flops(trained: int = 0, frozen_on_path: int = 0, frozen_off_path: int = 0) -> int:
    """FLOPs of one training step on one sample, from the forward FLOPs of its parts.

    Parameters
    ----------
    trained
        Forward FLOPs of layers whose weights train (forward + 2x backward).
    frozen_on_path
        Forward FLOPs of frozen layers that gradients cross (forward + 1x backward).
    frozen_off_path
        Forward FLOPs of frozen layers no gradient reaches (forward only).
    """
    return 3 * trained + 2 * frozen_on_path + frozen_off_path
