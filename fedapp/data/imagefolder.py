"""ImageFolder-layout sources (a folder or a .tar.gz of one), decoded once and cached.

Layout: ``<root>/<class>/<image>``. Only image files directly inside a class
folder count (no recursion), which is what lets the root be found unambiguously
when a folder or archive wraps it in extra single directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from fedapp.data.arrays import (
    ArrayDataset,
    pil_to_rgb_array,
    read_cached_dataset,
    resolve_cache_dir,
    write_cached_dataset,
)
from fedapp.errors import DataError

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
# Bump when the cached arrays change meaning, so stale caches are not reused
# (2: decoded by fedapp.data.arrays.to_rgb: EXIF orientation, high-depth grey, alpha).
_CACHE_FORMAT = 2

ImageFile = tuple[Path, int]


def load_imagefolder(data_dir: str, *, image_size: int, split: str = "", cache_dir: str = "") -> ArrayDataset:
    """Load an ImageFolder-layout folder or ``.tar.gz``/``.tgz`` archive.

    Parameters
    ----------
    data_dir : str
        The folder or archive.
    image_size : int
        Images are resized to ``image_size`` x ``image_size``.
    split : str
        If ``<root>/<split>`` holds class folders, it is used as the root.
    cache_dir : str
        Cache folder; see :func:`fedapp.data.arrays.resolve_cache_dir`.

    Returns
    -------
    ArrayDataset
        The decoded images; class names are the sorted class folder names.

    Raises
    ------
    DataError
        If the path is missing, has no class folders, a class folder has no
        images, an image cannot be decoded, or an archive is unsafe or corrupt.
    """
    if not data_dir:
        raise DataError("dataset 'imagefolder' needs data_dir (a folder or .tar.gz)")
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise DataError(f"imagefolder path does not exist: {path}")
    path = path.resolve()
    cache = resolve_cache_dir(cache_dir)
    if path.is_file():
        return _load_archive(path, image_size=image_size, split=split, cache=cache)
    root = find_root(path, split)
    class_names, files = list_images(root)
    key = _cache_key(
        kind="folder", path=str(root), image_size=image_size, files=[_file_signature(f, root) for f, _ in files]
    )
    return _decode_or_load(key, cache, class_names, files, image_size)


def _load_archive(path: Path, *, image_size: int, split: str, cache: Path) -> ArrayDataset:
    if not path.name.lower().endswith(ARCHIVE_SUFFIXES):
        raise DataError(f"imagefolder path {path} is a file but not a {'/'.join(ARCHIVE_SUFFIXES)} archive")
    stat = path.stat()
    # The archive's own size and mtime stand for its content, so a cache hit
    # needs neither extraction nor a directory walk.
    key = _cache_key(
        kind="archive", path=str(path), size=stat.st_size, mtime_ns=stat.st_mtime_ns, split=split, image_size=image_size
    )
    cached = read_cached_dataset(_cache_file(cache, key))
    if cached is not None:
        return cached
    root = find_root(extract_archive(path, cache), split)
    class_names, files = list_images(root)
    return _decode_or_load(key, cache, class_names, files, image_size)


def find_root(path: Path, split: str = "") -> Path:
    """Locate the ImageFolder root at or below ``path``.

    Prefers ``<dir>/<split>`` when it holds class folders, then ``<dir>`` itself;
    otherwise descends while ``<dir>`` has exactly one subfolder (archives often
    wrap the data in e.g. ``dataset/train/``).

    Parameters
    ----------
    path : Path
        Folder to start from.
    split : str
        Optional split subfolder name.

    Returns
    -------
    Path
        The root; if none qualifies, the deepest folder reached, so that
        :func:`list_images` can report what is wrong with it.
    """
    current = path
    while True:
        if split and _has_class_folders(current / split):
            return current / split
        if _has_class_folders(current):
            return current
        subdirs = _visible_subdirs(current)
        if len(subdirs) != 1:
            return current
        current = subdirs[0]


def list_images(root: Path) -> tuple[tuple[str, ...], list[ImageFile]]:
    """List the class names and ``(file, label)`` pairs of an ImageFolder root.

    Parameters
    ----------
    root : Path
        Folder whose visible subfolders are the classes.

    Returns
    -------
    tuple[tuple[str, ...], list[tuple[Path, int]]]
        Sorted class names, and every image with its class id, in a stable order.

    Raises
    ------
    DataError
        If there are no class folders, none holds images, or one is empty.
    """
    class_dirs = _visible_subdirs(root)
    if not class_dirs:
        raise DataError(f"imagefolder {root} has no class subfolders; expected <root>/<class>/<image files>")
    per_class = [_image_files(d) for d in class_dirs]
    if not any(per_class):
        names = ", ".join(d.name for d in class_dirs[:5])
        raise DataError(
            f"imagefolder {root} has no class subfolders with images "
            f"(found subfolders: {names}); expected "
            f"<root>/<class>/<image files> or pass the split name"
        )
    files: list[ImageFile] = []
    for label, (class_dir, images) in enumerate(zip(class_dirs, per_class, strict=True)):
        if not images:
            raise DataError(
                f"class folder {class_dir} contains no images (accepted extensions: {sorted(IMAGE_EXTENSIONS)})"
            )
        files.extend((image, label) for image in images)
    return tuple(d.name for d in class_dirs), files


def _visible_subdirs(folder: Path) -> list[Path]:
    # Hidden folders (.git, .ipynb_checkpoints) are tooling, not classes.
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)


def _image_files(folder: Path) -> list[Path]:
    return sorted(
        (
            p
            for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
        ),
        key=lambda p: p.name,
    )


def _has_class_folders(folder: Path) -> bool:
    return any(_image_files(d) for d in _visible_subdirs(folder))


def _decode_image(path: Path, image_size: int) -> np.ndarray:
    """Decode one file to a ``(image_size, image_size, 3)`` RGB ``uint8`` array."""
    try:
        with Image.open(path) as image:
            return pil_to_rgb_array(image, image_size)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DataError(f"cannot decode image file {path}: {exc}") from exc


def _decode_all(files: list[ImageFile], image_size: int) -> tuple[np.ndarray, np.ndarray]:
    images = np.empty((len(files), image_size, image_size, 3), dtype=np.uint8)
    for i, (path, _) in enumerate(files):
        images[i] = _decode_image(path, image_size)
    labels = np.fromiter((label for _, label in files), dtype=np.int64, count=len(files))
    return images, labels


def _decode_or_load(
    key: str, cache: Path, class_names: tuple[str, ...], files: list[ImageFile], image_size: int
) -> ArrayDataset:
    cache_file = _cache_file(cache, key)
    cached = read_cached_dataset(cache_file)
    if cached is not None:
        return cached
    images, labels = _decode_all(files, image_size)
    dataset = ArrayDataset(images=images, labels=labels, class_names=class_names)
    write_cached_dataset(cache_file, dataset)
    return dataset


# --- cache -------------------------------------------------------------------


def _file_signature(path: Path, root: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return (path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime_ns)


def _cache_key(**parts: object) -> str:
    payload = json.dumps({"format": _CACHE_FORMAT, **parts}, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _cache_file(cache: Path, key: str) -> Path:
    return cache / f"imagefolder-{key[:32]}.npz"


# --- archives ----------------------------------------------------------------


def extract_archive(archive: Path, cache: Path) -> Path:
    """Extract a ``.tar.gz`` once into ``<cache>/extracted/`` and return the folder.

    Parameters
    ----------
    archive : Path
        The archive; its path, size and mtime name the extraction folder.
    cache : Path
        The cache folder.

    Returns
    -------
    Path
        The folder holding the extracted members.

    Raises
    ------
    DataError
        If the archive is corrupt or has a member with an absolute path, a
        ``..`` component, or that is a link or special file.
    """
    stat = archive.stat()
    key = _cache_key(kind="extract", path=str(archive), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    target = cache / "extracted" / f"{archive.name.split('.')[0]}-{key[:16]}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Extract beside the target and rename, so a crash never leaves a
    # half-extracted folder that a later run would take as complete.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        _extract_safely(archive, tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.is_dir():  # not a concurrent extraction winning the race
                raise
    except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot extract archive {archive}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _extract_safely(archive: Path, destination: Path) -> None:
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            _check_member(member, archive)
        # The checks above are the contract; the "data" filter (Python >= 3.10.12)
        # is a second guard where available.
        guard = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(destination, members=members, **guard)


def _check_member(member: tarfile.TarInfo, archive: Path) -> None:
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise DataError(
            f"archive {archive} has an unsafe member {member.name!r} (absolute path or '..'); refusing to extract"
        )
    if not (member.isfile() or member.isdir()):
        raise DataError(
            f"archive {archive} has member {member.name!r} that is a link or special file; refusing to extract"
        )
