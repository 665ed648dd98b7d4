"""pFedLoRA server: averages the homogeneous low-rank adapter, nothing else."""

from __future__ import annotations

from torch import nn

from fedapp.config import client_model_names
from fedapp.methods.per_class import require_same_feature_dim
from fedapp.methods.pfedlora import LowRankAdapter
from fedapp.methods.pfedlora_options import PFedLoRAOptions
from fedapp.strategies.shared_module import SharedModuleStrategy


class PFedLoRAStrategy(SharedModuleStrategy):
    """FedAvg of the adapter that heterogeneous local CNNs share (Yi et al., pFedLoRA)."""

    options: PFedLoRAOptions

    has_global_model = False

    def build_shared_module(self) -> nn.Module:
        dim = require_same_feature_dim(client_model_names(self.config), self.num_classes, "pfedlora")
        options = self.options
        return LowRankAdapter(dim, options.adapter_hidden, self.num_classes, options.adapter_kind, options.adapter_init)
