"""Which prompts each visual-prompt method trains, as one table.

============  =========================  ========================
method        shared slot written at     class-specific prompts
============  =========================  ========================
head-fedavg   nowhere (head only)        none
local-vpt     layer 1 (shallow)          none
fedvpt        layer 1 (shallow)          none
fedvpt-d      every layer (deep)         none
pep-fedpt     layer 1 (P_S)              ``class-prompt-layers``
============  =========================  ========================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedapp.errors import ConfigError
from fedapp.models.vpt import VisionTowerShape, VisualPrompts, vision_tower_shape


def prompt_layers(method: str, shape: VisionTowerShape) -> tuple[int, ...]:
    """Layers (from 1) that write the shared prompt slot for ``method``."""
    if method == "head-fedavg":
        return ()
    if method == "fedvpt-d":
        return tuple(range(1, shape.layers + 1))
    return (1,)


def build_visual_prompts(values: Mapping[str, Any], num_classes: int) -> VisualPrompts:
    """The trainable prompts and head of a run's method, from the run configuration's ``values``
    (by config name: ``method``, ``clip-model``, ``prompt-length``, ``seed`` and PEP-FedPT's
    ``class-prompt-layers`` and ``class-prompt-length``), initialised from its seed (server
    and clients build identical ones without loading the backbone)."""
    method = values["method"]
    shape = vision_tower_shape(values["clip-model"])
    class_layers = parse_class_layers(values["class-prompt-layers"]) if method == "pep-fedpt" else ()
    return VisualPrompts(
        shape,
        num_classes,
        prompt_layers=prompt_layers(method, shape),
        prompt_length=values["prompt-length"],
        class_layers=class_layers,
        class_length=values["class-prompt-length"] if class_layers else 0,
        seed=values["seed"],
    )


def parse_class_layers(text: str) -> tuple[int, ...]:
    """``"5,6,7"`` → ``(5, 6, 7)``; a ConfigError names a bad entry."""
    layers = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit():
            raise ConfigError(f"config key 'class-prompt-layers' = {text!r}: {item!r} is not a layer number")
        layers.append(int(item))
    if not layers:
        raise ConfigError(f"config key 'class-prompt-layers' = {text!r} names no layer")
    return tuple(sorted(set(layers)))
