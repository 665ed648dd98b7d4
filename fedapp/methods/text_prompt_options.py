"""The text-prompt methods' own configuration key: the shared prompt's length
(:mod:`fedapp.methods.text_prompts` is their math).

Plain data, read by the configuration in every process: no torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedapp.options import MethodOptions, setting

PROMPT_LENGTH_HELP = "length of the shared prompt: its text tokens, or its tokens per prompted layer of a ViT"


@dataclass(frozen=True)
class TextPromptOptions(MethodOptions):
    """The learned text context every client of CoOp, PromptFL and SDFed reads before a class name."""

    title: ClassVar[str] = "Text prompts"
    about: ClassVar[str] = (
        "The text-prompt methods (`coop-local`, `promptfl`, `sdfed`) learn a context of `prompt-length` tokens "
        "before each class name. A text prompt that does not fit the model's text context (start, prompt, class "
        "name, end) is refused."
    )

    prompt_length: int = setting(8, PROMPT_LENGTH_HELP, low=1)

    def text_prompt_lengths(self, values: Mapping[str, Any]) -> list[tuple[str, list[int]]]:
        return [(f"config key 'prompt-length' = {self.prompt_length!r}", [self.prompt_length])]
