"""FedVPT (shallow) and FedVPT-D (deep) client: trains the received visual prompts and head, sends them back."""

from __future__ import annotations

from fedapp.aggregation import Arrays
from fedapp.clients.visual_prompt import VisualPromptClient
from fedapp.models.vpt import PromptedViT
from fedapp.params import get_arrays


class FedVPTClient(VisualPromptClient):
    """FedVPT (shallow) and FedVPT-D (deep): trains the received prompts and head, sends them back."""

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self.prompted(self.learner(parameters))
        metrics = self.train_prompted(model, int(config["server-round"]))
        return get_arrays(model.prompts), len(self.data.train), metrics

    def inference_module(self, parameters: Arrays) -> PromptedViT:
        return self.prompted(self.learner(parameters))
