"""Clients that learn mutually with a shared small model: FML and FedKD."""

from __future__ import annotations

from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clients.base import FedAppClient
from fedapp.methods import mutual
from fedapp.methods.distillation_options import MutualOptions
from fedapp.params import get_arrays, set_arrays
from fedapp.training import EvalResult, LossFn


class MutualClient(FedAppClient):
    """Trains its private model and the received shared model together; uploads the shared one."""

    options: MutualOptions

    def loss(self) -> LossFn:
        raise NotImplementedError

    def _shared(self, shared_arrays: Arrays) -> nn.Module:
        shared = self.new_model(self.options.shared_model)
        set_arrays(shared, shared_arrays)
        return shared

    def _pair(self, shared_arrays: Arrays) -> mutual.MutualPair:
        shared = self._shared(shared_arrays)
        return mutual.MutualPair(self.load_personal_model(), shared)

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        pair = self._pair(parameters)
        result = self.train_model(pair, int(config["server-round"]), self.loss())
        self.save_personal_model(pair.local)
        return get_arrays(pair.shared), result.num_examples, self.fit_metrics(result)

    def inference_module(self, parameters: Arrays) -> nn.Module:
        # The private model is what the client predicts with; the shared one is scored beside it.
        return self.load_personal_model()

    def score(self, module: nn.Module, parameters: Arrays, split: str = "test") -> tuple[EvalResult, dict[str, float]]:
        data = self.data.splits[split].tensors
        result = self.test_model(module, data)
        shared = self.test_model(self._shared(parameters), data)
        return result, {"shared_accuracy": shared.accuracy}
