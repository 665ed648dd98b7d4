"""Turn decoded images into normalised tensors and batch them without a DataLoader."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from fedapp.errors import DataError

# Maps [0, 1] to [-1, 1]; the same per channel, so no dataset statistics are needed.
MEAN = 0.5
STD = 0.5


def to_float_tensor(images_uint8: np.ndarray) -> torch.Tensor:
    """Convert ``(N, H, W, 3)`` ``uint8`` images to a normalised float tensor.

    Parameters
    ----------
    images_uint8 : np.ndarray
        RGB images with values 0..255.

    Returns
    -------
    torch.Tensor
        ``float32`` tensor of shape ``(N, 3, H, W)``: ``(x / 255 - 0.5) / 0.5``.

    Raises
    ------
    DataError
        If the array is not ``uint8`` of shape ``(N, H, W, 3)``.
    """
    array = np.asarray(images_uint8)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
        raise DataError(f"expected uint8 images of shape (N, H, W, 3), got dtype {array.dtype} and shape {array.shape}")
    tensor = torch.from_numpy(np.ascontiguousarray(array)).permute(0, 3, 1, 2)
    scaled = tensor.to(torch.float32).div_(255.0)
    return scaled.sub_(MEAN).div_(STD).contiguous()


def iterate_batches(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    *,
    shuffle: bool,
    generator: torch.Generator | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(x, y)`` mini-batches that visit every sample exactly once.

    Parameters
    ----------
    x, y : torch.Tensor
        Inputs and targets with the same first dimension.
    batch_size : int
        Samples per batch; the last batch may be smaller.
    shuffle : bool
        Visit samples in a random order (``torch.randperm``) instead of in order.
    generator : torch.Generator, optional
        Source of the permutation; with ``None`` torch's global RNG is used.

    Yields
    ------
    tuple[torch.Tensor, torch.Tensor]
        One batch of inputs and targets.

    Raises
    ------
    DataError
        If the lengths differ or ``batch_size`` is not positive.
    """
    if len(x) != len(y):
        raise DataError(f"x and y differ in length: {len(x)} vs {len(y)}")
    if batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}")
    n = len(x)
    order = torch.randperm(n, generator=generator) if shuffle else None
    for start in range(0, n, batch_size):
        if order is None:
            yield x[start : start + batch_size], y[start : start + batch_size]
        else:
            batch = order[start : start + batch_size]
            yield x[batch.to(x.device)], y[batch.to(y.device)]
