"""pFedLoRA client: a personal heterogeneous CNN plus the shared low-rank adapter."""

from __future__ import annotations

from clients.base import FedAppClient
from fedapp.aggregation import Arrays
from fedapp.methods import pfedlora
from fedapp.params import get_arrays, set_arrays
from fedapp.training import evaluate


class PFedLoRAClient(FedAppClient):
    """Trains its own CNN with the frozen global adapter, then the adapter; uploads the adapter."""

    def _net(self, adapter_arrays: Arrays) -> pfedlora.ModelWithAdapter:
        model = self.load_personal_model()
        adapter = pfedlora.LowRankAdapter(
            model.feature_dim,
            self.config.adapter_hidden,
            self.data.num_classes,
            self.config.adapter_kind,
        )
        set_arrays(adapter, adapter_arrays)
        return pfedlora.ModelWithAdapter(model, adapter)

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        net = self._net(parameters)
        server_round = int(config["server-round"])
        result = pfedlora.train_round(
            net,
            self.config.mu,
            lambda module, loss_fn, params: self.train_model(module, server_round, loss_fn, params),
        )
        rounds = self.save_personal_model(net.model)
        metrics = self.fit_metrics(result.model_step, pfedlora.sample_flops(net, self.input_shape))
        metrics.update(adapter_loss=result.adapter_step.loss, personal_rounds=rounds)
        return get_arrays(net.adapter), result.model_step.num_examples, metrics

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        net = self._net(parameters)
        result = self.test_model(net.model)
        adapter = evaluate(net, self.data.test, device=self.device, forward=lambda n, x: n.adapter_logits(x))
        return result.loss, result.num_examples, {**self.eval_metrics(result), "adapter_accuracy": adapter.accuracy}
