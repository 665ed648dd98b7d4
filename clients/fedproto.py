"""FedProto client: per-class prototypes of the representation, and a prototype regulariser."""

from __future__ import annotations

from fedapp.aggregation import Arrays
from fedapp.clients.per_class import PerClassClient
from fedapp.methods import fedproto
from fedapp.methods.distillation_options import FedProtoOptions
from fedapp.training import LossFn


class FedProtoClient(PerClassClient):
    """FedProto: CE plus distance to the global class prototypes."""

    options: FedProtoOptions

    statistic = staticmethod(fedproto.representation)

    def loss(self, global_stats: Arrays) -> LossFn:
        return fedproto.prototype_loss(global_stats[0], global_stats[1], self.options.proto_weight)
