"""The model zoo's one factory: every CNN by name (:data:`ZOO`), built or copied from a seeded template."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from fedapp.errors import ModelError
from fedapp.models.cnn import HeteroCNN, SmallVGG
from fedapp.models.zoo_configs import CNN_CONFIGS, VGG_CONFIGS

__all__ = ["MODEL_NAMES", "ZOO", "build_model", "count_parameters", "seeded_model"]

ZOO: dict[str, Callable[..., nn.Module]] = {
    **{name: partial(HeteroCNN, cfg) for name, cfg in CNN_CONFIGS.items()},
    **{name: partial(SmallVGG, cfg) for name, cfg in VGG_CONFIGS.items()},
}
"""Name -> constructor ``(num_classes, *, image_size, in_channels) -> nn.Module``."""

MODEL_NAMES: tuple[str, ...] = tuple(ZOO)


def build_model(
    name: str,
    num_classes: int,
    *,
    image_size: int = 32,
    in_channels: int = 3,
) -> nn.Module:
    """Build a zoo model by name.

    Weights use torch's default initialisation; seed torch beforehand for a
    reproducible model.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES` (case-insensitive).
    num_classes : int
        Output width of the model's ``head``.
    image_size : int, default 32
        Side of the square input images.
    in_channels : int, default 3
        Channels of the input images.

    Returns
    -------
    nn.Module
        A model with ``features(x)``, ``head``, ``feature_dim`` and
        ``forward(x) == head(features(x))``.

    Raises
    ------
    ModelError
        If ``name`` is unknown or a size is invalid for that architecture.
    """
    key = name.strip().lower() if isinstance(name, str) else ""
    if key not in ZOO:
        raise ModelError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}")
    return ZOO[key](num_classes, image_size=image_size, in_channels=in_channels)


def seeded_model(
    name: str, num_classes: int, *, seed: int, image_size: int = 32, in_channels: int = 3, materialise: bool = True
) -> nn.Module:
    """What ``torch.manual_seed(seed)`` then :func:`build_model` returns, without the initialisation cost.

    Clients build their model for every message (a simulation worker serves many
    clients) and then overwrite it with received or stored weights, so random
    initialisation used to be a large share of a round. The first call per
    process builds a template; later calls copy it and leave torch's RNG exactly
    where building would have, so results do not change.

    Parameters
    ----------
    name, num_classes, image_size, in_channels
        As in :func:`build_model`.
    seed : int
        The seed set before building.
    materialise : bool, default True
        False returns the model on the ``meta`` device: its structure without weights,
        for a caller about to assign stored ones
        (:func:`fedapp.params.named_arrays_to_state` with ``assign=True``), which then
        neither copies the template's weights nor overwrites them.

    Returns
    -------
    nn.Module
        A new model, owned by the caller.
    """
    template, rng_after = _seeded_template(name, num_classes, seed, image_size, in_channels)
    torch.manual_seed(seed)  # also seeds CUDA, as before; building on the CPU does not touch it
    torch.set_rng_state(rng_after)
    if not materialise:
        return copy.deepcopy(_meta_template(name, num_classes, seed, image_size, in_channels))
    return copy.deepcopy(template)


@functools.lru_cache(maxsize=16)
def _seeded_template(
    name: str, num_classes: int, seed: int, image_size: int, in_channels: int
) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = build_model(name, num_classes, image_size=image_size, in_channels=in_channels)
    return model, torch.get_rng_state()


@functools.lru_cache(maxsize=16)
def _meta_template(name: str, num_classes: int, seed: int, image_size: int, in_channels: int) -> nn.Module:
    template, _ = _seeded_template(name, num_classes, seed, image_size, in_channels)
    return copy.deepcopy(template).to("meta")


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Count a module's parameters (shared tensors once).

    Parameters
    ----------
    module : nn.Module
        The module to count.
    trainable_only : bool, default False
        Count only parameters with ``requires_grad``.

    Returns
    -------
    int
        Total number of scalar parameters.
    """
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
