"""Load a whole image-classification source into an :class:`ArrayDataset`."""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fedapp.data.arrays import (
    ArrayDataset,
    check_image_size,
    pil_to_rgb_array,
    read_cached_dataset,
    resize_images,
    resolve_cache_dir,
    write_cached_dataset,
)
from fedapp.data.domains import load_domain_folders
from fedapp.data.imagefolder import load_imagefolder
from fedapp.errors import DataError

__all__ = ["SOURCES", "ArrayDataset", "load_source"]

SOURCES = ("digits", "imagefolder", "domains", "cifar10", "cifar100", "hf")

# The usual names of columns with no Image or ClassLabel feature (raw pixel arrays, integer labels),
# looked at only when no column has that feature.
_HF_CONVENTIONAL_COLUMNS = {"image": ("img", "image"), "label": ("label", "labels")}
_HF_BATCH = 512


def load_source(
    dataset: str,
    *,
    data_dir: str = "",
    image_size: int = 32,
    download: bool = False,
    hf_name: str = "",
    hf_image_column: str = "",
    hf_label_column: str = "",
    split: str = "train",
    cache_dir: str = "",
) -> ArrayDataset:
    """Load one split of a source, decoded and resized, into memory.

    Parameters
    ----------
    dataset : str
        One of :data:`SOURCES`.
    data_dir : str
        ``imagefolder``: folder or ``.tar.gz``; ``domains``: folder or
        ``.tar.gz`` with one ImageFolder subfolder per domain; ``cifar*``: torchvision root
        (default ``<cache_dir>/<dataset>``); ``hf``: passed to
        ``datasets.load_dataset(data_dir=...)``.
    image_size : int
        Images come back as ``image_size`` x ``image_size`` RGB.
    download : bool
        ``cifar*`` only: download missing files.
    hf_name, hf_image_column, hf_label_column : str
        ``hf`` only: the Hugging Face dataset name (e.g. ``"uoft-cs/cifar10"``) and the columns of its
        images and labels (empty: found by their features, see :func:`hf_table_to_arrays`).
    split : str
        Which split; ``digits`` has only one and rejects ``"test"``.
    cache_dir : str
        Cache folder (default ``$FEDAPP_CACHE_DIR`` or ``~/.cache/fedapp``).

    Returns
    -------
    ArrayDataset
        The split's images and labels.

    Raises
    ------
    DataError
        If the name is unknown or the source is missing, empty or corrupt.
    """
    image_size = check_image_size(image_size)
    if dataset == "digits":
        return _load_digits(image_size, split, cache_dir)
    if dataset == "imagefolder":
        return load_imagefolder(data_dir, image_size=image_size, split=split, cache_dir=cache_dir)
    if dataset == "domains":
        return load_domain_folders(data_dir, image_size=image_size, split=split, cache_dir=cache_dir)
    if dataset in ("cifar10", "cifar100"):
        return _load_cifar(
            dataset, data_dir=data_dir, split=split, download=download, image_size=image_size, cache_dir=cache_dir
        )
    if dataset == "hf":
        columns = {"image_column": hf_image_column, "label_column": hf_label_column}
        return _load_hf(hf_name, data_dir=data_dir, split=split, image_size=image_size, cache_dir=cache_dir, **columns)
    raise DataError(f"unknown dataset {dataset!r}; valid: {', '.join(SOURCES)}")


def _load_digits(image_size: int, split: str, cache_dir: str) -> ArrayDataset:
    if split == "test":
        raise DataError("dataset 'digits' has a single split; it has no 'test' split (each client splits its own data)")
    # scikit-learn (with scipy and pandas) takes seconds to import: every simulation worker
    # would pay it, so the resized arrays are cached and read back without it.
    try:
        sklearn_version = version("scikit-learn")
    except PackageNotFoundError:
        sklearn_version = "?"
    cache_file = resolve_cache_dir(cache_dir) / f"digits-{sklearn_version}-{image_size}px.npz"
    cached = read_cached_dataset(cache_file)
    if cached is None:
        cached = _decode_digits(image_size)
        write_cached_dataset(cache_file, cached)
    return cached


