"""A stand-in GPU on a CPU-only machine, that refuses what a real GPU refuses: mixing devices.

CI has no GPU, yet the commonest GPU bug is CPU-only code's blind spot: a tensor made
on the CPU (``torch.zeros(...)`` without ``device=``) meeting a model on the GPU. On
the CPU both are CPU tensors and nothing fails. :func:`fake_accelerator` makes the
difference visible: inside it ``torch.cuda.is_available()`` is true, and a tensor
moved or created ``"cuda"`` is a CPU tensor *marked* as being on the accelerator
(its ``.device`` says ``cuda:0``). Every torch call goes through a
:class:`~torch.overrides.TorchFunctionMode` that propagates the mark to results and
raises :class:`DeviceMixError` where CUDA raises "Expected all tensors to be on the
same device": an op that combines a marked tensor with an unmarked one of one or more
dimensions (unmarked 0-d tensors are CPU scalars, which CUDA accepts; index tensors
of ``t[idx]`` may live on the CPU too). ``.numpy()`` of a marked tensor raises, as it
does for a CUDA tensor.

What it catches: any tensor our code (or a library, through torch's Python API)
creates without the model's device and feeds to the model, a loss or an optimiser;
inputs not moved to the model's device; ``.numpy()`` without ``.cpu()``.
What it cannot catch: kernels, memory and speed (nothing runs on a GPU); CUDA-only
behaviour (streams, non-blocking copies read too early, ``torch.cuda`` calls other
than the ones stood in here, autocast on ``cuda``); a CPU tensor written into a GPU
tensor's advanced index (``t[idx] = cpu_values``: let through, as CUDA lets a slice
assignment through, though it may refuse advanced indexing); mixing inside C++ code that
never returns to Python (the autograd engine's own buffers are not checked, but the
gradients it leaves on marked parameters are marked).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

FAKE = torch.device("cuda", 0)
_MARK = "_fedapp_on_fake_accelerator"


class DeviceMixError(RuntimeError):
    """An op mixed a tensor on the (fake) accelerator with one on the CPU."""


def on_accelerator(tensor: Tensor) -> bool:
    """Whether ``tensor`` is (marked as) on the fake accelerator."""
    return bool(tensor.__dict__.get(_MARK, False)) if isinstance(tensor, Tensor) else False


def _mark(value: Any, flag: bool = True) -> Any:
    for tensor in _tensors(value):
        tensor.__dict__[_MARK] = flag
    return value


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _is_accelerator(device: Any) -> bool:
    if isinstance(device, Tensor):
        return on_accelerator(device)
    return device is not None and torch.device(device).type == "cuda"


def _target_device(args: tuple, kwargs: dict) -> tuple[Any, bool]:
    """``Tensor.to``'s device argument (None when not given) and whether it is the accelerator."""
    if "device" in kwargs:
        return kwargs["device"], _is_accelerator(kwargs["device"])
    for arg in args[1:]:
        if isinstance(arg, Tensor):
            return arg, on_accelerator(arg)
        if isinstance(arg, str | torch.device | int) and not isinstance(arg, bool):
            return arg, _is_accelerator(arg)
    return None, False


# Ops whose tensors may legitimately sit on different devices.
_CROSS_DEVICE = {
    Tensor.copy_,
    Tensor.__getitem__,
    Tensor.__setitem__,
    Tensor.index_put_,
    torch._has_compatible_shallow_copy_type,  # nn.Module.to asks it of the tensor before and after a move
}


