"""Text-prompt clients on a frozen open_clip model: CoOp-local, PromptFL and SDFed.

The image encoder never changes, so each worker process encodes a client's
images once and reuses the features every epoch and round; only the prompt
contexts train, through the frozen text encoder.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from clients.base import FedAppClient, derived_seed
from fedapp.aggregation import Arrays
from fedapp.config import client_clip_model_names
from fedapp.methods import prompts
from fedapp.methods.sdfed import SDFedWeights, build_projector, parse_local_lengths
from fedapp.models import LoadedClip, load_open_clip
from fedapp.models.prompt import ImageFeatureCache, PromptContext, PromptTextEncoder
from fedapp.training import TensorData

# One per worker process: features of every client this worker has served.
FEATURES = ImageFeatureCache()


@functools.lru_cache(maxsize=8)
def _encoder(clip: LoadedClip, class_names: tuple[str, ...]) -> PromptTextEncoder:
    return PromptTextEncoder(clip, class_names)


class PromptClient(FedAppClient):
    """Shared machinery: the backbone, the text encoder and the cached image features."""

    @property
    def clip_model_name(self) -> str:
        names = client_clip_model_names(self.config.values)
        return names[self.partition_id % len(names)]

    @functools.cached_property
    def clip(self) -> LoadedClip:
        return load_open_clip(
            self.clip_model_name,
            str(self.config["pretrained"]),
            device=str(self.device),
            precision=str(self.config["precision"]),
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
        seed = derived_seed(int(self.config["seed"]), self.partition_id, salt)
        tensor = None if array is None else torch.as_tensor(array)
        return prompts.context_from(tensor, length, self.encoder.token_width, seed)

    def classifier(self, context: PromptContext, encoder: PromptTextEncoder | None = None) -> prompts.PromptClassifier:
        encoder = self.encoder if encoder is None else encoder
        return prompts.PromptClassifier(encoder, context, self.clip.model.logit_scale)

    def evaluate_classifier(self, build: Callable[[PromptTextEncoder], nn.Module]) -> tuple[float, int, dict]:
        """Test the classifier ``build`` makes over the client's classes; under base-to-novel
        also over the novel classes it never trained on (their names are new prompts)."""
        result = self.test_model(build(self.encoder), self.features("test"))
        metrics = self.eval_metrics(result)
        if self.data.novel_class_names:
            novel_encoder = _encoder(self.clip, self.data.novel_class_names)
            metrics["novel_accuracy"] = self.test_model(build(novel_encoder), self.features("test_novel")).accuracy
        return result.loss, result.num_examples, metrics

    @staticmethod
    def context_arrays(context: PromptContext) -> Arrays:
        return [context.context.detach().cpu().numpy().copy()]


class CoOpLocalClient(PromptClient):
    """CoOp on one client: its own context, trained alone and kept in its store."""

    def _own_context(self) -> PromptContext:
        saved = self.store.load("context")
        return self.context(None if saved is None else saved["context"], int(self.config["prompt-length"]))

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        context = self._own_context()
        result = self.train_model(self.classifier(context), int(config["server-round"]), data=self.features("train"))
        self.store.save("context", {"context": self.context_arrays(context)[0]})
        return [], result.num_examples, self.fit_metrics(result)

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        context = self._own_context()
        return self.evaluate_classifier(lambda encoder: self.classifier(context, encoder))


class PromptFLClient(PromptClient):
    """PromptFL: trains the received shared context and sends it back."""

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        context = self.context(parameters[0], int(self.config["prompt-length"]))
        result = self.train_model(self.classifier(context), int(config["server-round"]), data=self.features("train"))
        return self.context_arrays(context), result.num_examples, self.fit_metrics(result)

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        context = self.context(parameters[0], int(self.config["prompt-length"]))
        return self.evaluate_classifier(lambda encoder: self.classifier(context, encoder))


class SDFedClient(PromptClient):
    """SDFed: a shared global prompt plus a private local prompt of this client's own length."""

    @property
    def local_length(self) -> int:
        lengths = parse_local_lengths(
            str(self.config["local-prompt-lengths"]), int(self.config["num-partitions"]), int(self.config["seed"])
        )
        return lengths[self.partition_id % len(lengths)]

    @property
    def weights(self) -> SDFedWeights:
        cfg = self.config
        return SDFedWeights(
            alpha=float(cfg["sdfed-alpha"]),
            beta=float(cfg["sdfed-beta"]),
            gamma=float(cfg["sdfed-gamma"]),
            lam=float(cfg["sdfed-lambda"]),
        )

    def _classifier(
        self, global_prompt: np.ndarray, encoder: PromptTextEncoder | None = None
    ) -> prompts.SDFedClassifier:
        global_context = self.context(global_prompt, int(self.config["prompt-length"]))
        saved = self.store.load("local_prompt")
        local_context = self.context(None if saved is None else saved["context"], self.local_length, salt=1)
        # Subspace refinement: once per round, from the global prompt as received.
        projector = build_projector(
            global_context.context.detach(), lam=self.weights.lam, mode=str(self.config["projector-mode"])
        )
        encoder = self.encoder if encoder is None else encoder
        return prompts.SDFedClassifier(
            encoder, global_context, local_context, projector.matrix, self.clip.model.logit_scale
        )

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self._classifier(parameters[0])
        result = self.train_model(
            model, int(config["server-round"]), prompts.sdfed_train_loss(self.weights), data=self.features("train")
        )
        self.store.save("local_prompt", {"context": self.context_arrays(model.local_context)[0]})
        metrics = {**self.fit_metrics(result), "local_prompt_length": self.local_length}
        return self.context_arrays(model.global_context), result.num_examples, metrics

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        return self.evaluate_classifier(lambda encoder: self._classifier(parameters[0], encoder))
