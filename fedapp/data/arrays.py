"""In-memory image dataset and the pixel conversions every source shares."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from fedapp.cachedir import CACHE_ENV_VAR, DEFAULT_CACHE_DIR, resolve_cache_dir  # noqa: F401 - their old home
from fedapp.errors import DataError

# Resizing a whole split at once as float32 can need gigabytes; chunks bound it.
_RESIZE_CHUNK = 4096


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A decoded image-classification dataset held in memory.

    Attributes
    ----------
    images : np.ndarray
        ``uint8`` RGB images of shape ``(N, H, W, 3)``.
    labels : np.ndarray
        ``int64`` class ids of shape ``(N,)``, each in ``[0, num_classes)``.
    class_names : tuple[str, ...]
        Name of each class id.
    domains : np.ndarray or None
        ``int64`` domain id of every sample, shape ``(N,)``, each in
        ``[0, len(domain_names))``; ``None`` for a single-domain source.
    domain_names : tuple[str, ...]
        Name of each domain id (empty for a single-domain source).

    Raises
    ------
    DataError
        If the arrays have the wrong dtype or shape, or a label is out of range.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    domains: np.ndarray | None = None
    domain_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_images(self.images)
        _check_labels(self.labels, len(self.images), len(self.class_names))
        if self.domains is not None:
            _check_labels(self.domains, len(self.images), len(self.domain_names), what="domains")
        elif self.domain_names:
            raise DataError(f"domain_names {self.domain_names} given without per-sample domains")

    @property
    def num_domains(self) -> int:
        """Number of domains (0 for a single-domain source)."""
        return len(self.domain_names)

    @property
    def num_classes(self) -> int:
        """Number of classes (length of ``class_names``)."""
        return len(self.class_names)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _check_images(images: np.ndarray) -> None:
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
        raise DataError(
            f"images must be a uint8 numpy array, got {type(images)!r} with dtype {getattr(images, 'dtype', None)}"
        )
    if images.ndim != 4 or images.shape[-1] != 3:
        raise DataError(f"images must have shape (N, H, W, 3), got {images.shape}")


def _check_labels(labels: np.ndarray, num_images: int, num_classes: int, what: str = "labels") -> None:
    if not isinstance(labels, np.ndarray) or labels.dtype != np.int64:
        raise DataError(f"{what} must be an int64 numpy array, got dtype {getattr(labels, 'dtype', None)}")
    if labels.shape != (num_images,):
        raise DataError(f"{what} have shape {labels.shape}, expected ({num_images},)")
    if num_images and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{what} must lie in [0, {num_classes}), found [{labels.min()}, {labels.max()}]")


def resize_images(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinearly resize a batch of ``uint8`` images to ``size`` x ``size``.

    Parameters
    ----------
    images : np.ndarray
        ``uint8`` array of shape ``(N, H, W, C)``.
    size : int
        Target height and width.

    Returns
    -------
    np.ndarray
        ``uint8`` array of shape ``(N, size, size, C)``; the input itself if it
        already has that size.
    """
    if images.shape[1:3] == (size, size):
        return images
    out = np.empty((images.shape[0], size, size, images.shape[3]), dtype=np.uint8)
    for start in range(0, images.shape[0], _RESIZE_CHUNK):
        chunk = torch.from_numpy(np.ascontiguousarray(images[start : start + _RESIZE_CHUNK]))
        chunk = chunk.permute(0, 3, 1, 2).float()
        # antialias only matters when shrinking; it keeps downscaled images close
        # to what PIL's bilinear resize produces for the imagefolder source.
        resized = F.interpolate(chunk, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        resized = resized.round_().clamp_(0, 255).to(torch.uint8)
        out[start : start + len(chunk)] = resized.permute(0, 2, 3, 1).numpy()
    return out


ALPHA_BACKGROUND = (255, 255, 255)
"""What shows through transparent pixels: white, as a viewer shows an image on a page."""

_SIXTEEN_BIT_GREY = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def _grey_to_uint8(values: np.ndarray, full_scale: float) -> np.ndarray:
    scaled = np.nan_to_num(values.astype(np.float64) * (255.0 / full_scale), nan=0.0)
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _high_depth_grey(image: Image.Image) -> Image.Image:
    """16-bit, 32-bit integer and float grey images as 8-bit ``L``, scaled by their range.

    ``I;16*`` spans 0..65535. ``I`` (32-bit) holds 8-bit data when every value fits in
    0..255, 16-bit data (e.g. a 16-bit PNG or TIFF) when every value fits in 0..65535,
    and is scaled by its maximum otherwise. ``F`` spans 0..1 when every value does, and
    0..255 otherwise. PIL's own conversion clips all of these at 255 instead.
    """
    values = np.asarray(image)
    if image.mode in _SIXTEEN_BIT_GREY:
        full_scale = 65535.0
    else:
        finite = values[np.isfinite(values)] if image.mode == "F" else values
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        if image.mode == "F":
            full_scale = 1.0 if low >= 0.0 and high <= 1.0 else 255.0
        else:
            full_scale = 255.0 if high <= 255 else 65535.0 if high <= 65535 else high
    return Image.fromarray(_grey_to_uint8(values, full_scale), mode="L")


def _unpremultiplied_la(image: Image.Image) -> Image.Image:
    """``La`` (grey with premultiplied alpha), which PIL cannot convert, as ``RGBA``."""
    grey, alpha = (np.asarray(band, dtype=np.float64) for band in image.split())
    straight = np.where(alpha > 0, grey * 255.0 / np.maximum(alpha, 1.0), 0.0)
    grey_band = Image.fromarray(np.clip(np.rint(straight), 0, 255).astype(np.uint8), mode="L")
    return Image.merge("RGBA", (grey_band, grey_band, grey_band, image.getchannel("a")))


def to_rgb(image: Image.Image) -> Image.Image:
    """Any image PIL opens, as the ``RGB`` image a viewer would show.

    EXIF orientation is applied; 16-bit, 32-bit and float grey keep their tones
    (:func:`_high_depth_grey`); CIE LAB goes through a colour transform (PIL would copy
    the channels); images with transparency (``RGBA``, ``LA``, ``PA``, premultiplied
    ``RGBa``/``La``, palette or grey with a transparent colour) are composited over
    :data:`ALPHA_BACKGROUND` instead of showing whatever colour hides under the alpha.
    """
    image = ImageOps.exif_transpose(image)
    if image.mode in _SIXTEEN_BIT_GREY or image.mode in ("I", "F"):
        image = _high_depth_grey(image)
    if image.mode == "LAB":
        from PIL import ImageCms  # noqa: PLC0415 - LittleCMS is loaded only for the rare LAB image

        lab_to_srgb = ImageCms.buildTransform(
            ImageCms.createProfile("LAB"), ImageCms.createProfile("sRGB"), "LAB", "RGB"
        )
        return ImageCms.applyTransform(image, lab_to_srgb)
    if image.mode == "La":
        image = _unpremultiplied_la(image)
    has_alpha = image.mode in ("RGBA", "LA", "PA", "RGBa") or "transparency" in image.info
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*ALPHA_BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def pil_to_rgb_array(image: Image.Image, size: int) -> np.ndarray:
    """Convert a PIL image to an RGB ``uint8`` array of shape ``(size, size, 3)``.

    Parameters
    ----------
    image : PIL.Image.Image
        Any mode PIL opens, decoded as :func:`to_rgb` says.
    size : int
        Target height and width (bilinear resize).

    Returns
    -------
    np.ndarray
        The converted image.
    """
    rgb = to_rgb(image)
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


def check_image_size(image_size: int) -> int:
    """Validate ``image_size`` and return it as an ``int``.

    Raises
    ------
    DataError
        If it is not a positive integer.
    """
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)):
        raise DataError(f"image_size must be an integer, got {image_size!r}")
    if image_size < 1:
        raise DataError(f"image_size must be >= 1, got {image_size}")
    return int(image_size)


def read_cached_dataset(cache_file: Path) -> ArrayDataset | None:
    """The cached dataset, or ``None`` if absent or unreadable (it is rebuilt)."""
    try:
        with np.load(cache_file, allow_pickle=False) as npz:
            return ArrayDataset(
                images=npz["images"], labels=npz["labels"], class_names=tuple(str(n) for n in npz["class_names"])
            )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, DataError):
        return None


def save_npz_atomically(path: Path, **arrays: np.ndarray) -> None:
    """``np.savez`` to ``path`` through :func:`write_atomically`."""
    write_atomically(path, lambda handle: np.savez(handle, **arrays))


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it over ``path``:
    readers (other worker processes) see the old file or the whole new one, never a torn one.

    Raises
    ------
    OSError
        If the folder cannot be made or the file written; nothing is left behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_cached_dataset(cache_file: Path, dataset: ArrayDataset) -> None:
    """Write atomically; a failure only costs a re-decode next time, so it warns."""
    try:
        save_npz_atomically(
            cache_file,
            images=dataset.images,
            labels=dataset.labels,
            class_names=np.asarray(dataset.class_names, dtype=str),
        )
    except OSError as exc:
        warnings.warn(f"could not write dataset cache {cache_file}: {exc}", stacklevel=2)
