"""FedPer client: the federation's base layers under this client's own head."""

from __future__ import annotations

from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clients.base import FedAppClient
from fedapp.params import get_arrays, set_arrays
from fedapp_fedper.base_layers import BaseLayers
from fedapp_fedper.options import FedPerOptions


class FedPerClient(FedAppClient):
    """Loads the global base layers into its personal model, trains all of it, uploads the base."""

    options: FedPerOptions

    def base_layers(self, model: nn.Module) -> BaseLayers:
        return BaseLayers(model, self.options.fedper_personal_layers)

    def _model(self, base_arrays: Arrays) -> nn.Module:
        model = self.load_personal_model()
        set_arrays(self.base_layers(model), base_arrays)
        return model

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self._model(parameters)
        result = self.train_model(model, int(config["server-round"]))
        self.save_personal_model(model)
        return get_arrays(self.base_layers(model)), result.num_examples, self.fit_metrics(result)

    def inference_module(self, parameters: Arrays) -> nn.Module:
        return self._model(parameters)
