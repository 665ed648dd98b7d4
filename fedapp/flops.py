"""FLOPs of training and inference, counted by torch's own counter on the meta device.

Every method's count comes from here: :func:`training_flops` is called by the
shared training loop (:func:`fedapp.training.train`), so a method's figure is
what its loss and its trainable parameters make torch compute, forward and
backward, with no formula per method.

How: the computation runs once under :class:`torch.utils.flop_counter.FlopCounterMode`
with every tensor it touches stood in by a ``meta`` tensor of the same shape,
dtype and ``requires_grad`` (parameters, buffers, inputs, and tensors a loss
captured, such as global prototypes or a teacher's logits). Nothing is computed
or allocated, the model's own tensors and gradients are not touched, and where
the model lives (CPU or GPU) does not matter. Counts are cached by the
architecture's signature (module structure, shapes, dtypes, which parameters
train, the loss, the batch size) in the process and in the cache folder, so a
worker, or a SuperNode's ClientApp processes, count once per architecture.

What is counted is what ``FlopCounterMode`` counts: matrix products (linear
layers, attention's ``QK^T`` and ``AV`` through ``scaled_dot_product_attention``
or plain ``bmm``/``matmul``) and convolutions, forward and backward, two FLOPs per
multiply-accumulate. Element-wise ops, norms, softmax and the optimiser's update
are left out (a few percent of a CNN's or ViT's step). The backward is the one
autograd runs: a frozen layer that gradients cross costs its input gradient, a
frozen layer they do not reach costs nothing, and the first layer computes no
input gradient. The hand-written ``3 x forward`` rule this replaced charged that
input gradient too (cnn-1: 28.95 MFLOPs a sample-step against 27.07 counted).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from fedapp.data.arrays import resolve_cache_dir, write_atomically

log = logging.getLogger("flwr.fedapp")

_LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]

_CACHE_SIZE = 256
_FORMAT = 1  # of the disk cache's entries: bump when what a count covers changes
_step_cache: OrderedDict[str, int] = OrderedDict()  # architecture digest -> FLOPs


class _MetaStandIns(TorchFunctionMode):
    """Every tensor an op receives is replaced by a meta tensor of its shape and dtype.

    A leaf that requires a gradient (a trainable parameter) becomes a meta leaf that
    requires one, the same one each time it is used, so autograd builds the same graph
    as on the real device; any other tensor becomes a detached meta constant.
    """

    def __init__(self) -> None:
        super().__init__()
        self._stand_ins: dict[int, tuple[Tensor, Tensor]] = {}  # id -> (original kept alive, stand-in)

    def _meta(self, value: Any) -> Any:
        if isinstance(value, Tensor):
            if value.is_meta:
                return value
            known = self._stand_ins.get(id(value))
            if known is None:
                stand_in = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
                if value.requires_grad and value.is_leaf:
                    stand_in.requires_grad_(True)
                known = self._stand_ins[id(value)] = (value, stand_in)
            return known[1]
        if isinstance(value, tuple):
            items = [self._meta(item) for item in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # namedtuple, Size
        if isinstance(value, list):
            return [self._meta(item) for item in value]
        if isinstance(value, dict):
            return {key: self._meta(item) for key, item in value.items()}
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*self._meta(args), **self._meta(kwargs or {}))


class _CountFlops(TorchDispatchMode):
    """``FlopCounterMode``'s count (its own per-op formulas, ``flop_registry``) of every aten op
    that runs, the backward's included, without its per-module breakdown."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


# torch wraps every dispatch mode's __torch_dispatch__ in torch._disable_dynamo, whose first call
# imports torch._dynamo: 1.2 s of every deployed ClientApp process (a new one per message). Meta
# tensors are never compiled, so the guard is taken off (tests/integration/test_edge_imports.py).
_CountFlops.__torch_dispatch__ = getattr(_CountFlops.__torch_dispatch__, "__wrapped__", _CountFlops.__torch_dispatch__)


def count_flops(run: Callable[[], object]) -> int:
    """FLOPs of what ``run()`` computes with torch, counted on meta stand-ins of its tensors.

    ``run`` may build and combine tensors freely, call ``backward()`` and read shapes;
    it may not read values (``.item()``, ``.tolist()``, data-dependent shapes), which
    meta tensors do not have.
    """
    counter = _CountFlops()
    with _MetaStandIns(), counter:
        run()
    return counter.total


