"""FedAvg client: train the received global model, send all of it back."""

from __future__ import annotations

from clients.base import FedAppClient
from fedapp.aggregation import Arrays
from fedapp.params import get_arrays, set_arrays


class FedAvgClient(FedAppClient):
    """Trains the global model on local data; keeps no personal state."""

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self.new_model()
        set_arrays(model, parameters)
        result = self.train_model(model, int(config["server-round"]))
        return get_arrays(model), result.num_examples, self.fit_metrics(result, self.model_step_flops())

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        model = self.new_model()
        set_arrays(model, parameters)
        result = self.test_model(model)
        return result.loss, result.num_examples, self.eval_metrics(result)
