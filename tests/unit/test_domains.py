"""Tests of fedapp.data.domains: synthetic domains and folders of domains (all offline)."""

from __future__ import annotations

import itertools
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedapp.data import SOURCES, ArrayDataset, load_source
from fedapp.data.arrays import resize_images
from fedapp.data.domains import SYNTHETIC_DOMAINS, domain_transform, load_domain_folders, synthetic_domains
from fedapp.errors import DataError

COLORS = {"cat": (255, 0, 0), "dog": (0, 0, 255), "fox": (0, 255, 0)}
# Domain -> class -> image count; classes overlap but no two domains have the same set.
LAYOUT = {"a": {"cat": 2, "dog": 1}, "b": {"cat": 1, "dog": 2, "fox": 3}, "c": {"dog": 1, "fox": 2}}


def _random_images(n: int = 12, size: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _digit_images(n: int = 60) -> np.ndarray:
    """Real handwritten digits as grey RGB at 32 px (what the 'digits' source yields)."""
    from sklearn.datasets import load_digits  # noqa: PLC0415 - only these tests pay the import

    gray = np.rint(load_digits().images[:n] * (255.0 / 16.0)).astype(np.uint8)
    return resize_images(np.repeat(gray[..., np.newaxis], 3, axis=-1), 32)


def _source(n_per_class: tuple[int, ...] = (13, 9, 20), size: int = 16, seed: int = 1) -> ArrayDataset:
    labels = np.concatenate([np.full(n, c, dtype=np.int64) for c, n in enumerate(n_per_class)])
    labels = np.random.default_rng(seed).permutation(labels)
    names = tuple(f"class{c}" for c in range(len(n_per_class)))
    return ArrayDataset(images=_random_images(len(labels), size, seed), labels=labels, class_names=names)


# --- domain_transform ------------------------------------------------------------


def test_synthetic_domain_names_and_order() -> None:
    assert SYNTHETIC_DOMAINS == ("grayscale", "blur", "colour-shift", "rotation", "noise", "inverted")


@pytest.mark.parametrize("name", SYNTHETIC_DOMAINS)
def test_transform_keeps_shape_is_deterministic_and_leaves_input(name: str) -> None:
    images = _random_images()
    before = images.copy()
    out = domain_transform(name, images)
    assert out.dtype == np.uint8
    assert out.shape == images.shape
    assert out is not images
    np.testing.assert_array_equal(images, before)
    np.testing.assert_array_equal(out, domain_transform(name, images))
    # Image by image: an image's result does not depend on the rest of its batch.
    np.testing.assert_array_equal(out[3:4], domain_transform(name, images[3:4]))
    assert len(domain_transform(name, images[:0])) == 0


@pytest.mark.parametrize("kind", ["random", "digits"])
def test_every_pair_of_transforms_differs_on_every_image(kind: str) -> None:
    images = _random_images() if kind == "random" else _digit_images()
    outputs = {name: domain_transform(name, images) for name in SYNTHETIC_DOMAINS}
    for first, second in itertools.combinations(SYNTHETIC_DOMAINS, 2):
        same = np.all(outputs[first] == outputs[second], axis=(1, 2, 3))
        assert not same.any(), f"{first} and {second} agree on images {np.flatnonzero(same)}"
    # Every transform except grayscale-of-grey changes every image.
    for name, out in outputs.items():
        if name == "grayscale" and kind == "digits":
            np.testing.assert_array_equal(out, images)
        else:
            assert not np.all(out == images, axis=(1, 2, 3)).any(), name


def test_transforms_do_what_their_names_say() -> None:
    images = _random_images()
    gray = domain_transform("grayscale", images)
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    np.testing.assert_array_equal(domain_transform("inverted", images), 255 - images)
    np.testing.assert_array_equal(domain_transform("rotation", images), np.rot90(images, k=1, axes=(1, 2)))
    # Blur keeps a flat image flat and smooths a hard edge across several pixels.
    flat = np.full((1, 32, 32, 3), 77, dtype=np.uint8)
    np.testing.assert_array_equal(domain_transform("blur", flat), flat)
    edge = np.zeros((1, 32, 32, 3), dtype=np.uint8)
    edge[:, :, 16:] = 255
    row = domain_transform("blur", edge)[0, 10, :, 0]
    assert row[0] == 0 and row[-1] == 255
    assert ((row > 0) & (row < 255)).sum() >= 4
    # Noise has about the asked-for spread around mid-grey, where nothing clips.
    mid = np.full((2, 64, 64, 3), 128, dtype=np.uint8)
    noisy = domain_transform("noise", mid).astype(np.float64)
    assert 20 < noisy.std() < 30 and abs(noisy.mean() - 128) < 1
    # The colour shift tints grey images too.
    grey = np.full((1, 4, 4, 3), 128, dtype=np.uint8)
    shifted = domain_transform("colour-shift", grey)[0, 0, 0]
    assert len(set(shifted.tolist())) == 3


def test_transform_errors_name_the_problem() -> None:
    with pytest.raises(DataError, match="unknown synthetic domain 'sepia'") as info:
        domain_transform("sepia", _random_images())
    assert all(name in str(info.value) for name in SYNTHETIC_DOMAINS)
    with pytest.raises(DataError, match="square images, got 16x32"):
        domain_transform("rotation", np.zeros((2, 16, 32, 3), dtype=np.uint8))
    with pytest.raises(DataError, match="uint8 batch of shape"):
        domain_transform("blur", np.zeros((2, 8, 8, 3), dtype=np.float32))
    with pytest.raises(DataError, match="uint8 batch of shape"):
        domain_transform("blur", np.zeros((8, 8, 3), dtype=np.uint8))


# --- synthetic_domains -----------------------------------------------------------


@pytest.mark.parametrize("count", range(2, len(SYNTHETIC_DOMAINS) + 1))
def test_synthetic_domains_transform_each_domain_and_keep_labels(count: int) -> None:
    source = _source()
    labels_before = source.labels.copy()
    result = synthetic_domains(source, count, seed=3)
    assert result.domain_names == SYNTHETIC_DOMAINS[:count]
    assert result.num_domains == count
    assert result.domains is not None and result.domains.dtype == np.int64
    np.testing.assert_array_equal(result.labels, source.labels)
    np.testing.assert_array_equal(source.labels, labels_before)
    assert result.class_names == source.class_names
    for domain, name in enumerate(result.domain_names):
        members = np.flatnonzero(result.domains == domain)
        np.testing.assert_array_equal(result.images[members], domain_transform(name, source.images[members]))


def test_synthetic_domains_are_deterministic_and_seeded() -> None:
    source = _source()
    first = synthetic_domains(source, 4, seed=7)
    again = synthetic_domains(_source(), 4, seed=7)
    np.testing.assert_array_equal(first.images, again.images)
    np.testing.assert_array_equal(first.domains, again.domains)
    other = synthetic_domains(source, 4, seed=8)
    assert not np.array_equal(first.domains, other.domains)


def test_synthetic_domains_are_stratified_by_class() -> None:
    source = _source(n_per_class=(13, 9, 20, 6))
    count = 5
    result = synthetic_domains(source, count, seed=0)
    assert result.domains is not None
    table = np.zeros((source.num_classes, count), dtype=np.int64)
    np.add.at(table, (result.labels, result.domains), 1)
    assert (table > 0).all(), table
    assert (table.max(axis=1) - table.min(axis=1) <= 1).all(), table
    sizes = table.sum(axis=0)
    assert sizes.max() - sizes.min() <= 1, sizes


def test_synthetic_domains_errors_name_the_problem() -> None:
    source = _source()
    for count in (0, 1, len(SYNTHETIC_DOMAINS) + 1):
        with pytest.raises(DataError, match=rf"integer in \[2, {len(SYNTHETIC_DOMAINS)}\], got {count}"):
            synthetic_domains(source, count, seed=0)
    with pytest.raises(DataError, match="non-negative integer, got -1"):
        synthetic_domains(source, 2, seed=-1)
    with pytest.raises(DataError, match=r"already has 3 domains \(grayscale, blur, colour-shift\)"):
        synthetic_domains(synthetic_domains(source, 3, seed=0), 2, seed=0)
    tiny = ArrayDataset(images=_random_images(2, 8), labels=np.array([0, 1], dtype=np.int64), class_names=("x", "y"))
    with pytest.raises(DataError, match="cannot split 2 samples into 3 synthetic domains"):
        synthetic_domains(tiny, 3, seed=0)


# --- load_domain_folders -----------------------------------------------------------


def _make_domains(root: Path, layout: dict[str, dict[str, int]] | None = None) -> Path:
    """Write ``<root>/<domain>/<class>/<i>.png`` solid-colour images (colour = class)."""
    for domain, classes in (layout or LAYOUT).items():
        for name, n in classes.items():
            folder = root / domain / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.new("RGB", (6, 7), COLORS[name]).save(folder / f"{i}.png")
    return root


def _check_layout(data: ArrayDataset) -> None:
    assert data.class_names == ("cat", "dog", "fox")
    assert data.domain_names == ("a", "b", "c")
    assert data.images.shape == (12, 8, 8, 3)
    expected_domains = [0] * 3 + [1] * 6 + [2] * 3
    np.testing.assert_array_equal(data.domains, np.array(expected_domains, dtype=np.int64))
    # Each sample's colour names its class, so this checks labels were remapped by name.
    for image, label in zip(data.images, data.labels, strict=True):
        assert tuple(image[0, 0]) == COLORS[data.class_names[label]]
    assert data.domains is not None
    for domain, classes in enumerate(LAYOUT.values()):
        labels = data.labels[data.domains == domain]
        counts = {data.class_names[c]: int(n) for c, n in zip(*np.unique(labels, return_counts=True), strict=True)}
        assert counts == classes


def test_domain_folders_load_with_union_of_classes(tmp_path: Path) -> None:
    root = _make_domains(tmp_path / "office")
    # Hidden folders and plain files beside the domains are not domains.
    (root / ".ipynb_checkpoints").mkdir()
    (root / "README.txt").write_text("three domains")
    data = load_domain_folders(str(root), image_size=8)
    _check_layout(data)
    assert "domains" in SOURCES
    via_source = load_source("domains", data_dir=str(root), image_size=8)
    np.testing.assert_array_equal(via_source.images, data.images)
    np.testing.assert_array_equal(via_source.labels, data.labels)
    np.testing.assert_array_equal(via_source.domains, data.domains)
    assert via_source.domain_names == data.domain_names


def test_domain_folders_from_archive(tmp_path: Path) -> None:
    root = _make_domains(tmp_path / "office")
    archive = tmp_path / "office.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        # One wrapping top-level folder, as published archives usually have.
        tar.add(root, arcname="office31")
    data = load_domain_folders(str(archive), image_size=8)
    _check_layout(data)
    np.testing.assert_array_equal(data.images, load_domain_folders(str(root), image_size=8).images)


def test_domain_folders_pass_the_split_on(tmp_path: Path) -> None:
    for domain in ("a", "b"):
        # <domain>/<split>/<class>: the helper's "domain" level is the split here.
        _make_domains(tmp_path / "office" / domain, {"train": {"cat": 2}, "test": {"dog": 1}})
    test = load_domain_folders(str(tmp_path / "office"), image_size=8, split="test")
    assert test.class_names == ("dog",) and len(test) == 2
    train = load_domain_folders(str(tmp_path / "office"), image_size=8, split="train")
    assert train.class_names == ("cat",) and len(train) == 4
    np.testing.assert_array_equal(train.domains, [0, 0, 1, 1])


def test_domain_folders_errors_name_the_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match=f"domains path does not exist: {re.escape(str(missing))}"):
        load_domain_folders(str(missing), image_size=8)
    with pytest.raises(DataError, match="needs data_dir"):
        load_domain_folders("", image_size=8)

    single = _make_domains(tmp_path / "single", {"a": {"cat": 1, "dog": 1}})
    with pytest.raises(DataError, match=r"one subfolder per domain .*found a;"):
        load_domain_folders(str(single), image_size=8)
    archive = tmp_path / "single.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(single, arcname="single")
    # The archive's one folder is a domain (an ImageFolder), not a wrapper to descend into.
    with pytest.raises(DataError, match=r"one subfolder per domain .*found a;"):
        load_domain_folders(str(archive), image_size=8)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="found none"):
        load_domain_folders(str(empty), image_size=8)

    broken = _make_domains(tmp_path / "broken", {"a": {"cat": 1}, "c": {"dog": 1}})
    for name in ("cat", "dog"):
        (broken / "b" / name).mkdir(parents=True)
    with pytest.raises(
        DataError, match=f"domain 'b' of {re.escape(str(broken))}: imagefolder .* no class subfolders with images"
    ) as info:
        load_domain_folders(str(broken), image_size=8)
    assert isinstance(info.value.__cause__, DataError)

    text = tmp_path / "notes.txt"
    text.write_text("not an archive")
    with pytest.raises(DataError, match=r"is a file but not a \.tar\.gz/\.tgz archive"):
        load_domain_folders(str(text), image_size=8)
