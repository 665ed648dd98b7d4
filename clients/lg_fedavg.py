"""LG-FedAvg client: a personal representation under the federation's shared head."""

from __future__ import annotations

from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clients.base import FedAppClient
from fedapp.params import get_arrays, set_arrays


class LGFedAvgClient(FedAppClient):
    """Puts the global head on its own model, trains all of it, uploads the head."""

    def _model(self, head_arrays: Arrays) -> nn.Module:
        model = self.load_personal_model()
        set_arrays(model.head, head_arrays)
        return model

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self._model(parameters)
        result = self.train_model(model, int(config["server-round"]))
        self.save_personal_model(model)
        return get_arrays(model.head), result.num_examples, self.fit_metrics(result)

    def inference_module(self, parameters: Arrays) -> nn.Module:
        # The personal representation under the global head.
        return self._model(parameters)
