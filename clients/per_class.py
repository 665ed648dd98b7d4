"""Clients that share per-class statistics: FedProto (prototypes) and FD (mean logits)."""

from __future__ import annotations

from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clients.base import FedAppClient
from fedapp.flops import forward_flops
from fedapp.methods.per_class import per_class_means
from fedapp.training import LossFn


class PerClassClient(FedAppClient):
    """Trains its own model with a method's regulariser towards the global statistics,
    then uploads its own per-class means and counts (never the model)."""

    def loss(self, global_stats: Arrays) -> LossFn:
        raise NotImplementedError

    @staticmethod
    def statistic(model, x):
        raise NotImplementedError

    def round_loss(self, global_stats: Arrays) -> LossFn:
        """This round's loss (the method's, unless a subclass warms up first)."""
        return self.loss(global_stats)

    def round_figures(self, model: nn.Module, global_stats: Arrays) -> dict[str, float]:
        """The method's own figures of the round, from the trained model (default: none)."""
        return {}

    def round_epochs(self) -> int | None:
        """This round's local epochs (None: ``local-epochs``)."""
        return None

    def fit(self, parameters: Arrays, config: dict) -> tuple[Arrays, int, dict]:
        model = self.load_personal_model()
        epochs = self.round_epochs()
        loss = self.round_loss(parameters)
        result = self.train_model(model, int(config["server-round"]), loss, epochs=epochs)
        self.save_personal_model(model)
        means, counts = per_class_means(
            model, lambda m, x, _y: self.statistic(m, x), self.data.train, self.data.num_classes, device=self.device
        )
        # Training plus one forward pass over the data for the statistics.
        statistics = forward_flops(model, self.input_shape) * len(self.data.train)
        figures = self.round_figures(model, parameters)
        return [means, counts], result.num_examples, {**self.fit_metrics(result, statistics), **figures}

    def inference_module(self, parameters: Arrays) -> nn.Module:
        return self.load_personal_model()
