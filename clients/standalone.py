"""Standalone client: its own model, trained alone, kept in its state store."""

from __future__ import annotations

from clients.base import FedAppClient
from fedapp.aggregation import Arrays


class StandaloneClient(FedAppClient):
    """Trains a personal model that never leaves the device."""

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self.load_personal_model()
        result = self.train_model(model, int(config["server-round"]))
        rounds = self.save_personal_model(model)
        return [], result.num_examples, {**self.fit_metrics(result, self.model_step_flops()), "personal_rounds": rounds}

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        result = self.test_model(self.load_personal_model())
        return result.loss, result.num_examples, self.eval_metrics(result)
