"""FedProto server: merges per-class prototypes of the 500-d representation."""

from __future__ import annotations

from fedapp.config import client_model_names
from fedapp.methods.per_class import require_same_feature_dim
from fedapp.strategies.per_class import PerClassStrategy


class FedProtoStrategy(PerClassStrategy):
    """Prototype aggregation (Tan et al., 2022)."""

    statistic_name = "prototypes"

    def statistic_dim(self) -> int:
        return require_same_feature_dim(client_model_names(self.config), self.num_classes, "fedproto")
