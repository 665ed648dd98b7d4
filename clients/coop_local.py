"""CoOp-local client: CoOp on one client, a learned text context over a frozen CLIP, never shared."""

from __future__ import annotations

from fedapp.aggregation import Arrays
from fedapp.clients.text_prompt import PromptClient
from fedapp.methods import text_prompts as prompts
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder


class CoOpLocalClient(PromptClient):
    """CoOp on one client: its own context, trained alone and kept in its store."""

    def _own_context(self) -> PromptContext:
        saved = self.store.load("context")
        return self.context(None if saved is None else saved["context"], self.options.prompt_length)

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        context = self._own_context()
        result = self.train_model(self.classifier(context), int(config["server-round"]), data=self.features("train"))
        self.store.save("context", {"context": self.context_arrays(context)[0]})
        return [], result.num_examples, self.fit_metrics(result)

    def prompt_classifier(self, parameters: Arrays, encoder: PromptTextEncoder) -> prompts.PromptClassifier:
        return self.classifier(self._own_context(), encoder)
