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

from clients.base import FedAppClient
from fedapp.aggregation import Arrays
from fedapp.flops import train_step_flops
from fedapp.methods.common import per_class_means
from fedapp.methods.pepfedpt import ccmp_mixer, class_prior
from fedapp.methods.visual_prompts import build_visual_prompts
from fedapp.models import LoadedClip, load_open_clip
from fedapp.models.prompt import ImageFeatureCache, clip_image_batch
from fedapp.models.vpt import ClassMixer, PromptedViT, VisualPrompts, vit_forward_flops
from fedapp.params import get_arrays, named_arrays_to_state, set_arrays, state_to_named_arrays
from fedapp.training import TensorData

# One per worker process, keyed by (run config, partition, split, kind).
INPUTS = ImageFeatureCache()


class VisualPromptClient(FedAppClient):
    """Shared machinery: the frozen backbone, the client's inputs, one prompted model."""

    @functools.cached_property
    def clip(self) -> LoadedClip:
        return load_open_clip(
            str(self.config["clip-model"]),
            str(self.config["pretrained"]),
            device=str(self.device),
            precision=str(self.config["precision"]),
        )

    def images(self, split: str) -> TensorData:
        """The split's images, normalised for the backbone, at native resolution."""
        images = self.data.splits[split]
        x = INPUTS.get_or_encode(
            (self.config, self.partition_id, split, "images"),
            self.clip,
            images.images,
            encode=lambda raw: clip_image_batch(raw, self.clip, resize=False),
        )
        return TensorData(x=x, y=torch.as_tensor(images.labels, dtype=torch.long))

    def learner(self, arrays: Arrays | None = None) -> VisualPrompts:
        """The method's prompts and head: fresh from the seed, or loaded from ``arrays``."""
        learner = build_visual_prompts(self.config, self.data.num_classes)
        if arrays is not None:
            set_arrays(learner, list(arrays))
        return learner

    def prompted(self, learner: VisualPrompts, mixer: ClassMixer | None = None) -> PromptedViT:
        return PromptedViT(self.clip, learner, mixer)

    def train_prompted(self, model: PromptedViT, server_round: int) -> dict:
        """Train the prompts and head (the backbone is frozen); returns fit metrics."""
        result = self.train_model(model, server_round, params=model.prompts.parameters(), data=self.images("train"))
        learner = model.prompts
        forward = vit_forward_flops(learner.shape, learner.prompt_tokens, learner.num_classes)
        head = 2 * learner.shape.width * learner.num_classes
        # Prompts enter at layer 1, so gradients cross every frozen block.
        step = train_step_flops(trained=head, frozen_on_path=forward - head)
        return self.fit_metrics(result, sample_flops=step)

    def evaluate_prompted(self, model: PromptedViT) -> tuple[float, int, dict]:
        result = self.test_model(model, self.images("test"))
        return result.loss, result.num_examples, self.eval_metrics(result)


class HeadFedAvgClient(VisualPromptClient):
    """Head-only FedAvg: a linear head on frozen CLS features, averaged."""

    def features(self, split: str) -> TensorData:
        """The frozen backbone's pooled CLS features of a split, encoded once per process."""
        data = self.images(split)
        encoder = self.prompted(self.learner())  # no prompt layers: the bare backbone

        @torch.no_grad()
        def encode(_raw: np.ndarray) -> torch.Tensor:
            return torch.cat([encoder.tokens(chunk.to(self.device))[0] for chunk in data.x.split(256)])

        x = INPUTS.get_or_encode((self.config, self.partition_id, split, "features"), self.clip, None, encode=encode)
        return TensorData(x=x, y=data.y)

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        learner = self.learner(parameters)
        result = self.train_model(learner.head, int(config["server-round"]), data=self.features("train"))
        sample_flops = train_step_flops(trained=2 * learner.shape.width * learner.num_classes)
        return get_arrays(learner), result.num_examples, self.fit_metrics(result, sample_flops)

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        result = self.test_model(self.learner(parameters).head, self.features("test"))
        return result.loss, result.num_examples, self.eval_metrics(result)


class FedVPTClient(VisualPromptClient):
    """FedVPT (shallow) and FedVPT-D (deep): trains the received prompts and head, sends them back."""

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self.prompted(self.learner(parameters))
        metrics = self.train_prompted(model, int(config["server-round"]))
        return get_arrays(model.prompts), len(self.data.train), metrics

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        return self.evaluate_prompted(self.prompted(self.learner(parameters)))


class LocalVPTClient(VisualPromptClient):
    """Local VPT: this client's own shallow prompts and head, never shared."""

    def _own_learner(self) -> VisualPrompts:
        learner = self.learner()
        saved = self.store.load("prompts")
        if saved is not None:
            named_arrays_to_state(learner, saved)
        return learner

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self.prompted(self._own_learner())
        metrics = self.train_prompted(model, int(config["server-round"]))
        self.store.save("prompts", state_to_named_arrays(model.prompts))
        return [], len(self.data.train), metrics

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        return self.evaluate_prompted(self.prompted(self._own_learner()))


class PEPFedPTClient(VisualPromptClient):
    """PEP-FedPT: global prompts mixed per sample with this client's label prior.

    Holds nothing between rounds: everything trainable arrives from the server,
    and the only client-specific input, the prior, is recomputed from the labels.
    """

    def _model(self, parameters: Arrays) -> PromptedViT:
        learner = self.learner(parameters[:-2])
        mixer = ccmp_mixer(
            parameters[-2],
            parameters[-1],
            class_prior(self.data.label_counts()),
            float(self.config["ccmp-temperature"]),
            num_layers=len(learner.class_layers),
        )
        return self.prompted(learner, mixer)

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self._model(parameters)
        metrics = self.train_prompted(model, int(config["server-round"]))
        # Per-class means of the CLS tokens entering each class layer, with the trained prompts.
        means, counts = per_class_means(
            model,
            lambda m, x: m.tokens(x)[1].flatten(1),
            self.images("train"),
            self.data.num_classes,
            device=self.device,
        )
        return [*get_arrays(model.prompts), means, counts.astype(np.int64)], len(self.data.train), metrics

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        return self.evaluate_prompted(self._model(parameters))