def forward_flops(module: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one forward pass of ``module`` on one sample of ``input_shape`` (the input in
    the dtype of the module's first floating parameter), counted once per architecture."""
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.get_default_dtype())
    sample = torch.empty((1, *input_shape), dtype=dtype, device="meta")

    def count() -> int:
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                return count_flops(lambda: module(sample))
        finally:
            module.train(was_training)

    return _kept(_architecture(module, "forward", sample, None), count)


def training_step_flops(model: nn.Module, loss_fn: _LossFn, x: Tensor, y: Tensor) -> int:
    """FLOPs of one step of the shared loop on the batch ``(x, y)``: ``loss_fn``'s forward
    and autograd's backward, into whichever parameters require a gradient now."""

    def step() -> None:
        loss = loss_fn(model, x, y)
        if loss.requires_grad:
            loss.backward()

    return count_flops(step)


def _architecture(model: nn.Module, what: str, x: Tensor, y: Tensor | None) -> str:
    """What a count depends on (structure, shapes, dtypes, what trains, the loss or ``forward``,
    the batch, torch's formulas), as a digest that is the same in every process."""
    tensors = [
        (name, tuple(t.shape), str(t.dtype), t.requires_grad)
        for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    ]
    batch = (tuple(x.shape), str(x.dtype), None if y is None else tuple(y.shape), model.training)
    described = repr((_FORMAT, torch.__version__, type(model).__qualname__, repr(model), tensors, what, batch))
    return hashlib.sha256(described.encode()).hexdigest()


def cached_step_flops(model: nn.Module, loss_fn: _LossFn, x: Tensor, y: Tensor) -> int:
    """:func:`training_step_flops`, counted once per architecture and batch shape."""
    loss = getattr(loss_fn, "__qualname__", type(loss_fn).__qualname__)
    return _kept(_architecture(model, loss, x, y), lambda: training_step_flops(model, loss_fn, x, y))


def _kept(key: str, count: Callable[[], int]) -> int:
    """``count()``, kept in the process and in the cache folder (``FEDAPP_CACHE_DIR``, else
    ``~/.cache/fedapp``): a deployed ClientApp, a new process for every message, counts on its
    first message only (a count runs torch's meta kernels, whose first use imports
    ``torch._dynamo``: about 0.9 s)."""
    flops = _step_cache.get(key)
    if flops is not None:
        _step_cache.move_to_end(key)
        return flops
    entry = resolve_cache_dir() / "flops" / f"{key}.json"
    flops = _read_count(entry)
    if flops is None:
        flops = count()
        _write_count(entry, flops)
    _step_cache[key] = flops
    if len(_step_cache) > _CACHE_SIZE:
        _step_cache.popitem(last=False)
    return flops


def _read_count(path: Path) -> int | None:
    try:
        value = json.loads(path.read_text())["flops"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: counted again
    return value if isinstance(value, int) and value >= 0 else None


def _write_count(path: Path, flops: int) -> None:
    with contextlib.suppress(OSError):  # a read-only cache: counted again by the next process, nothing lost
        write_atomically(path, lambda handle: handle.write(json.dumps({"flops": flops}).encode()))


def training_flops(model: nn.Module, loss_fn: _LossFn, x: Tensor, y: Tensor, *, batch_size: int, epochs: int) -> int:
    """FLOPs of ``epochs`` passes of the shared loop over ``(x, y)`` in batches of ``batch_size``
    (full batches and the last, smaller one, each counted at its own size).

    A loss that reads values (so cannot run on meta tensors) is not counted: one
    warning per loss names it, and the count is 0.
    """
    n = int(y.shape[0])
    full, rest = divmod(n, batch_size)
    try:
        per_epoch = full * cached_step_flops(model, loss_fn, x[:batch_size], y[:batch_size]) if full else 0
        if rest:
            per_epoch += cached_step_flops(model, loss_fn, x[:rest], y[:rest])
    except (RuntimeError, NotImplementedError, TypeError) as err:
        _warn_uncounted(getattr(loss_fn, "__qualname__", repr(loss_fn)), f"{type(err).__name__}: {err}".split("\n")[0])
        return 0
    return epochs * per_epoch


@functools.cache
def _warn_uncounted(loss: str, why: str) -> None:
    log.warning(
        "training FLOPs of loss %s not counted (it cannot run on meta tensors: %s); train_flops is 0", loss, why
    )
