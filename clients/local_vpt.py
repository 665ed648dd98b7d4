"""Local VPT client: this client's own shallow visual prompts and head, never shared."""

from __future__ import annotations

from fedapp.aggregation import Arrays
from fedapp.clients.visual_prompt import VisualPromptClient
from fedapp.models.vpt import PromptedViT, VisualPrompts
from fedapp.params import named_arrays_to_state, state_to_named_arrays


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

    def inference_module(self, parameters: Arrays) -> PromptedViT:
        return self.prompted(self._own_learner())
