"""Moving a model's tensors to and from the flat list of numpy arrays that travels."""

from __future__ import annotations

import io

import numpy as np
import torch
from torch import nn

from fedapp.errors import FedAppError


class PayloadError(FedAppError, ValueError):
    """Received arrays do not fit the model they are meant for."""


def decode_ndarray(tensor: bytes) -> np.ndarray:
    """One ``.npy``-encoded array (as Flower's ``ndarray_to_bytes`` writes it), without copying.

    The result is a read-only view of ``tensor``: decoding a large update costs no
    memory and no time, where ``np.load`` copies every byte into a fresh array.
    Formats a view cannot serve (object arrays, unusual header versions) go
    through ``np.load``.
    """
    stream = io.BytesIO(tensor)
    version = np.lib.format.read_magic(stream)
    if version not in ((1, 0), (2, 0)):
        return np.load(io.BytesIO(tensor), allow_pickle=False)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran_order, dtype = read_header(stream)
    if dtype.hasobject:
        raise PayloadError("object arrays are not accepted in a payload")
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.frombuffer(tensor, dtype=dtype, count=count, offset=stream.tell())
    return flat.reshape(shape, order="F" if fortran_order else "C")


def decode_parameters(tensors: list[bytes]) -> list[np.ndarray]:
    """Flower ``Parameters.tensors`` as read-only array views (see :func:`decode_ndarray`)."""
    return [decode_ndarray(tensor) for tensor in tensors]


def get_arrays(module: nn.Module) -> list[np.ndarray]:
    """The module's state (parameters and buffers) in ``state_dict`` order."""
    return [t.detach().cpu().numpy().copy() for t in module.state_dict().values()]


def _tensor_like(name: str, current: torch.Tensor, array: np.ndarray, *, copy: bool = False) -> torch.Tensor:
    """``array`` as a tensor of ``current``'s shape and dtype (a fresh copy with ``copy``)."""
    if current.ndim == 0 and array.size == 1:
        array = np.asarray(array).reshape(())  # stores that keep arrays as 1-d return scalars as (1,)
    if tuple(array.shape) != tuple(current.shape):
        raise PayloadError(f"array for '{name}' has shape {tuple(array.shape)}, expected {tuple(current.shape)}")
    return torch.tensor(array, dtype=current.dtype) if copy else torch.as_tensor(array, dtype=current.dtype)


def set_arrays(module: nn.Module, arrays: list[np.ndarray]) -> None:
    """Load arrays produced by :func:`get_arrays` on a module of the same shape."""
    state = module.state_dict()
    if len(arrays) != len(state):
        raise PayloadError(f"expected {len(state)} arrays for {type(module).__name__}, got {len(arrays)}")
    module.load_state_dict(
        {name: _tensor_like(name, current, array) for (name, current), array in zip(state.items(), arrays, strict=True)}
    )


def state_to_named_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's state as a name → array mapping (for the client state store)."""
    return {name: t.detach().cpu().numpy().copy() for name, t in module.state_dict().items()}


def named_arrays_to_state(module: nn.Module, arrays: dict[str, np.ndarray], *, assign: bool = False) -> None:
    """Inverse of :func:`state_to_named_arrays`.

    With ``assign``, the module's tensors are replaced by copies of ``arrays`` instead of
    being written into: the way to fill a model built on the ``meta`` device
    (:func:`fedapp.models.seeded_model` with ``materialise=False``), which holds no
    weights to overwrite.
    """
    state = module.state_dict()
    missing = sorted(set(state) - set(arrays))
    if missing:
        raise PayloadError(f"stored state lacks {missing[:3]}… for {type(module).__name__}")
    if not assign:
        set_arrays(module, [arrays[name] for name in state])
        return
    module.load_state_dict(
        {name: _tensor_like(name, current, arrays[name], copy=True) for name, current in state.items()}, assign=True
    )
    unfilled = [name for name, tensor in [*module.named_parameters(), *module.named_buffers()] if tensor.is_meta]
    if unfilled:
        raise PayloadError(f"{type(module).__name__} keeps tensors outside its state: {unfilled[:3]}")
