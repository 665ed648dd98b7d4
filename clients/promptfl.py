"""PromptFL client: trains the received shared text context and sends it back."""

from __future__ import annotations

from fedapp.aggregation import Arrays
from fedapp.clients.text_prompt import PromptClient
from fedapp.methods import text_prompts as prompts
from fedapp.models.text_prompt import PromptTextEncoder


class PromptFLClient(PromptClient):
    """PromptFL: trains the received shared context and sends it back."""

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        context = self.context(parameters[0], self.options.prompt_length)
        result = self.train_model(self.classifier(context), int(config["server-round"]), data=self.features("train"))
        return self.context_arrays(context), result.num_examples, self.fit_metrics(result)

    def prompt_classifier(self, parameters: Arrays, encoder: PromptTextEncoder) -> prompts.PromptClassifier:
        return self.classifier(self.context(parameters[0], self.options.prompt_length), encoder)
