"""FedVPT, FedVPT-D and head-only FedAvg: FedAvg of visual prompts and a linear head
over a frozen ViT (which prompts is :mod:`fedapp.methods.visual_prompts`' table)."""

from __future__ import annotations

from torch import nn

from fedapp.methods.visual_prompts import build_visual_prompts
from fedapp.strategies.shared_module import SharedModuleStrategy


class FedVPTStrategy(SharedModuleStrategy):
    """Averages every trainable array (prompts and head): nothing stays on a client."""

    has_global_model = True

    def build_shared_module(self) -> nn.Module:
        return build_visual_prompts(self.config.values, self.num_classes)
