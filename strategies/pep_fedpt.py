"""PEP-FedPT server: FedAvg of the shared prompts, class prompts and head, plus
momentum-smoothed global class prototypes."""

from __future__ import annotations

import numpy as np
import torch

from fedapp.aggregation import Arrays, weighted_average
from fedapp.flower.strategy import ClientUpdate, FedAppStrategy
from fedapp.methods.per_class import merge_per_class
from fedapp.methods.visual_prompt_options import PEPFedPTOptions
from fedapp.methods.visual_prompts import build_visual_prompts
from fedapp.params import get_arrays


class PEPFedPTStrategy(FedAppStrategy):
    """Sends ``[*learner arrays, prototypes (classes, layers*width), present (classes,)]``;
    receives ``[*learner arrays, per-class CLS means (same shape), class counts (classes,)]``.

    The learner arrays (P_S, P_C, head) are averaged by examples; the prototypes
    move as ``mu <- beta * mu + (1 - beta) * pooled`` for classes some client held
    this round, and absent classes keep theirs.
    """

    options: PEPFedPTOptions

    has_global_model = True

    def initial_arrays(self) -> Arrays:
        learner = build_visual_prompts(self.config.values, self.num_classes)
        prototype_width = len(learner.class_layers) * learner.shape.width
        return [
            *get_arrays(learner),
            np.zeros((self.num_classes, prototype_width), np.float32),
            np.zeros(self.num_classes, np.float32),
        ]

    def global_array_names(self) -> list[str]:
        # Building draws initial weights: naming them must not move the run's random streams.
        with torch.random.fork_rng(devices=[]):
            learner = build_visual_prompts(self.config.values, self.num_classes)
        return [*learner.state_dict(), "class_prototypes", "class_present"]

    def expected_update(self) -> Arrays:
        return [*self._global[:-1], np.zeros(self.num_classes, np.int64)]

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> Arrays:
        k = len(self._global) - 2  # the learner's arrays come first, prototypes and mask last
        learner = weighted_average([(u.arrays[:k], u.num_examples) for u in updates])
        prototypes, present = merge_per_class(
            [(u.arrays[k], u.arrays[k + 1]) for u in updates],
            self._global[k],
            momentum=self.options.prototype_momentum,
            previous_present=self._global[k + 1],
        )
        return [*learner, prototypes, present]
