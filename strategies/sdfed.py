"""SDFed server: FedAvg of the fixed-length global prompt; local prompts never arrive."""

from __future__ import annotations

from fedapp.methods.sdfed_options import SDFedOptions
from fedapp.strategies.promptfl import PromptFLStrategy


class SDFedStrategy(PromptFLStrategy):
    """The server side of SDFed is PromptFL's: only G_s travels and is averaged.
    Subspace refinement and divergence control happen on the clients."""

    options: SDFedOptions

    has_global_model = False
