"""Text-prompt clients on a frozen open_clip model: CoOp-local, PromptFL and SDFed.

The image encoder never changes, so each worker process encodes a client's
images once and reuses the features every epoch and round; only the prompt
contexts train, through the frozen text encoder.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clientdata import clip_weights
from fedapp.clients.base import FedAppClient, derived_seed
from fedapp.config import client_clip_model_names
from fedapp.methods import text_prompts as prompts
from fedapp.methods.text_prompt_options import TextPromptOptions
from fedapp.models import LoadedClip, load_open_clip
from fedapp.models.image_features import ImageClassifier, ImageFeatureCache, clip_image_batch
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder
from fedapp.training import EvalResult, TensorData

# One per worker process: features of every client this worker has served.
FEATURES = ImageFeatureCache()


@functools.lru_cache(maxsize=8)
def _encoder(clip: LoadedClip, class_names: tuple[str, ...]) -> PromptTextEncoder:
    return PromptTextEncoder(clip, class_names)


class PromptClient(FedAppClient):
    """Shared machinery: the backbone, the text encoder and the cached image features."""

    options: TextPromptOptions

    @property
    def clip_model_name(self) -> str:
        names = client_clip_model_names(self.config)
        return names[self.partition_id % len(names)]

    @functools.cached_property
    def clip(self) -> LoadedClip:
        return load_open_clip(
            self.clip_model_name,
            clip_weights(self.config, self.clip_model_name),
            device=str(self.device),
            precision=self.config.precision,
        )

    @functools.cached_property
    def encoder(self) -> PromptTextEncoder:
        """The text encoder over the classes this client trains on (the base ones under base-to-novel)."""
        return _encoder(self.clip, self.data.class_names)

    def features(self, split: str) -> TensorData:
        """The split's frozen image features (encoded on first use in this process)."""
        images = self.data.splits[split]
        # The run config fixes the data, backbone, weights and precision; the
        # partition and split pick the images.
        key = (self.config, self.partition_id, split)
        feats = FEATURES.get_or_encode(key, self.clip, images.images)
        return TensorData(x=feats.float(), y=torch.as_tensor(images.labels, dtype=torch.long))

    def context(self, array: np.ndarray | None, length: int, salt: int = 0) -> PromptContext:
        seed = derived_seed(self.config.seed, self.partition_id, salt)
        tensor = None if array is None else torch.as_tensor(array)
        return prompts.context_from(tensor, length, self.encoder.token_width, seed)

    def classifier(self, context: PromptContext, encoder: PromptTextEncoder | None = None) -> prompts.PromptClassifier:
        encoder = self.encoder if encoder is None else encoder
        return prompts.PromptClassifier(encoder, context, self.clip.model.logit_scale)

    def prompt_classifier(self, parameters: Arrays, encoder: PromptTextEncoder) -> nn.Module:
        """The method's classifier of image features over ``encoder``'s classes, from the
        global ``parameters`` and the client's own prompts."""
        raise NotImplementedError

    def inference_module(self, parameters: Arrays) -> ImageClassifier:
        return ImageClassifier(self.clip, self.prompt_classifier(parameters, self.encoder))

    def score(self, module: nn.Module, parameters: Arrays, split: str = "test") -> tuple[EvalResult, dict[str, float]]:
        """Test the classifier on the cached features of the client's classes; under base-to-novel
        also, on the test split, over the novel classes it never trained on (their names are new prompts)."""
        result = self.test_model(module.classifier, self.features(split))
        if not self.data.novel_class_names or split != "test":
            return result, {}
        novel = self.prompt_classifier(parameters, _encoder(self.clip, self.data.novel_class_names))
        return result, {"novel_accuracy": self.test_model(novel, self.features("test_novel")).accuracy}

    def input_batch(self, images_uint8: np.ndarray) -> torch.Tensor:
        """Images as the backbone reads them: resized to its input size, normalised with its statistics."""
        return clip_image_batch(images_uint8, self.clip)

    @property
    def architecture(self) -> str:
        return self.clip_model_name

    def frozen_backbone(self) -> nn.Module:
        return self.clip.model

    @staticmethod
    def context_arrays(context: PromptContext) -> Arrays:
        return [context.context.detach().cpu().numpy().copy()]