def _decode_digits(image_size: int) -> ArrayDataset:
    from sklearn.datasets import load_digits  # noqa: PLC0415 - see _load_digits

    bunch = load_digits()
    # Pixel values are 0..16 (4x4 block counts), not 0..255.
    gray = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    rgb = np.repeat(gray[..., np.newaxis], 3, axis=-1)
    return ArrayDataset(
        images=resize_images(rgb, image_size),
        labels=bunch.target.astype(np.int64),
        class_names=tuple(str(n) for n in bunch.target_names),
    )


def _load_cifar(
    name: str, *, data_dir: str, split: str, download: bool, image_size: int, cache_dir: str
) -> ArrayDataset:
    # torchvision takes seconds to import and only the CIFAR sources need it.
    from torchvision.datasets import CIFAR10, CIFAR100  # noqa: PLC0415

    if split not in ("train", "test"):
        raise DataError(f"dataset {name!r} has splits 'train' and 'test', got {split!r}")
    cls = CIFAR10 if name == "cifar10" else CIFAR100
    root = Path(data_dir).expanduser() if data_dir else resolve_cache_dir(cache_dir) / name
    try:
        source = cls(root=str(root), train=split == "train", download=download)
    except RuntimeError as exc:
        # torchvision's "Dataset not found or corrupted" (also after a bad download).
        raise DataError(
            f"{name} files not found or corrupt under {root}: set download=true, or "
            f"point data-dir at the folder that contains an extracted "
            f"'{cls.base_folder}'"
        ) from exc
    except OSError as exc:
        raise DataError(f"downloading {name} into {root} failed: {exc}") from exc
    images = np.asarray(source.data, dtype=np.uint8)
    return ArrayDataset(
        images=resize_images(images, image_size),
        labels=np.asarray(source.targets, dtype=np.int64),
        class_names=tuple(source.classes),
    )


def _load_hf(
    hf_name: str, *, data_dir: str, split: str, image_size: int, cache_dir: str, image_column: str, label_column: str
) -> ArrayDataset:
    if not hf_name:
        raise DataError("dataset 'hf' needs hf_name (a Hugging Face dataset name)")
    table = _load_hf_split(hf_name, data_dir=data_dir, split=split, cache_dir=cache_dir)
    return hf_table_to_arrays(
        table, image_size=image_size, image_column=image_column, label_column=label_column, name=hf_name
    )


def hf_table_to_arrays(
    table: Any, *, image_size: int, image_column: str = "", label_column: str = "", name: str = ""
) -> ArrayDataset:
    """One split of a Hugging Face dataset as decoded, resized images and integer labels.

    Parameters
    ----------
    table : datasets.Dataset
        The split (what ``FederatedDataset.load_split`` or ``datasets.load_dataset`` returns).
    image_size : int
        Images come back as ``image_size`` x ``image_size`` RGB.
    image_column, label_column : str
        The columns to read (the run config's ``hf-image-column`` and ``hf-label-column``). Empty:
        the only column with an ``Image`` feature, and the only one with a ``ClassLabel`` feature;
        when no column has that feature, the only one under the usual name (``img``/``image``,
        ``label``/``labels``).
    name : str
        The dataset's name, for messages.

    Returns
    -------
    ArrayDataset
        The images, the labels and the class names (the ``ClassLabel``'s names, else ``"0"``, ``"1"`` ...).

    Raises
    ------
    DataError
        If a named column is not in the split, if a column cannot be told apart from another one
        of its kind (the message lists them and names the key to set), or if the label column does
        not hold class indices.
    """
    image_col = _hf_column(table, image_column, "image", name)
    label_col = _hf_column(table, label_column, "label", name)
    feature = table.features[label_col]
    if not (_is_hf_feature(feature, "ClassLabel") or str(getattr(feature, "dtype", "")).startswith(("int", "uint"))):
        raise DataError(
            f"the label column {label_col!r} of Hugging Face dataset {name!r} holds {feature}, not class indices: "
            "set hf-label-column to a ClassLabel or integer column"
        )
    labels = np.asarray(table[label_col], dtype=np.int64)
    images = np.empty((len(labels), image_size, image_size, 3), dtype=np.uint8)
    batches = table.select_columns([image_col]).iter(batch_size=_HF_BATCH)
    try:
        for start, batch in _enumerate_batches(batches, image_col):
            for offset, item in enumerate(batch):
                images[start + offset] = _hf_image_to_array(item, image_size)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"the image column {image_col!r} of Hugging Face dataset {name!r} does not hold images ({exc}): "
            "set hf-image-column to the one that does"
        ) from exc
    names = getattr(feature, "names", None)
    if not names:
        names = [str(i) for i in range(int(labels.max()) + 1 if len(labels) else 0)]
    return ArrayDataset(images=images, labels=labels, class_names=tuple(names))


