"""FedAvg client: train the received global model, send all of it back."""

from __future__ import annotations

from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clients.base import FedAppClient
from fedapp.params import get_arrays, set_arrays


class FedAvgClient(FedAppClient):
    """Trains the global model on local data; keeps no personal state."""

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self.new_model()
        set_arrays(model, parameters)
        result = self.train_model(model, int(config["server-round"]))
        return get_arrays(model), result.num_examples, self.fit_metrics(result)

    def inference_module(self, parameters: Arrays) -> nn.Module:
        model = self.new_model()
        set_arrays(model, parameters)
        return model
