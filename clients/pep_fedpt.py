"""PEP-FedPT client: global prompts mixed per sample with this client's label prior."""

from __future__ import annotations

import numpy as np

from clients.visual_prompt import VisualPromptClient
from fedapp.aggregation import Arrays
from fedapp.methods.pep_fedpt import ccmp_mixer, class_prior
from fedapp.methods.per_class import per_class_means
from fedapp.models.vpt import PromptedViT
from fedapp.params import get_arrays


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
            self.config.ccmp_temperature,
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