def _is_hf_feature(feature: Any, kind: str) -> bool:
    # By class name: the datasets package (seconds to import) is then needed only to load a split.
    return type(feature).__name__ == kind


def _hf_column(table: Any, chosen: str, what: str, name: str) -> str:
    """The column of ``table`` that holds the ``what`` (``"image"`` or ``"label"``): ``chosen``, else the only one."""
    key = f"hf-{what}-column"
    columns = list(table.column_names)
    if chosen:
        if chosen not in columns:
            raise DataError(
                f"config key '{key}' = {chosen!r} is not a column of Hugging Face dataset {name!r}; "
                f"its columns: {', '.join(columns)}"
            )
        return chosen
    kind = "Image" if what == "image" else "ClassLabel"
    found = [column for column in columns if _is_hf_feature(table.features[column], kind)]
    if not found:
        found = [column for column in _HF_CONVENTIONAL_COLUMNS[what] if column in columns]
    if len(found) == 1:
        return found[0]
    if not found:
        usual = " or ".join(_HF_CONVENTIONAL_COLUMNS[what])
        raise DataError(
            f"Hugging Face dataset {name!r} has no {what} column (no {kind} feature, none named {usual}; "
            f"its columns: {', '.join(columns)}): set {key} to the one that holds the {what}s"
        )
    raise DataError(
        f"Hugging Face dataset {name!r} has {len(found)} {what} columns ({', '.join(found)}): set {key} to one of them"
    )


def _load_hf_split(hf_name: str, *, data_dir: str, split: str, cache_dir: str) -> Any:
    """One split through flwr-datasets' ``FederatedDataset`` (a single partition)."""
    extra: dict[str, str] = {}
    if data_dir:
        extra["data_dir"] = data_dir
    if cache_dir:
        # Only an explicit cache_dir moves HF's cache; otherwise HF's own
        # configuration (HF_DATASETS_CACHE) applies.
        extra["cache_dir"] = str(Path(cache_dir).expanduser() / "hf")
    from flwr_datasets import FederatedDataset  # noqa: PLC0415 - seconds to import; only this source needs it

    # shuffle=False: order does not matter here (partitioning reshuffles), and
    # a stable order keeps indices comparable between runs.
    fds = FederatedDataset(dataset=hf_name, partitioners={split: 1}, shuffle=False, **extra)
    try:
        return fds.load_split(split)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot load split {split!r} of Hugging Face dataset {hf_name!r}: {exc}") from exc


def _enumerate_batches(batches: Iterable[dict[str, list[Any]]], column: str) -> Iterable[tuple[int, list[Any]]]:
    start = 0
    for batch in batches:
        yield start, batch[column]
        start += len(batch[column])


def _hf_image_to_array(item: Any, image_size: int) -> np.ndarray:
    if not isinstance(item, Image.Image):
        # Some datasets store raw pixel arrays instead of an Image feature.
        item = Image.fromarray(np.asarray(item, dtype=np.uint8))
    try:
        return pil_to_rgb_array(item, image_size)
    finally:
        item.close()  # the table decodes a new image per access; a lazily read file (a GIF) stays open otherwise
