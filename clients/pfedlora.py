"""pFedLoRA client: a personal heterogeneous CNN plus the shared low-rank adapter."""

from __future__ import annotations

from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clients.base import FedAppClient
from fedapp.methods import pfedlora
from fedapp.methods.pfedlora_options import PFedLoRAOptions
from fedapp.params import get_arrays, set_arrays
from fedapp.training import EvalResult, evaluate


class PFedLoRAClient(FedAppClient):
    """Trains its own CNN with the frozen global adapter, then the adapter; uploads the adapter."""

    options: PFedLoRAOptions

    def _net(self, adapter_arrays: Arrays, model: nn.Module | None = None) -> pfedlora.ModelWithAdapter:
        model = self.load_personal_model() if model is None else model
        adapter = pfedlora.LowRankAdapter(
            model.feature_dim,
            self.options.adapter_hidden,
            self.data.num_classes,
            self.options.adapter_kind,
        )
        set_arrays(adapter, adapter_arrays)
        return pfedlora.ModelWithAdapter(model, adapter)

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        net = self._net(parameters)
        server_round = int(config["server-round"])
        result = pfedlora.train_round(
            net,
            self.options.mu,
            lambda module, loss_fn, params: self.train_model(module, server_round, loss_fn, params),
        )
        rounds = self.save_personal_model(net.model)
        metrics = self.fit_metrics(result.model_step, result.adapter_step.flops)
        metrics.update(adapter_loss=result.adapter_step.loss, personal_rounds=rounds)
        return get_arrays(net.adapter), result.model_step.num_examples, metrics

    def inference_module(self, parameters: Arrays) -> nn.Module:
        # `head`: the personal model alone is scored and exported; the other readings need the adapter too.
        if self.options.pfedlora_inference == "head":
            return self.load_personal_model()
        return pfedlora.PFedLoRAPredictor(self._net(parameters), self.options.pfedlora_inference, self.options.mu)

    def score(self, module: nn.Module, parameters: Arrays, split: str = "test") -> tuple[EvalResult, dict[str, float]]:
        """The configured reading's result, and every reading's accuracy beside it, every round."""
        net = module.net if isinstance(module, pfedlora.PFedLoRAPredictor) else self._net(parameters, module)
        results = {
            reading: evaluate(
                pfedlora.PFedLoRAPredictor(net, reading, self.options.mu),
                self.data.splits[split].tensors,
                device=self.device,
            )
            for reading in pfedlora.INFERENCE_READINGS
        }
        extra = {f"{reading}_accuracy": result.accuracy for reading, result in results.items()}
        return results[self.options.pfedlora_inference], extra
