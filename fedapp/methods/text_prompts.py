"""Classifiers over cached CLIP image features for the text-prompt methods.

CoOp-local and PromptFL classify with one learned context; SDFed with a shared
global context and a private local one, refined once per round against the
global prompt's principal directions. Each is an ``nn.Module`` whose forward
maps image features to logits, so the shared train and eval loops run them
unchanged; the frozen text encoder is shared, only the contexts train.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedapp.errors import ConfigError
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder, clip_logits


class PromptClassifier(nn.Module):
    """CoOp: logits of image features against class prompts built from one context."""

    def __init__(self, encoder: PromptTextEncoder, context: PromptContext, logit_scale: Tensor) -> None:
        super().__init__()
        self.encoder = encoder
        self.context = context
        self.register_buffer("logit_scale", logit_scale.detach().clone())

    def forward(self, image_features: Tensor) -> Tensor:
        return clip_logits(image_features, self.encoder.encode_classes(self.context.context), self.logit_scale)


def context_from(array: Tensor | None, length: int, width: int, seed: int) -> PromptContext:
    """A context of ``(length, width)``: seeded init, then ``array``'s values if given."""
    context = PromptContext(length, width, generator=seed)
    if array is not None:
        if tuple(array.shape) != (length, width):
            raise ConfigError(f"prompt of shape {tuple(array.shape)} does not fit ({length}, {width})")
        with torch.no_grad():
            context.context.copy_(array)
    return context


def require_same_token_width(model_names: Sequence[str], widths: Sequence[int]) -> int:
    """The text token width all clients' backbones share; a mismatch cannot aggregate."""
    pairs = dict(zip(model_names, widths, strict=True))
    if len(set(pairs.values())) > 1:
        raise ConfigError(
            "client-clip-models have different text token widths, so their prompts cannot be averaged: "
            + ", ".join(f"{name}: {width}" for name, width in sorted(pairs.items()))
        )
    return next(iter(pairs.values()))
