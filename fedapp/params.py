"""Moving a model's tensors to and from the flat list of numpy arrays that travels."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedapp.errors import FedAppError


class PayloadError(FedAppError, ValueError):
    """Received arrays do not fit the model they are meant for."""


def get_arrays(module: nn.Module) -> list[np.ndarray]:
    """The module's state (parameters and buffers) in ``state_dict`` order."""
    return [t.detach().cpu().numpy().copy() for t in module.state_dict().values()]


def set_arrays(module: nn.Module, arrays: list[np.ndarray]) -> None:
    """Load arrays produced by :func:`get_arrays` on a module of the same shape."""
    state = module.state_dict()
    if len(arrays) != len(state):
        raise PayloadError(f"expected {len(state)} arrays for {type(module).__name__}, got {len(arrays)}")
    new_state = {}
    for (name, current), array in zip(state.items(), arrays, strict=True):
        if current.ndim == 0 and array.size == 1:
            array = np.asarray(array).reshape(())  # stores that keep arrays as 1-d return scalars as (1,)
        if tuple(array.shape) != tuple(current.shape):
            raise PayloadError(f"array for '{name}' has shape {tuple(array.shape)}, expected {tuple(current.shape)}")
        new_state[name] = torch.as_tensor(array, dtype=current.dtype)
    module.load_state_dict(new_state)


def state_to_named_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's state as a name → array mapping (for the client state store)."""
    return {name: t.detach().cpu().numpy().copy() for name, t in module.state_dict().items()}


def named_arrays_to_state(module: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Inverse of :func:`state_to_named_arrays`."""
    state = module.state_dict()
    missing = sorted(set(state) - set(arrays))
    if missing:
        raise PayloadError(f"stored state lacks {missing[:3]}… for {type(module).__name__}")
    set_arrays(module, [arrays[name] for name in state])
