"""Merging per-class statistics (prototypes, mean logits) weighted by class counts."""

from __future__ import annotations

import functools

import numpy as np

from fedapp.aggregation import Arrays
from fedapp.flower.strategy import ClientUpdate, FedAppStrategy
from fedapp.methods.per_class import merge_per_class


class PerClassStrategy(FedAppStrategy):
    """Clients upload ``[means (classes, dim), counts (classes,)]``; the server sends
    ``[merged means, presence mask]``. Classes nobody held this round keep their
    previous value."""

    has_global_model = False
    #: Name of the merged statistic in the exported ``models/global.safetensors``.
    statistic_name = "class_means"

    def global_array_names(self) -> list[str]:
        return [self.statistic_name, "class_present"]

    def statistic_dim(self) -> int:
        """Width of one class's statistic."""
        raise NotImplementedError

    @functools.cached_property
    def _dim(self) -> int:
        return self.statistic_dim()

    def initial_arrays(self) -> Arrays:
        return [np.zeros((self.num_classes, self._dim), np.float32), np.zeros(self.num_classes, np.float32)]

    def expected_update(self) -> Arrays:
        return [np.zeros((self.num_classes, self._dim), np.float32), np.zeros(self.num_classes, np.int64)]

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> Arrays:
        previous = self._global[0] if self._global else None
        merged, present = merge_per_class([(u.arrays[0], u.arrays[1]) for u in updates], previous)
        return [merged, present]
