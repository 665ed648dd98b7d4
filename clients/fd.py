"""FD client: per-class mean logits, and distillation towards the global ones."""

from __future__ import annotations

from fedapp.aggregation import Arrays
from fedapp.clients.per_class import PerClassClient
from fedapp.methods import fd
from fedapp.methods.distillation_options import FDOptions
from fedapp.training import LossFn


class FDClient(PerClassClient):
    """FD: CE plus distillation towards the global per-class logits."""

    options: FDOptions

    statistic = staticmethod(fd.logits)

    def loss(self, global_stats: Arrays) -> LossFn:
        return fd.fd_loss(global_stats[0], global_stats[1], self.options.kd_weight, self.options.kd_temperature)
