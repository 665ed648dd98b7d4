"""FD server: merges per-class mean logits."""

from __future__ import annotations

from fedapp.strategies.per_class import PerClassStrategy


class FDStrategy(PerClassStrategy):
    """Federated distillation (Jeong et al., 2018)."""

    statistic_name = "class_logits"

    def statistic_dim(self) -> int:
        return self.num_classes
