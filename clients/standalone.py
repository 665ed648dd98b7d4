"""Standalone client: its own model, trained alone, kept in its state store."""

from __future__ import annotations

from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clients.base import FedAppClient


class StandaloneClient(FedAppClient):
    """Trains a personal model that never leaves the device."""

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self.load_personal_model()
        result = self.train_model(model, int(config["server-round"]))
        rounds = self.save_personal_model(model)
        return [], result.num_examples, {**self.fit_metrics(result), "personal_rounds": rounds}

    def inference_module(self, parameters: Arrays) -> nn.Module:
        return self.load_personal_model()
