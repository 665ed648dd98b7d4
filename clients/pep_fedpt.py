"""PEP-FedPT client: global prompts mixed per sample with this client's label prior."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from fedapp.aggregation import Arrays
from fedapp.clients.visual_prompt import VisualPromptClient
from fedapp.methods.pep_fedpt import (
    MixingRecorder,
    OracleMixer,
    ccmp_mixer,
    class_prior,
    labelled_cross_entropy,
    labelled_forward,
    labels_shown,
    relative_change,
)
from fedapp.methods.per_class import per_class_means
from fedapp.methods.visual_prompt_options import PEPFedPTOptions
from fedapp.models.vpt import PromptedViT
from fedapp.params import get_arrays
from fedapp.training import EvalResult


class PriorMixer(nn.Module):
    """:func:`~fedapp.methods.pep_fedpt.ccmp_mixer` as a module, so that the global prototypes
    and this client's label prior are named buffers of the model it predicts with (and exports)."""

    def __init__(self, prototypes: np.ndarray, present: np.ndarray, prior: Tensor, temperature: float, layers: int):
        super().__init__()
        self.register_buffer("prototypes", torch.as_tensor(prototypes, dtype=torch.float32).clone())
        self.register_buffer("present", torch.as_tensor(present, dtype=torch.float32).clone())
        self.register_buffer("prior", prior.detach().to(torch.float32).clone())
        self.temperature = temperature
        self.layers = layers

    def forward(self, j: int, cls: Tensor) -> Tensor:
        return ccmp_mixer(self.prototypes, self.present, self.prior, self.temperature, self.layers)(j, cls)


class PEPFedPTClient(VisualPromptClient):
    """PEP-FedPT: global prompts mixed per sample with this client's label prior.

    Holds nothing between rounds: everything trainable arrives from the server,
    and the only client-specific input, the prior, is recomputed from the labels.
    """

    options: PEPFedPTOptions

    def _prior(self) -> Tensor:
        counts = self.data.label_counts()
        if counts.sum() == 0:
            # No training labels (a model rebuilt for inference, fedapp.inference): a uniform
            # prior, which a client's exported one replaces.
            return torch.full((self.data.num_classes,), 1.0 / self.data.num_classes)
        return class_prior(counts)

    def _model(self, parameters: Arrays) -> PromptedViT:
        learner = self.learner(parameters[:-2])
        if self.options.pep_mixer == "oracle":
            return self.prompted(learner, OracleMixer(self.data.num_classes))
        mixer = PriorMixer(
            parameters[-2], parameters[-1], self._prior(), self.options.ccmp_temperature, len(learner.class_layers)
        )
        return self.prompted(learner, mixer)

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self._model(parameters)
        received = (model.prompts.class_prompts.detach().clone(), model.prompts.head.weight.detach().clone())
        metrics = self.train_prompted(model, int(config["server-round"]), labelled_cross_entropy)
        # The mechanism at work: how far this round moved the class prompts against the head, and
        # how the per-sample mixing weighs the classes on this client's images.
        metrics["class_prompt_change"] = relative_change(received[0], model.prompts.class_prompts.detach())
        metrics["head_change"] = relative_change(received[1], model.prompts.head.weight.detach())
        # Per-class means of the CLS tokens entering each class layer, with the trained prompts;
        # the same pass records how the mixing weighs the classes.
        train = self.images("train")
        with MixingRecorder(model, train.y) as mixing:
            means, counts = per_class_means(
                model, _class_layer_tokens, train, self.data.num_classes, device=self.device
            )
        metrics.update(mixing.figures())
        return [*get_arrays(model.prompts), means, counts.astype(np.int64)], len(self.data.train), metrics

    def inference_module(self, parameters: Arrays) -> PromptedViT:
        return self._model(parameters)

    def score(self, module: nn.Module, parameters: Arrays, split: str = "test") -> tuple[EvalResult, dict[str, float]]:
        # The mixing on the scored images too: how often its top class is the label, which bounds the
        # accuracy once trained class prompts decide the class (the oracle mixer scores 1.0 then).
        images = self.images(split)
        with MixingRecorder(module, images.y) as mixing:
            result = self.test_model(module, images, forward=labelled_forward)
        return result, mixing.figures()


def _class_layer_tokens(model: PromptedViT, images: Tensor, labels: Tensor) -> Tensor:
    """The CLS tokens entering each class layer, flattened: what the prototypes average."""
    with labels_shown(model, labels):
        return model.tokens(images)[1].flatten(1)
