"""The frozen CLIP image side of prompt learning: input batches and cached features.

* :func:`clip_image_batch` turns ``uint8`` images into the model's normalised input;
* :func:`encode_images` runs them through the frozen image tower in batches;
* :class:`ImageClassifier` puts the frozen image tower in front of a classifier of its
  features, so a text-prompt client's exported model takes images;
* :class:`ImageFeatureCache` keeps those features per process, since the image
  tower never changes during prompt learning, so they are computed once.

Nothing here imports Flower.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.errors import DataError, ModelError
from fedapp.models.clip import LoadedClip

__all__ = ["ImageClassifier", "ImageFeatureCache", "clip_image_batch", "encode_images"]

# OpenAI CLIP's preprocess statistics, for models whose config names none.
_OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def _image_size(clip: LoadedClip) -> tuple[int, int]:
    size: Any = getattr(clip.model.visual, "image_size", None)
    if size is None:
        size = getattr(clip.model.visual, "preprocess_cfg", {}).get("size")
    if size is None:
        raise ModelError(f"cannot tell the input image size of {clip.model_name}")
    if isinstance(size, int):
        return size, size
    height, width = size
    return int(height), int(width)


def _mean_std(clip: LoadedClip) -> tuple[Sequence[float], Sequence[float]]:
    cfg = getattr(clip.model.visual, "preprocess_cfg", None) or {}
    return cfg.get("mean", _OPENAI_MEAN), cfg.get("std", _OPENAI_STD)


def _check_images(images_uint8: np.ndarray) -> np.ndarray:
    array = np.asarray(images_uint8)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
        raise DataError(f"expected uint8 images of shape (N, H, W, 3), got dtype {array.dtype} and shape {array.shape}")
    return array


def clip_image_batch(
    images_uint8: np.ndarray, clip: LoadedClip, *, resize: bool = True, device: torch.device | str | None = None
) -> Tensor:
    """Turn ``uint8`` images into the model's normalised input.

    Images are resized (bilinear, no crop) to the model's image size and
    normalised with its preprocess mean/std (OpenAI's by default). With
    ``resize=False`` they keep their size (a model that resizes per batch
    then holds small tensors; resizing and this per-channel normalisation commute).

    Parameters
    ----------
    images_uint8 : np.ndarray
        ``(N, H, W, 3)`` ``uint8`` images.
    clip : LoadedClip
        The model whose input size and statistics to use.
    resize : bool, default True
        Resize to the model's input size.
    device : torch.device or str, optional
        Where to prepare them (default the CPU): the ``uint8`` images go there first, so a
        GPU receives a quarter of the bytes and resizes and normalises them itself.

    Returns
    -------
    Tensor
        ``(N, 3, S_h, S_w)`` float32 on ``device``.

    Raises
    ------
    DataError
        If the array is not ``uint8`` of shape ``(N, H, W, 3)``.
    """
    array = _check_images(images_uint8)
    x = torch.from_numpy(np.ascontiguousarray(array)).to(device or "cpu").permute(0, 3, 1, 2).float().div_(255.0)
    size = _image_size(clip)
    if resize and tuple(x.shape[-2:]) != size and x.shape[0] > 0:
        # Antialias when shrinking, as PIL does in open_clip's own transform.
        shrink = size[0] < x.shape[-2] or size[1] < x.shape[-1]
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=shrink)
    mean, std = _mean_std(clip)
    mean_t = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std_t = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - mean_t) / std_t


@torch.no_grad()
def encode_images(
    clip: LoadedClip,
    images_uint8: np.ndarray,
    *,
    batch_size: int = 256,
    device: str | torch.device | None = None,
) -> Tensor:
    """Encode images with the frozen image tower, in batches.

    The tower runs in the model's precision (inputs are cast to
    :attr:`LoadedClip.compute_dtype`); the features come back as float32.

    Parameters
    ----------
    clip : LoadedClip
        The frozen model.
    images_uint8 : np.ndarray
        ``(N, H, W, 3)`` ``uint8`` images.
    batch_size : int, default 256
        Images preprocessed and encoded at a time (bounds memory).
    device : str or torch.device, optional
        Where to run; default the model's own device (the model is shared and
        is not moved, so pass the device it was loaded on).

    Returns
    -------
    Tensor
        ``(N, embed_dim)`` float32, L2-normalised, on ``device``.
    """
    if batch_size < 1:
        raise DataError(f"batch_size must be positive; got {batch_size}")
    images = _check_images(images_uint8)
    param = next(clip.model.visual.parameters())
    target = torch.device(device) if device is not None else param.device
    chunks = []
    for start in range(0, len(images), batch_size):
        x = clip_image_batch(images[start : start + batch_size], clip, device=target)
        # Not param.dtype: a ViT's first parameter (class_embedding) stays float32 under fp16/bf16.
        features = clip.model.encode_image(x.to(device=target, dtype=clip.compute_dtype))
        chunks.append(F.normalize(features.float(), dim=-1))
    if not chunks:
        return torch.empty(0, clip.embed_dim, device=target)
    return torch.cat(chunks)


class ImageFeatureCache:
    """Per-process store of frozen image features, encoded once per key.

    The image tower is frozen, so a client's features never change between
    epochs or rounds; methods fetch them from here instead of re-encoding.

    Attributes
    ----------
    encode_count : int
        How many times images were actually encoded (cache misses).
    """

    def __init__(self) -> None:
        self._store: dict[Hashable, Tensor] = {}
        self.encode_count = 0

    def get_or_encode(
        self,
        key: Hashable,
        clip: LoadedClip,
        images_uint8: np.ndarray,
        *,
        batch_size: int = 256,
        device: str | torch.device | None = None,
        encode: Callable[[np.ndarray], Tensor] | None = None,
    ) -> Tensor:
        """Return the features cached under ``key``, encoding them on first use.

        Parameters
        ----------
        key : Hashable
            Identifies model and images, e.g. ``(model_name, pretrained,
            partition, split)``; the caller must make it unique per image set.
        clip : LoadedClip
            The frozen model.
        images_uint8 : np.ndarray
            ``(N, H, W, 3)`` ``uint8`` images (read only on a miss).
        batch_size : int, default 256
            Passed to :func:`encode_images`.
        device : str or torch.device, optional
            Passed to :func:`encode_images`.
        encode : callable, optional
            Replaces :func:`encode_images` (e.g. pre-projection ViT features):
            maps the images to their features.

        Returns
        -------
        Tensor
            ``(N, embed_dim)`` normalised features (or ``encode``'s); shared, do not modify in place.
        """
        if key not in self._store:
            if encode is not None:
                self._store[key] = encode(images_uint8)
            else:
                self._store[key] = encode_images(clip, images_uint8, batch_size=batch_size, device=device)
            self.encode_count += 1
        return self._store[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._store

    def __len__(self) -> int:
        return len(self._store)

    def clear(self) -> None:
        """Drop every cached tensor (the encode count is kept)."""
        self._store.clear()


class ImageClassifier(nn.Module):
    """A classifier of frozen CLIP image features that takes the images themselves:
    what a text-prompt client's exported model is. Its input is what
    :func:`~fedapp.models.image_features.clip_image_batch` makes of uint8 images; the
    features are the ones the client tests on (:func:`~fedapp.models.image_features.encode_images`)."""

    def __init__(self, clip: LoadedClip, classifier: nn.Module) -> None:
        super().__init__()
        # Kept out of the module tree: the image tower is shared and frozen, and not exported.
        self._clip = [clip]
        self.classifier = classifier

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        clip = self._clip[0]
        features = clip.model.encode_image(images.to(dtype=clip.compute_dtype))
        return self.classifier(F.normalize(features.float(), dim=-1))
