"""SDFed client: a shared global prompt plus a private local prompt of this client's own length."""

from __future__ import annotations

import numpy as np

from fedapp.aggregation import Arrays
from fedapp.clients.text_prompt import PromptClient
from fedapp.methods.sdfed import (
    SDFedClassifier,
    SDFedWeights,
    mechanism_figures,
    round_classifier,
    sdfed_train_loss,
)
from fedapp.methods.sdfed_options import SDFedOptions
from fedapp.models.text_prompt import PromptTextEncoder


class SDFedClient(PromptClient):
    """SDFed: a shared global prompt plus a private local prompt of this client's own length."""

    options: SDFedOptions

    @property
    def local_length(self) -> int:
        lengths = self.options.local_lengths(self.config.num_partitions, self.config.seed)
        return lengths[self.partition_id % len(lengths)]

    @property
    def weights(self) -> SDFedWeights:
        return SDFedWeights(
            alpha=self.options.sdfed_alpha,
            beta=self.options.sdfed_beta,
            gamma=self.options.sdfed_gamma,
            lam=self.options.sdfed_lambda,
            combination=self.options.sdfed_combination,
            separation_moves_global=self.options.sdfed_separation_moves_global,
        )

    def _classifier(self, global_prompt: np.ndarray, encoder: PromptTextEncoder | None = None) -> SDFedClassifier:
        saved = self.store.load("local_prompt")
        return round_classifier(
            self.encoder if encoder is None else encoder,
            self.context(global_prompt, self.options.prompt_length),
            self.context(None if saved is None else saved["context"], self.local_length, salt=1),
            self.weights,
            self.clip.model.logit_scale,
            projector_mode=self.options.projector_mode,
        )

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self._classifier(parameters[0])
        result = self.train_model(
            model, int(config["server-round"]), sdfed_train_loss(self.weights), data=self.features("train")
        )
        self.store.save("local_prompt", {"context": self.context_arrays(model.local_context)[0]})
        train = self.features("train")
        figures = mechanism_figures(model, train.x.to(self.device), train.y.to(self.device), self.weights)
        metrics = {**self.fit_metrics(result), "local_prompt_length": self.local_length, **figures}
        return self.context_arrays(model.global_context), result.num_examples, metrics

    def prompt_classifier(self, parameters: Arrays, encoder: PromptTextEncoder) -> SDFedClassifier:
        return self._classifier(parameters[0], encoder)
