"""Head-only FedAvg client: a linear head on frozen CLS features of a ViT, averaged."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clients.visual_prompt import INPUTS, VisualPromptClient
from fedapp.models.vpt import PromptedViT
from fedapp.params import get_arrays
from fedapp.training import EvalResult, TensorData


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
        return get_arrays(learner), result.num_examples, self.fit_metrics(result)

    def inference_module(self, parameters: Arrays) -> PromptedViT:
        # No prompt layers: the bare backbone under the head, taking images like every visual-prompt model.
        return self.prompted(self.learner(parameters))

    def score(self, module: nn.Module, parameters: Arrays, split: str = "test") -> tuple[EvalResult, dict[str, float]]:
        # The head alone on the cached features: what the model computes on the images, once per process.
        return self.test_model(module.prompts.head, self.features(split)), {}
