"""Visual-prompt clients on a frozen open_clip ViT: head-only FedAvg, local VPT,
FedVPT, FedVPT-D and PEP-FedPT.

Images are kept normalised at their native size (the prompted model resizes
per batch); head-only FedAvg trains on cached frozen features instead, since
nothing before its head changes.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clientdata import clip_weights
from fedapp.clients.base import FedAppClient
from fedapp.methods.visual_prompt_options import VisualPromptOptions
from fedapp.methods.visual_prompts import build_visual_prompts
from fedapp.models import LoadedClip, load_open_clip
from fedapp.models.image_features import ImageFeatureCache, clip_image_batch
from fedapp.models.vpt import ClassMixer, PromptedViT, VisualPrompts
from fedapp.params import set_arrays
from fedapp.training import EvalResult, LossFn, TensorData, cross_entropy_loss

# One per worker process, keyed by (run config, partition, split, kind).
INPUTS = ImageFeatureCache()


class VisualPromptClient(FedAppClient):
    """Shared machinery: the frozen backbone, the client's inputs, one prompted model."""

    options: VisualPromptOptions

    @functools.cached_property
    def clip(self) -> LoadedClip:
        return load_open_clip(
            self.config.clip_model,
            clip_weights(self.config, self.config.clip_model),
            device=str(self.device),
            precision=self.config.precision,
        )

    def images(self, split: str) -> TensorData:
        """The split's images, normalised for the backbone, at native resolution."""
        images = self.data.splits[split]
        x = INPUTS.get_or_encode(
            (self.config, self.partition_id, split, "images"),
            self.clip,
            images.images,
            encode=self.input_batch,
        )
        return TensorData(x=x, y=torch.as_tensor(images.labels, dtype=torch.long))

    def learner(self, arrays: Arrays | None = None) -> VisualPrompts:
        """The method's prompts and head: fresh from the seed, or loaded from ``arrays``."""
        learner = build_visual_prompts(self.config.values, self.data.num_classes)
        if arrays is not None:
            set_arrays(learner, list(arrays))
        return learner

    def prompted(self, learner: VisualPrompts, mixer: ClassMixer | None = None) -> PromptedViT:
        return PromptedViT(self.clip, learner, mixer)

    def train_prompted(self, model: PromptedViT, server_round: int, loss_fn: LossFn = cross_entropy_loss) -> dict:
        """Train the prompts and head (the backbone is frozen), the prompts at ``prompt-lr-scale``
        times ``lr``, on ``loss_fn``; returns fit metrics."""
        head = {id(param) for param in model.prompts.head.parameters()}
        scale = self.options.prompt_lr_scale

        def lr_scale(param: nn.Parameter) -> float:
            return 1.0 if id(param) in head else scale

        params, data = model.prompts.parameters(), self.images("train")
        result = self.train_model(model, server_round, loss_fn, params=params, data=data, lr_scale=lr_scale)
        return self.fit_metrics(result)

    def score(self, module: nn.Module, parameters: Arrays, split: str = "test") -> tuple[EvalResult, dict[str, float]]:
        return self.test_model(module, self.images(split)), {}

    def input_batch(self, images_uint8: np.ndarray) -> torch.Tensor:
        """Images normalised with the backbone's statistics, at their own size (the prompted
        model resizes them to its input size, as it does the client's own)."""
        return clip_image_batch(images_uint8, self.clip, resize=False)

    @property
    def architecture(self) -> str:
        return self.config.clip_model

    def frozen_backbone(self) -> nn.Module:
        return self.clip.model
