"""Model zoo and backbone loading: one factory, architectures described as data.

:func:`build_model` builds the client CNNs by name; :func:`load_open_clip`
loads frozen open_clip backbones. The names below are imported on first use: the
zoo's names (:data:`MODEL_NAMES`, from :mod:`fedapp.models.zoo_configs`) need no torch,
so the run configuration checks a model name without importing it, and open_clip is
imported only when a CLIP function is called.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fedapp.models.zoo_configs import CNN_CONFIGS, VGG_CONFIGS, CNNConfig, VGGConfig

if TYPE_CHECKING:
    from fedapp.models.clip import (
        TINY_CLIP,
        TINY_MODELS,
        TINY_VIT,
        TINY_VIT_B,
        LoadedClip,
        clear_clip_cache,
        load_open_clip,
        register_tiny_configs,
        text_context_length,
        text_token_width,
    )
    from fedapp.models.cnn import HeteroCNN, SmallVGG
    from fedapp.models.zoo import ZOO, build_model, count_parameters, seeded_model

__all__ = [
    "MODEL_NAMES",
    "TINY_CLIP",
    "TINY_MODELS",
    "TINY_VIT",
    "TINY_VIT_B",
    "ZOO",
    "CNNConfig",
    "HeteroCNN",
    "LoadedClip",
    "SmallVGG",
    "VGGConfig",
    "build_model",
    "clear_clip_cache",
    "count_parameters",
    "load_open_clip",
    "register_tiny_configs",
    "seeded_model",
    "text_context_length",
    "text_token_width",
]

MODEL_NAMES: tuple[str, ...] = (*CNN_CONFIGS, *VGG_CONFIGS)
"""Every zoo model's name, in :data:`~fedapp.models.zoo.ZOO`'s order (a test keeps them equal)."""

_LAZY = {
    **dict.fromkeys(("ZOO", "build_model", "count_parameters", "seeded_model"), "fedapp.models.zoo"),
    **dict.fromkeys(("HeteroCNN", "SmallVGG"), "fedapp.models.cnn"),
    **dict.fromkeys(
        (
            "TINY_CLIP",
            "TINY_MODELS",
            "TINY_VIT",
            "TINY_VIT_B",
            "LoadedClip",
            "clear_clip_cache",
            "load_open_clip",
            "register_tiny_configs",
            "text_context_length",
            "text_token_width",
        ),
        "fedapp.models.clip",
    ),
}


def __getattr__(name: str) -> Any:
    """The zoo's factory and the CLIP loaders, imported (with torch) on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_LAZY[name]), name)
