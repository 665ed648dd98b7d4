"""The visual-prompt methods' own configuration keys (:mod:`fedapp.methods.visual_prompts` and
:mod:`fedapp.methods.pep_fedpt` are their math).

Plain data, read by the configuration in every process: no torch here (PEP-FedPT's check reads
the vision tower's shape, imported only when it runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fedapp.errors import ConfigError
from fedapp.methods.text_prompt_options import PROMPT_LENGTH_HELP
from fedapp.options import MethodOptions, setting


@dataclass(frozen=True)
class VisualPromptOptions(MethodOptions):
    """The shared prompt's length, and how fast the prompts learn beside the head."""

    title: ClassVar[str] = "Visual prompts"
    about: ClassVar[str] = (
        "The visual-prompt methods (`head-fedavg`, `local-vpt`, `fedvpt`, `fedvpt-d`, `pep-fedpt`) train their "
        "prompts at `prompt-lr-scale` times `lr` and their head at `lr`: a prompt's gradient can be a hundredth "
        "of the head's. Their shared prompt has `prompt-length` tokens (at every layer it enters)."
    )

    prompt_length: int = setting(8, PROMPT_LENGTH_HELP, low=1)
    prompt_lr_scale: float = setting(
        1.0,
        "visual-prompt methods: the prompts' learning rate is lr times this (the head's is lr)",
        low=0.0,
        low_open=True,
    )


@dataclass(frozen=True)
class PEPFedPTOptions(VisualPromptOptions):
    """The class-specific prompts and their per-sample mixing."""

    title: ClassVar[str] = "PEP-FedPT"
    about: ClassVar[str] = (
        "See [PEP-FedPT](methods/pep-fedpt.md). Its class-prompt layers must lie within the vision tower's "
        "blocks, from 2."
    )

    class_prompt_layers: str = setting("5,6,7", "PEP-FedPT layers (from 1) with class-specific prompts, e.g. 5,6,7")
    class_prompt_length: int = setting(4, "PEP-FedPT tokens per class-specific prompt", low=1)
    ccmp_temperature: float = setting(0.1, "PEP-FedPT temperature tau of the prompt mixing", low=0.0, low_open=True)
    pep_mixer: Literal["ccmp", "oracle"] = setting(
        "ccmp",
        "PEP-FedPT mixing: the paper's per-sample mix (ccmp) or each sample's own label's prompt (oracle, an "
        "ablation that reads the labels in training and evaluation)",
    )
    prototype_momentum: float = setting(
        0.5, "PEP-FedPT momentum beta of the server's class prototypes", low=0.0, high=1.0
    )

    def check(self, values: Mapping[str, Any]) -> None:
        """``class-prompt-layers`` names blocks 2.. of the tower (after the configuration's check of it)."""
        from fedapp.methods.visual_prompts import parse_class_layers  # noqa: PLC0415 - open_clip, torch
        from fedapp.models.vpt import vision_tower_shape  # noqa: PLC0415

        layers = parse_class_layers(self.class_prompt_layers)
        shape = vision_tower_shape(values["clip-model"])
        bad = [layer for layer in layers if not 2 <= layer <= shape.layers]
        if bad:
            raise ConfigError(
                f"config key 'class-prompt-layers' = {self.class_prompt_layers!r}: layers {bad} are outside "
                f"2..{shape.layers} (the blocks of {values['clip-model']}; layer 1 has no image-dependent CLS to "
                "mix on)"
            )
