"""Multi-domain sources: synthetic domains made from one source, and folders of domains.

Synthetic domains split a single-domain source into ``count`` class-stratified
parts and give each part a fixed image transform (:data:`SYNTHETIC_DOMAINS`),
so a feature-shift (domain-generalisation) experiment needs no extra download.
A domains folder (Office-31, Office-Home, DomainNet layout) holds one
ImageFolder per domain: ``<root>/<domain>/<class>/<image>``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedapp.data.arrays import ArrayDataset, check_image_size, resolve_cache_dir
from fedapp.data.imagefolder import ARCHIVE_SUFFIXES, IMAGE_EXTENSIONS, extract_archive, load_imagefolder
from fedapp.errors import DataError

__all__ = ["SYNTHETIC_DOMAINS", "domain_transform", "load_domain_folders", "synthetic_domains"]

SYNTHETIC_DOMAINS: tuple[str, ...] = ("grayscale", "blur", "colour-shift", "rotation", "noise", "inverted")

# Mixed into the seeds so these draws never coincide with the partitioner's or
# the samplers' draws made from the same run seed.
_ASSIGN_SALT = 0xD0A1
_NOISE_SALT = 0x5EED
_NOISE_STD = 25.0
# ITU-R BT.601 luma weights; they sum to 1, so a grey image maps to itself.
_LUMA = np.array([0.299, 0.587, 0.114])
# Per-channel gain and offset, a warm tint. It leaves only colours within a few
# levels of (175, 100, 150) unchanged, so it changes every pixel of a grey image.
_TINT_GAIN = np.array([0.6, 0.9, 0.8])
_TINT_OFFSET = np.array([70.0, 10.0, 30.0])
# Float intermediates of a whole split can take gigabytes; chunks bound them.
_CHUNK_VALUES = 1 << 23


def domain_transform(name: str, images: np.ndarray) -> np.ndarray:
    """Apply one synthetic domain's deterministic transform to a batch.

    Every transform works image by image, so an image's result does not depend
    on the rest of the batch.

    Parameters
    ----------
    name : str
        One of :data:`SYNTHETIC_DOMAINS`:

        - ``grayscale``: BT.601 luminance in all three channels;
        - ``blur``: three passes of a box blur per axis (close to a Gaussian of
          sigma about 1.4 px at 32 px, scaled with the image side), edges padded;
        - ``colour-shift``: a fixed per-channel gain and offset (a warm tint);
        - ``rotation``: 90 degrees counter-clockwise (square images only);
        - ``noise``: additive Gaussian noise, std 25, seeded by the image's own
          pixels, so the same image always gets the same noise;
        - ``inverted``: ``255 - x``.
    images : np.ndarray
        ``uint8`` RGB batch of shape ``(N, H, W, 3)``.

    Returns
    -------
    np.ndarray
        A new ``uint8`` batch of the same shape.

    Raises
    ------
    DataError
        If ``name`` is unknown, the batch is not ``uint8`` ``(N, H, W, 3)``, or
        it is ``rotation`` of non-square images.
    """
    transform = _TRANSFORMS.get(name)
    if transform is None:
        raise DataError(f"unknown synthetic domain {name!r}; valid: {', '.join(SYNTHETIC_DOMAINS)}")
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise DataError(
            f"domain_transform needs a uint8 batch of shape (N, H, W, 3), got "
            f"{getattr(images, 'dtype', type(images))} of shape {getattr(images, 'shape', None)}"
        )
    if name == "rotation" and images.shape[1] != images.shape[2]:
        raise DataError(f"synthetic domain 'rotation' needs square images, got {images.shape[1]}x{images.shape[2]}")
    out = np.empty_like(images)
    chunk = max(1, _CHUNK_VALUES // max(1, int(np.prod(images.shape[1:]))))
    for start in range(0, len(images), chunk):
        out[start : start + chunk] = transform(images[start : start + chunk])
    return out


def _to_uint8(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def _grayscale(images: np.ndarray) -> np.ndarray:
    luma = _to_uint8(images @ _LUMA)
    return np.repeat(luma[..., np.newaxis], 3, axis=-1)


def _blur(images: np.ndarray) -> np.ndarray:
    # Radius 1 at 32 px (three box passes ~ Gaussian sigma 1.4): visibly soft at
    # CIFAR size; it grows with the side so that 224 px images are as blurred.
    radius = max(1, round(min(images.shape[1:3]) / 32))
    # torch's pooling is ~10x faster than numpy here (CIFAR-10's share of a
    # domain in 0.3 s), which every simulation worker pays once.
    values = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float()
    for _ in range(3):
        padded = F.pad(values, (radius, radius, radius, radius), mode="replicate")
        values = F.avg_pool2d(padded, kernel_size=2 * radius + 1, stride=1)
    return _to_uint8(values.permute(0, 2, 3, 1).numpy())


def _colour_shift(images: np.ndarray) -> np.ndarray:
    return _to_uint8(images * _TINT_GAIN + _TINT_OFFSET)


def _rotation(images: np.ndarray) -> np.ndarray:
    return np.rot90(images, k=1, axes=(1, 2))


def _noise(images: np.ndarray) -> np.ndarray:
    out = np.empty_like(images)
    for i, image in enumerate(images):
        # Seeded by the content (not the batch position), so an image's noise does
        # not depend on which other images share its domain or chunk.
        image = np.ascontiguousarray(image)
        rng = np.random.default_rng([_NOISE_SALT, zlib.crc32(image.tobytes())])
        out[i] = _to_uint8(image + rng.normal(0.0, _NOISE_STD, size=image.shape))
    return out


def _inverted(images: np.ndarray) -> np.ndarray:
    return 255 - images


_TRANSFORMS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "grayscale": _grayscale,
    "blur": _blur,
    "colour-shift": _colour_shift,
    "rotation": _rotation,
    "noise": _noise,
    "inverted": _inverted,
}
# The names and their order are the public contract; the table must follow it.
assert tuple(_TRANSFORMS) == SYNTHETIC_DOMAINS


def synthetic_domains(source: ArrayDataset, count: int, seed: int) -> ArrayDataset:
    """Split a single-domain dataset into ``count`` transformed domains.

    Each class's samples are shuffled and dealt round-robin over the domains
    (the deal continues from class to class), so every domain gets about
    ``1/count`` of every class and domain sizes differ by at most one. Domain
    ``d`` then holds the samples dealt to it, transformed by
    ``SYNTHETIC_DOMAINS[d]``.

    Parameters
    ----------
    source : ArrayDataset
        A single-domain dataset (``domains`` is ``None``).
    count : int
        Number of domains, ``2 <= count <= len(SYNTHETIC_DOMAINS)``.
    seed : int
        Non-negative seed of the assignment of samples to domains.

    Returns
    -------
    ArrayDataset
        Same labels and class names in the same order (sample ``i`` stays at
        index ``i``), with transformed images, ``domains`` set and
        ``domain_names = SYNTHETIC_DOMAINS[:count]``. The result depends only
        on the source's contents, ``count`` and ``seed``.

    Raises
    ------
    DataError
        If ``count`` or ``seed`` is out of range, the source already has
        domains, or it has fewer samples than ``count``.
    """
    _check_synthetic_arguments(source, count, seed)
    count = int(count)
    domains = _deal_domains(source.labels, source.num_classes, count, int(seed))
    images = np.empty_like(source.images)
    for domain, name in enumerate(SYNTHETIC_DOMAINS[:count]):
        members = np.flatnonzero(domains == domain)
        images[members] = domain_transform(name, source.images[members])
    return ArrayDataset(
        images=images,
        labels=source.labels.copy(),
        class_names=source.class_names,
        domains=domains,
        domain_names=SYNTHETIC_DOMAINS[:count],
    )


def _check_synthetic_arguments(source: ArrayDataset, count: int, seed: int) -> None:
    limit = len(SYNTHETIC_DOMAINS)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 2 <= count <= limit:
        raise DataError(f"synthetic domain count must be an integer in [2, {limit}], got {count!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"synthetic domain seed must be a non-negative integer, got {seed!r}")
    if source.domains is not None:
        raise DataError(
            f"the dataset already has {source.num_domains} domains ({', '.join(source.domain_names)}); "
            f"synthetic domains apply to single-domain sources"
        )
    if len(source) < count:
        raise DataError(f"cannot split {len(source)} samples into {count} synthetic domains")


def _deal_domains(labels: np.ndarray, num_classes: int, count: int, seed: int) -> np.ndarray:
    """Each class's samples shuffled and dealt round-robin over ``count`` domains, the deal
    continuing from class to class; returns the domain of every sample."""
    rng = np.random.default_rng([seed, _ASSIGN_SALT])
    domains = np.empty(len(labels), dtype=np.int64)
    dealt = 0
    for label in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == label))
        domains[members] = (dealt + np.arange(len(members))) % count
        dealt += len(members)
    return domains


def load_domain_folders(data_dir: str, *, image_size: int, split: str = "", cache_dir: str = "") -> ArrayDataset:
    """Load a folder (or ``.tar.gz``/``.tgz``) with one ImageFolder per domain.

    Layout: ``<root>/<domain>/<class>/<image>`` (Office-31, Office-Home,
    DomainNet), each domain optionally with split subfolders
    (``<root>/<domain>/<split>/<class>/<image>``). Hidden subfolders and plain
    files beside the domains are ignored. Wrapper folders holding only one
    subfolder (as archives often have) are descended into, unless that
    subfolder is itself an ImageFolder.

    Parameters
    ----------
    data_dir : str
        The folder or archive.
    image_size : int
        Images are resized to ``image_size`` x ``image_size``.
    split : str
        Passed to each domain's :func:`~fedapp.data.imagefolder.load_imagefolder`.
    cache_dir : str
        Cache folder; see :func:`fedapp.data.arrays.resolve_cache_dir`.

    Returns
    -------
    ArrayDataset
        All domains' samples, domain after domain; ``domain_names`` are the
        sorted domain folder names, ``class_names`` the sorted union of every
        domain's classes (a domain may lack some), labels index that union.

    Raises
    ------
    DataError
        If the path is missing, is a file but not an archive, has fewer than
        two domain subfolders, or a domain fails to load (the message names it).
    """
    image_size = check_image_size(image_size)
    path, domain_dirs = _domain_folders(data_dir, split, cache_dir)
    parts: list[ArrayDataset] = []
    for domain_dir in domain_dirs:
        try:
            parts.append(load_imagefolder(str(domain_dir), image_size=image_size, split=split, cache_dir=cache_dir))
        except DataError as exc:
            raise DataError(f"domain {domain_dir.name!r} of {path}: {exc}") from exc
    return _merge_domains(parts, tuple(d.name for d in domain_dirs))


def _domain_folders(data_dir: str, split: str, cache_dir: str) -> tuple[Path, list[Path]]:
    """The resolved path the user gave (for messages) and its domain folders, an archive extracted first."""
    if not data_dir:
        raise DataError(
            "dataset 'domains' needs data_dir (a folder or .tar.gz with one ImageFolder subfolder per domain)"
        )
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise DataError(f"domains path does not exist: {path}")
    path = path.resolve()
    if path.is_file():
        if not path.name.lower().endswith(ARCHIVE_SUFFIXES):
            raise DataError(f"domains path {path} is a file but not a {'/'.join(ARCHIVE_SUFFIXES)} archive")
        root = extract_archive(path, resolve_cache_dir(cache_dir))
    else:
        root = path
    domain_dirs = _visible_subdirs(_unwrap(root, split))
    if len(domain_dirs) < 2:
        found = ", ".join(d.name for d in domain_dirs) or "none"
        raise DataError(
            f"{path}: a multi-domain dataset needs one subfolder per domain (at least two), found {found}; "
            f"expected <root>/<domain>/<class>/<image files>"
        )
    return path, domain_dirs


def _merge_domains(parts: list[ArrayDataset], domain_names: tuple[str, ...]) -> ArrayDataset:
    """One dataset of every domain's samples, domain after domain, labels re-indexed into the union of classes."""
    class_names = tuple(sorted(set().union(*(part.class_names for part in parts))))
    index = {name: i for i, name in enumerate(class_names)}
    labels = [np.array([index[name] for name in part.class_names], dtype=np.int64)[part.labels] for part in parts]
    return ArrayDataset(
        images=np.concatenate([part.images for part in parts]),
        labels=np.concatenate(labels),
        class_names=class_names,
        domains=np.repeat(np.arange(len(parts), dtype=np.int64), [len(part) for part in parts]),
        domain_names=domain_names,
    )


def _unwrap(folder: Path, split: str) -> Path:
    """Descend through folders whose only visible subfolder is not itself an ImageFolder."""
    while True:
        subdirs = _visible_subdirs(folder)
        if len(subdirs) != 1 or _is_imagefolder(subdirs[0], split):
            return folder
        folder = subdirs[0]


def _is_imagefolder(folder: Path, split: str) -> bool:
    """Whether ``folder`` (or its ``split`` subfolder) has class folders with images, i.e. is a domain."""
    return _has_class_folders(folder) or (bool(split) and _has_class_folders(folder / split))


def _has_class_folders(folder: Path) -> bool:
    return any(
        p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
        for d in _visible_subdirs(folder)
        for p in d.iterdir()
    )


def _visible_subdirs(folder: Path) -> list[Path]:
    # Hidden folders (.git, .ipynb_checkpoints) are tooling, not domains.
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)
