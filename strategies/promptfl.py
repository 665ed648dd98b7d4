"""PromptFL server: FedAvg of one shared text prompt (context vectors)."""

from __future__ import annotations

from torch import nn

from fedapp.config import client_clip_model_names
from fedapp.methods.text_prompt_options import TextPromptOptions
from fedapp.methods.text_prompts import require_same_token_width
from fedapp.models import text_token_width
from fedapp.models.text_prompt import PromptContext
from fedapp.strategies.shared_module import SharedModuleStrategy


class PromptFLStrategy(SharedModuleStrategy):
    """Averages the shared context; clients with other backbones may join while
    their text token widths match (a mismatch is refused before round 1)."""

    options: TextPromptOptions

    has_global_model = True

    def build_shared_module(self) -> nn.Module:
        names = client_clip_model_names(self.config)
        width = require_same_token_width(names, [text_token_width(name) for name in names])
        return PromptContext(self.options.prompt_length, width, generator=self.config.seed)