class _FakeAcceleratorMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        special = self._special(func, args, kwargs)
        if special is not _NOT_SPECIAL:
            return special
        device = kwargs.get("device")
        if device is not None and not isinstance(device, Tensor) and func is not torch._C._nn._parse_to:
            # A factory (torch.zeros(..., device=...)): made where it was asked.
            if _is_accelerator(device):
                kwargs["device"] = "cpu"
                return _mark(func(*args, **kwargs))
            return func(*args, **kwargs)
        tensors = _tensors((args, kwargs))
        marked = [t for t in tensors if on_accelerator(t)]
        if marked and func not in _CROSS_DEVICE:
            stray = [t for t in tensors if not on_accelerator(t) and t.dim() > 0 and not t.is_meta]
            if stray:
                raise DeviceMixError(
                    f"{getattr(func, '__qualname__', func)} mixes devices: tensors on {FAKE} "
                    f"{[tuple(t.shape) for t in marked]} and on the CPU {[tuple(t.shape) for t in stray]}"
                )
        out = func(*args, **kwargs)
        if marked:
            ins = {id(t) for t in tensors if not on_accelerator(t)}
            _mark([t for t in _tensors(out) if id(t) not in ins])
        return out

    def _special(self, func, args: tuple, kwargs: dict) -> Any:
        if _accessor(func, "device", "__get__"):
            return FAKE if on_accelerator(args[0]) else func(*args)
        if _accessor(func, "is_cuda", "__get__"):
            return on_accelerator(args[0])
        if func is Tensor.get_device:
            return 0 if on_accelerator(args[0]) else func(*args)
        if func is Tensor.to:
            device, to_accelerator = _target_device(args, kwargs)
            if device is None:  # a dtype change stays where it is
                return _mark(func(*args, **kwargs), on_accelerator(args[0]))
            real = device.device if isinstance(device, Tensor) else torch.device(device)
            if not to_accelerator and (real.type != "cpu" or not on_accelerator(args[0])):
                return func(*args, **kwargs)  # CPU to CPU, or to another real device (meta)
            rest = [a for a in args[1:] if not isinstance(a, str | torch.device | int | Tensor) or isinstance(a, bool)]
            kwargs = {k: v for k, v in kwargs.items() if k != "device"}
            if isinstance(device, Tensor):
                kwargs.setdefault("dtype", device.dtype)
            # Always a new tensor, so that the mark never lands on the tensor it was moved from.
            moved = args[0].to("cpu", *rest, **{**kwargs, "copy": True})
            return _mark(moved, to_accelerator)
        if func is Tensor.cuda:
            return _mark(args[0].to("cpu", copy=True), True)
        if func is Tensor.cpu:
            return _mark(args[0].to("cpu", copy=True), False) if on_accelerator(args[0]) else func(*args, **kwargs)
        if func is Tensor.numpy and on_accelerator(args[0]):
            raise DeviceMixError(f"can't convert {FAKE} device type tensor to numpy; use Tensor.cpu() first")
        if _accessor(func, "data", "__set__"):
            func(*args)
            _mark(args[0], on_accelerator(args[1]))
            return None
        if _accessor(func, "grad", "__get__"):
            grad = func(*args)
            return grad if grad is None else _mark(grad, on_accelerator(args[0]) or on_accelerator(grad))
        return _NOT_SPECIAL


_NOT_SPECIAL = object()


def _accessor(func: Any, attribute: str, method: str) -> bool:
    """Whether ``func`` is ``Tensor.<attribute>.<method>`` (a fresh method-wrapper at every access)."""
    descriptor = getattr(func, "__self__", None)
    return (
        isinstance(descriptor, types.GetSetDescriptorType | property)
        and getattr(descriptor, "__name__", getattr(getattr(descriptor, "fget", None), "__name__", None)) == attribute
        and getattr(func, "__name__", None) == method
    )


@contextlib.contextmanager
def fake_accelerator(monkeypatch) -> Iterator[torch.device]:
    """Inside the block ``torch.device("cuda")`` is the stand-in; yields it.

    ``monkeypatch`` (pytest's) stands in the ``torch.cuda`` calls made before a tensor
    is touched: availability, the device's name, the RNG state ``torch.random.fork_rng``
    saves and restores, and ``torch.optim``'s check for a CUDA graph being captured.
    """
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake accelerator (CPU)")
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.zeros(0, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": None)
    # torch.optim's optimisers ask the accelerator's stream whether a CUDA graph is being captured.
    monkeypatch.setattr(torch.optim.Optimizer, "_accelerator_graph_capture_health_check", lambda self: None)
    make_parameter = nn.Parameter.__new__

    def parameter(cls, data=None, requires_grad=True):
        # Parameter(t) wraps t's storage in a new object: it is where t is.
        return _mark(make_parameter(cls, data, requires_grad), data is not None and on_accelerator(data))

    monkeypatch.setattr(nn.Parameter, "__new__", parameter)
    with _FakeAcceleratorMode():
        yield FAKE
