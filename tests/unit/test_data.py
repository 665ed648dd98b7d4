"""Tests of fedapp.data: sources, partitions, per-client splits and tensors (all offline)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits

from fedapp.config import PARTITIONS as CONFIG_PARTITIONS
from fedapp.config.schema import CLASS_ASSIGNMENTS as CONFIG_CLASS_ASSIGNMENTS
from fedapp.data import (
    PARTITIONS,
    SOURCES,
    ArrayDataset,
    ClientSplit,
    imagefolder,
    load_source,
    partition,
    partition_cache,
    partition_indices,
    partitioners,
    sample_external_test,
    sources,
    split_stratified,
)
from fedapp.data.tensors import iterate_batches, to_float_tensor
from fedapp.errors import DataError

COLORS = {"cat": (255, 0, 0), "dog": (0, 0, 255), "eel": (0, 255, 0)}


def _make_imagefolder(root: Path, counts: dict[str, int] | None = None) -> Path:
    """Write solid-colour images (colour = class) so decoded pixels are checkable."""
    counts = counts or {"cat": 3, "dog": 2}
    for name, n in counts.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            # Mixed formats and an upper-case extension: all must be accepted.
            suffix = (".png", ".BMP", ".gif")[i % 3]
            Image.new("RGB", (10, 12), COLORS[name]).save(folder / f"{i}{suffix}")
    return root


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    original = imagefolder._decode_image

    def counting(path: Path, image_size: int) -> np.ndarray:
        calls.append(path)
        return original(path, image_size)

    monkeypatch.setattr(imagefolder, "_decode_image", counting)
    return calls


def _make_tgz(archive: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return archive


def _png_bytes(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (6, 6), color).save(buffer, format="PNG")
    return buffer.getvalue()


# --- ArrayDataset, digits, dispatch ------------------------------------------------


def test_array_dataset_properties_and_validation() -> None:
    images = np.zeros((4, 2, 2, 3), dtype=np.uint8)
    data = ArrayDataset(images=images, labels=np.array([0, 1, 2, 1]), class_names=("a", "b", "c"))
    assert len(data) == 4
    assert data.num_classes == 3
    with pytest.raises(DataError, match="uint8"):
        ArrayDataset(images=images.astype(np.float32), labels=data.labels, class_names=("a", "b", "c"))
    with pytest.raises(DataError, match="labels must lie"):
        ArrayDataset(images=images, labels=np.array([0, 1, 3, 1]), class_names=("a", "b", "c"))


def test_digits_at_native_size_is_scaled_grey_replicated_to_rgb() -> None:
    data = load_source("digits", image_size=8)
    reference = load_digits()
    assert data.images.shape == (1797, 8, 8, 3)
    assert data.images.dtype == np.uint8
    assert data.labels.dtype == np.int64
    assert data.class_names == tuple(str(i) for i in range(10))
    np.testing.assert_array_equal(data.labels, reference.target)
    expected = np.rint(reference.images * 255 / 16).astype(np.uint8)
    for channel in range(3):
        np.testing.assert_array_equal(data.images[..., channel], expected)


def test_digits_resized_and_single_split() -> None:
    data = load_source("digits", image_size=20)
    assert data.images.shape == (1797, 20, 20, 3)
    assert data.images.max() > 200  # still spans the 0..255 range after resizing
    with pytest.raises(DataError, match="test"):
        load_source("digits", split="test")


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_image_size(bad: object) -> None:
    with pytest.raises(DataError, match="image_size"):
        load_source("digits", image_size=bad)  # type: ignore[arg-type]


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(DataError, match="mnist") as info:
        load_source("mnist")
    assert all(name in str(info.value) for name in SOURCES)


# --- imagefolder -------------------------------------------------------------------


def test_imagefolder_decodes_sorted_classes(tmp_path: Path) -> None:
    root = _make_imagefolder(tmp_path / "data", {"dog": 2, "cat": 3})
    (root / "cat" / "notes.txt").write_text("not an image")  # ignored
    data = load_source("imagefolder", data_dir=str(root), image_size=8, cache_dir=str(tmp_path / "c"))
    assert data.class_names == ("cat", "dog")
    assert data.images.shape == (5, 8, 8, 3)
    np.testing.assert_array_equal(np.bincount(data.labels), [3, 2])
    for image, label in zip(data.images, data.labels, strict=True):
        assert (image == COLORS[data.class_names[label]]).all()


def test_imagefolder_second_call_loads_cache_without_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _make_imagefolder(tmp_path / "data")
    cache = tmp_path / "cache"
    calls = _count_decodes(monkeypatch)
    first = load_source("imagefolder", data_dir=str(root), image_size=8, cache_dir=str(cache))
    assert len(calls) == 5
    second = load_source("imagefolder", data_dir=str(root), image_size=8, cache_dir=str(cache))
    assert len(calls) == 5
    np.testing.assert_array_equal(first.images, second.images)
    np.testing.assert_array_equal(first.labels, second.labels)
    assert first.class_names == second.class_names
    assert not list(cache.glob("*.tmp"))  # atomic write left no temporary file
    # A different size or a changed file is a different cache entry.
    load_source("imagefolder", data_dir=str(root), image_size=4, cache_dir=str(cache))
    assert len(calls) == 10
    Image.new("RGB", (3, 3), COLORS["cat"]).save(root / "cat" / "0.png")
    load_source("imagefolder", data_dir=str(root), image_size=8, cache_dir=str(cache))
    assert len(calls) == 15


def test_imagefolder_corrupt_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _make_imagefolder(tmp_path / "data")
    cache = tmp_path / "cache"
    load_source("imagefolder", data_dir=str(root), image_size=8, cache_dir=str(cache))
    (cache_file,) = cache.glob("imagefolder-*.npz")
    cache_file.write_bytes(b"garbage")
    calls = _count_decodes(monkeypatch)
    data = load_source("imagefolder", data_dir=str(root), image_size=8, cache_dir=str(cache))
    assert len(calls) == 5
    assert len(data) == 5


def test_cache_dir_env_var_and_argument_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _make_imagefolder(tmp_path / "data")
    env_dir, arg_dir = tmp_path / "env", tmp_path / "arg"
    monkeypatch.setenv("FEDAPP_CACHE_DIR", str(env_dir))
    load_source("imagefolder", data_dir=str(root), image_size=8)
    assert len(list(env_dir.glob("imagefolder-*.npz"))) == 1
    load_source("imagefolder", data_dir=str(root), image_size=8, cache_dir=str(arg_dir))
    assert len(list(arg_dir.glob("imagefolder-*.npz"))) == 1
    assert len(list(env_dir.glob("imagefolder-*.npz"))) == 1


def test_imagefolder_descends_wrappers_and_picks_split(tmp_path: Path) -> None:
    base = tmp_path / "wrap" / "dataset"
    _make_imagefolder(base / "train", {"cat": 3, "dog": 3})
    _make_imagefolder(base / "test", {"cat": 1, "dog": 2})
    cache = str(tmp_path / "cache")
    test = load_source("imagefolder", data_dir=str(tmp_path / "wrap"), split="test", image_size=4, cache_dir=cache)
    train = load_source("imagefolder", data_dir=str(tmp_path / "wrap"), image_size=4, cache_dir=cache)
    np.testing.assert_array_equal(np.bincount(test.labels), [1, 2])
    np.testing.assert_array_equal(np.bincount(train.labels), [3, 3])
    assert test.class_names == train.class_names == ("cat", "dog")


def test_imagefolder_archive_extracted_once_then_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    members = {f"train/{name}/{i}.png": _png_bytes(COLORS[name]) for name in ("cat", "eel") for i in range(2)}
    archive = _make_tgz(tmp_path / "data.tar.gz", members)
    cache = tmp_path / "cache"
    calls = _count_decodes(monkeypatch)
    first = load_source("imagefolder", data_dir=str(archive), image_size=6, cache_dir=str(cache))
    assert first.class_names == ("cat", "eel")
    assert len(calls) == 4
    assert len(list((cache / "extracted").iterdir())) == 1

    def no_extraction(*_: object) -> Path:
        raise AssertionError("cache hit must not extract again")

    monkeypatch.setattr(imagefolder, "extract_archive", no_extraction)
    second = load_source("imagefolder", data_dir=str(archive), image_size=6, cache_dir=str(cache))
    assert len(calls) == 4
    np.testing.assert_array_equal(first.images, second.images)


def test_missing_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match="does not exist") as info:
        load_source("imagefolder", data_dir=str(missing), cache_dir=str(tmp_path / "c"))
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("with_files", [False, True])
def test_folder_without_class_subfolders(tmp_path: Path, with_files: bool) -> None:
    root = tmp_path / "flat"
    root.mkdir()
    if with_files:
        Image.new("RGB", (4, 4)).save(root / "loose.png")
    with pytest.raises(DataError, match="no class subfolders"):
        load_source("imagefolder", data_dir=str(root), cache_dir=str(tmp_path / "c"))


def test_class_folder_without_images_is_named(tmp_path: Path) -> None:
    root = _make_imagefolder(tmp_path / "data")
    (root / "zebra").mkdir()
    (root / "zebra" / "readme.txt").write_text("no pictures here")
    with pytest.raises(DataError, match="zebra"):
        load_source("imagefolder", data_dir=str(root), cache_dir=str(tmp_path / "c"))


def test_corrupt_image_is_named_at_load(tmp_path: Path) -> None:
    root = _make_imagefolder(tmp_path / "data")
    (root / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 definitely not a jpeg")
    with pytest.raises(DataError, match=r"broken\.jpg"):
        load_source("imagefolder", data_dir=str(root), cache_dir=str(tmp_path / "c"))


def test_plain_file_is_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "data.zip"
    path.write_bytes(b"PK")
    with pytest.raises(DataError, match="not a"):
        load_source("imagefolder", data_dir=str(path), cache_dir=str(tmp_path / "c"))


@pytest.mark.parametrize("name", ["../evil/cat/0.png", "/tmp/evil/cat/0.png", "a/../../cat/0.png"])
def test_unsafe_archive_member_is_refused(tmp_path: Path, name: str) -> None:
    archive = _make_tgz(tmp_path / "evil.tgz", {name: _png_bytes(COLORS["cat"])})
    with pytest.raises(DataError, match="unsafe member"):
        load_source("imagefolder", data_dir=str(archive), cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "evil").exists()


def test_archive_link_member_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "link.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("cat/0.png")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(DataError, match="link"):
        load_source("imagefolder", data_dir=str(archive), cache_dir=str(tmp_path / "c"))


# --- cifar and hf --------------------------------------------------------------------


def test_cifar_missing_files_without_download(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="download=true") as info:
        load_source("cifar10", data_dir=str(tmp_path), download=False)
    assert "data-dir" in str(info.value)
    with pytest.raises(DataError, match="splits"):
        load_source("cifar100", data_dir=str(tmp_path), split="validation")


def test_cifar_is_converted_and_resized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision.datasets  # noqa: PLC0415 - patched for this test only

    seen: dict[str, object] = {}

    class FakeCifar:
        base_folder = "cifar-100-python"

        def __init__(self, root: str, train: bool, download: bool) -> None:
            seen.update(root=root, train=train, download=download)
            self.classes = ["apple", "bee"]
            self.data = np.full((3, 32, 32, 3), 7, dtype=np.uint8)
            self.targets = [1, 0, 1]

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", FakeCifar)
    data = load_source("cifar100", data_dir=str(tmp_path), split="test", image_size=16)
    assert seen == {"root": str(tmp_path), "train": False, "download": False}
    assert data.images.shape == (3, 16, 16, 3)
    assert (data.images == 7).all()
    np.testing.assert_array_equal(data.labels, [1, 0, 1])
    assert data.class_names == ("apple", "bee")


@pytest.mark.filterwarnings("ignore:The currently tested dataset")
def test_hf_loads_local_imagefolder_through_flwr_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr_datasets.common import telemetry  # noqa: PLC0415 - patched for this test only

    monkeypatch.setattr(telemetry, "FLWR_TELEMETRY_ENABLED", "0")  # no network in tests
    root = _make_imagefolder(tmp_path / "data", {"cat": 2, "eel": 3})
    data = load_source("hf", hf_name="imagefolder", data_dir=str(root), image_size=5, cache_dir=str(tmp_path / "c"))
    assert data.class_names == ("cat", "eel")
    assert data.images.shape == (5, 5, 5, 3)
    np.testing.assert_array_equal(np.bincount(data.labels), [2, 3])
    for image, label in zip(data.images, data.labels, strict=True):
        assert (image == COLORS[data.class_names[label]]).all()


def test_hf_needs_a_name() -> None:
    with pytest.raises(DataError, match="hf_name"):
        load_source("hf")


def _hf_table(**extra_columns: list) -> object:
    """An in-memory Hugging Face split shaped like CIFAR-100's: ``img`` and two class-label columns."""
    import datasets  # noqa: PLC0415 - seconds to import; only these tests need it

    colours = ["cat", "dog", "eel", "cat"]
    features = {
        "img": datasets.Image(),
        "fine_label": datasets.ClassLabel(names=["cat", "dog", "eel"]),
        "coarse_label": datasets.ClassLabel(names=["furry", "scaly"]),
        **{
            name: datasets.Value("string" if isinstance(values[0], str) else "int64")
            for name, values in extra_columns.items()
        },
    }
    columns = {
        "img": [Image.new("RGB", (6, 4), COLORS[c]) for c in colours],
        "fine_label": [0, 1, 2, 0],
        "coarse_label": [0, 0, 1, 0],
        **extra_columns,
    }
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


def test_hf_label_column_is_not_guessed_between_two_class_labels() -> None:
    with pytest.raises(DataError) as info:
        sources.hf_table_to_arrays(_hf_table(), image_size=4, name="toy/cifar100")
    message = str(info.value)
    assert "'toy/cifar100' has 2 label columns (fine_label, coarse_label)" in message
    assert message.endswith("set hf-label-column to one of them")


@pytest.mark.parametrize(
    ("column", "labels", "names"),
    [("fine_label", [0, 1, 2, 0], ("cat", "dog", "eel")), ("coarse_label", [0, 0, 1, 0], ("furry", "scaly"))],
)
def test_hf_label_column_picks_the_labels_and_their_names(column: str, labels: list, names: tuple) -> None:
    data = sources.hf_table_to_arrays(_hf_table(), image_size=4, label_column=column, name="toy/cifar100")
    np.testing.assert_array_equal(data.labels, labels)
    assert data.class_names == names and data.images.shape == (4, 4, 4, 3)
    for image, colour in zip(data.images, ["cat", "dog", "eel", "cat"], strict=True):
        assert (image == COLORS[colour]).all()  # the only Image column was found by its feature


def test_hf_columns_that_are_not_in_the_split_are_named_with_the_key_and_the_columns() -> None:
    table = _hf_table()
    with pytest.raises(DataError) as info:
        sources.hf_table_to_arrays(table, image_size=4, label_column="label", name="toy/cifar100")
    assert str(info.value) == (
        "config key 'hf-label-column' = 'label' is not a column of Hugging Face dataset 'toy/cifar100'; "
        "its columns: img, fine_label, coarse_label"
    )
    with pytest.raises(DataError, match=r"^config key 'hf-image-column' = 'image' is not a column .*: img, fine_label"):
        sources.hf_table_to_arrays(table, image_size=4, image_column="image", label_column="fine_label")


def test_hf_split_without_an_image_column_names_the_key_and_the_columns() -> None:
    table = _hf_table().remove_columns("img").add_column("picture_path", ["a", "b", "c", "d"])
    with pytest.raises(DataError) as info:
        sources.hf_table_to_arrays(table, image_size=4, label_column="fine_label", name="toy")
    assert "has no image column (no Image feature, none named img or image; its columns: " in str(info.value)
    assert "fine_label, coarse_label, picture_path): set hf-image-column" in str(info.value)
    with pytest.raises(
        DataError, match="image column 'picture_path' of Hugging Face dataset 'toy' does not hold images"
    ):
        sources.hf_table_to_arrays(
            table, image_size=4, image_column="picture_path", label_column="fine_label", name="toy"
        )


def test_hf_integer_label_column_by_its_usual_name_and_a_text_column_refused() -> None:
    table = _hf_table(label=[3, 1, 0, 3]).remove_columns(["fine_label", "coarse_label"])
    data = sources.hf_table_to_arrays(table, image_size=4)  # no ClassLabel: the integer column named label
    np.testing.assert_array_equal(data.labels, [3, 1, 0, 3])
    assert data.class_names == ("0", "1", "2", "3")
    with pytest.raises(DataError, match=r"label column 'caption' .* not class indices: set hf-label-column"):
        sources.hf_table_to_arrays(_hf_table(caption=["a", "b", "c", "d"]), image_size=4, label_column="caption")


def test_hf_columns_are_part_of_the_source_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs in one process that differ only in hf-label-column get their own labels, not a cached copy."""
    from fedapp import clientdata  # noqa: PLC0415 - the client side of loading, with its per-process caches
    from fedapp.config import resolve_run_config  # noqa: PLC0415

    loaded: list[str] = []

    def local_split(hf_name: str, **_: object) -> object:
        loaded.append(hf_name)
        return _hf_table()

    monkeypatch.setattr(sources, "_load_hf_split", local_split)
    base = {"dataset": "hf", "hf-name": "toy/cifar100-cache-key", "image-size": 8}
    fine = clientdata.load_dataset(resolve_run_config({**base, "hf-label-column": "fine_label"}))
    coarse = clientdata.load_dataset(resolve_run_config({**base, "hf-label-column": "coarse_label"}))
    assert fine.class_names == ("cat", "dog", "eel") and coarse.class_names == ("furry", "scaly")
    again = clientdata.load_dataset(resolve_run_config({**base, "hf-label-column": "fine_label"}))
    assert again is fine and loaded == ["toy/cifar100-cache-key"] * 2


# --- partitions ------------------------------------------------------------------------


@pytest.fixture
def labels() -> np.ndarray:
    return np.random.default_rng(0).permutation(np.repeat(np.arange(10), 100))


def _assert_disjoint(parts: list[np.ndarray], total: int, *, covering: bool) -> None:
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)
    assert joined.min() >= 0 and joined.max() < total
    if covering:
        assert len(joined) == total
    for part in parts:
        assert part.dtype == np.int64
        assert (np.diff(part) > 0).all()  # sorted


def _mean_label_entropy(parts: list[np.ndarray], labels: np.ndarray) -> float:
    entropies = []
    for part in parts:
        p = np.bincount(labels[part], minlength=10) / len(part)
        p = p[p > 0]
        entropies.append(float(-(p * np.log(p)).sum()))
    return float(np.mean(entropies))


def test_iid_sizes_nearly_equal(labels: np.ndarray) -> None:
    parts = partition_indices(labels, 7, "iid")
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    _assert_disjoint(parts, len(labels), covering=True)
    assert _mean_label_entropy(parts, labels) > 0.95 * np.log(10)


def test_pathological_gives_exactly_k_labels(labels: np.ndarray) -> None:
    parts = partition_indices(labels, 10, "pathological", classes_per_client=3)
    for part in parts:
        assert len(np.unique(labels[part])) == 3
    _assert_disjoint(parts, len(labels), covering=True)


def _class_sets(labels: np.ndarray, seed: int, assignment: str) -> list[tuple[int, ...]]:
    parts = partition_indices(labels, 10, "pathological", seed=seed, class_assignment=assignment)
    return [tuple(np.unique(labels[part]).tolist()) for part in parts]


def test_pathological_class_sets_are_drawn_by_the_seed_by_default(labels: np.ndarray) -> None:
    # The old fixed assignment gave client i the classes i, i+1 under every seed, so
    # "3 seeds" never varied which classes a client held.
    by_seed = [_class_sets(labels, seed, "first-deterministic") for seed in (0, 1, 2)]
    assert by_seed[0] != by_seed[1] or by_seed[1] != by_seed[2]
    assert partition_indices(labels, 10, "pathological", seed=1)[3].tolist() == (
        partition_indices(labels, 10, "pathological", seed=1, class_assignment="first-deterministic")[3].tolist()
    )
    for sets in by_seed:
        assert [pair[0] == client or client in pair for client, pair in enumerate(sets)] == [True] * 10
        assert set().union(*sets) == set(range(10))  # every class has a client
    fixed = [_class_sets(labels, seed, "deterministic") for seed in (0, 1, 2)]
    assert fixed[0] == fixed[1] == fixed[2] == [tuple(sorted((i, (i + 1) % 10))) for i in range(10)]


def test_random_class_sets_name_the_classes_no_client_holds(
    labels: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    partition._partition_cached.cache_clear()
    drawn = {}
    for seed in (0, 1, 2):
        caplog.clear()
        drawn[seed] = _class_sets(labels, seed, "random")
        unused = sorted(set(range(10)) - set().union(*drawn[seed]))
        named = [r.getMessage() for r in caplog.records if "gave no client the classes" in r.getMessage()]
        assert len(named) == (1 if unused else 0)
        assert not unused or named[0].startswith(f"class-assignment = random gave no client the classes {unused}")
    assert drawn[0] != drawn[1] and all(len(pair) == 2 for pair in drawn[0])
    assert any(len(set().union(*sets)) < 10 for sets in drawn.values())  # the case the warning is for


def test_unknown_class_assignment_is_named(labels: np.ndarray) -> None:
    with pytest.raises(DataError, match=r"class_assignment must be one of .*'cyclic'"):
        partition_indices(labels, 10, "pathological", class_assignment="cyclic")


def test_config_class_assignments_match_the_data_layer() -> None:
    assert CONFIG_CLASS_ASSIGNMENTS == partitioners.CLASS_ASSIGNMENTS


def test_dirichlet_skew_grows_as_alpha_shrinks(labels: np.ndarray) -> None:
    skewed = partition_indices(labels, 10, "dirichlet", alpha=0.1)
    flat = partition_indices(labels, 10, "dirichlet", alpha=100.0)
    assert _mean_label_entropy(skewed, labels) < _mean_label_entropy(flat, labels) - 0.5
    _assert_disjoint(skewed, len(labels), covering=True)
    _assert_disjoint(flat, len(labels), covering=True)
    assert min(len(p) for p in skewed) >= 10  # the automatic min_partition_size


def test_partitioning_is_pure_and_seeded(labels: np.ndarray) -> None:
    first = partition_indices(labels, 5, "dirichlet", alpha=0.5, seed=3)
    partition._partition_cached.cache_clear()  # recompute, not just a cache hit
    again = partition_indices(labels.copy(), 5, "dirichlet", alpha=0.5, seed=3)
    other = partition_indices(labels, 5, "dirichlet", alpha=0.5, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_partition_cache_hits_and_returns_copies(labels: np.ndarray) -> None:
    partition._partition_cached.cache_clear()
    first = partition_indices(labels, 4, "iid", seed=1)
    first[0][:] = -1
    second = partition_indices(labels, 4, "iid", seed=1)
    assert partition._partition_cached.cache_info().hits == 1
    assert (second[0] >= 0).all()


def test_partition_disk_cache_is_read_back_without_partitioning_again(
    labels: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition._partition_cached.cache_clear()
    first = partition_indices(labels, 5, "dirichlet", alpha=0.5, seed=3, cache_dir=tmp_path)
    files = list((tmp_path / "partitions").glob("*.npz"))
    assert len(files) == 1
    partition._partition_cached.cache_clear()  # a new process: only the disk remains

    def refuse(*args, **kwargs):
        raise AssertionError("partitioned again instead of reading the cache")

    monkeypatch.setattr(partitioners, "compute_parts", refuse)
    again = partition_indices(labels, 5, "dirichlet", alpha=0.5, seed=3, cache_dir=tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    # Other arguments are another file: computing it is what the stand-in refuses.
    with pytest.raises(AssertionError, match="partitioned again"):
        partition_indices(labels, 5, "dirichlet", alpha=0.5, seed=4, cache_dir=tmp_path)


def test_partition_disk_cache_that_is_corrupt_or_foreign_is_recomputed(labels: np.ndarray, tmp_path: Path) -> None:
    partition._partition_cached.cache_clear()
    expected = partition_indices(labels, 4, "iid", seed=1)
    partition._partition_cached.cache_clear()
    partition_indices(labels, 4, "iid", seed=1, cache_dir=tmp_path)
    (cached,) = (tmp_path / "partitions").glob("*.npz")
    for content in (b"not a zip", None):
        if content is None:  # a valid file that holds 3 partitions instead of 4
            np.savez(cached, indices=np.arange(10), offsets=np.array([0, 3, 6, 10]))
        else:
            cached.write_bytes(content)
        partition._partition_cached.cache_clear()
        got = partition_indices(labels, 4, "iid", seed=1, cache_dir=tmp_path)
        assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


def test_partition_cache_files_round_trip_and_are_named_by_every_input(tmp_path: Path) -> None:
    arguments = {"alpha": 0.5, "seed": 3}
    path = partition_cache.cache_path(tmp_path, "digest", 3, "dirichlet", arguments)
    assert path.parent == tmp_path / "partitions" and path.suffix == ".npz"
    others = [
        partition_cache.cache_path(tmp_path, "other digest", 3, "dirichlet", arguments),
        partition_cache.cache_path(tmp_path, "digest", 4, "dirichlet", arguments),
        partition_cache.cache_path(tmp_path, "digest", 3, "iid", arguments),
        partition_cache.cache_path(tmp_path, "digest", 3, "dirichlet", {**arguments, "seed": 4}),
    ]
    assert len({path, *others}) == 5
    assert partition_cache.read_parts(path, 3, 10) is None  # absent
    parts = (np.array([0, 4], np.int64), np.array([1, 2, 3], np.int64), np.array([5], np.int64))
    partition_cache.write_parts(path, parts)
    read = partition_cache.read_parts(path, 3, 10)
    assert read is not None and all(np.array_equal(a, b) for a, b in zip(parts, read, strict=True))
    assert not any(part.flags.writeable for part in read)
    assert partition_cache.read_parts(path, 2, 10) is None  # another number of clients
    assert partition_cache.read_parts(path, 3, 5) is None  # indices beyond these samples


def test_partitioners_compute_read_only_sorted_parts_directly(labels: np.ndarray) -> None:
    arguments = {"alpha": 0.3, "classes_per_client": 2, "shards_per_client": 2, "seed": 1, "min_partition_size": 0}
    parts = partitioners.compute_parts(labels, 4, "iid", **arguments)
    assert [len(part) for part in parts] == [250] * 4
    assert all(np.array_equal(part, np.sort(part)) and not part.flags.writeable for part in parts)
    partition._partition_cached.cache_clear()
    via_partition = partition_indices(labels, 4, "iid", seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, via_partition, strict=True))


def test_digits_are_cached_and_read_back_equal(tmp_path: Path) -> None:
    first = load_source("digits", image_size=16, cache_dir=str(tmp_path))
    (cached,) = tmp_path.glob("digits-*-16px.npz")
    again = load_source("digits", image_size=16, cache_dir=str(tmp_path))
    assert np.array_equal(first.images, again.images) and np.array_equal(first.labels, again.labels)
    assert again.class_names == first.class_names == tuple(str(d) for d in range(10))
    assert cached.stat().st_size > 0


def test_shard_partitions_hold_few_labels(labels: np.ndarray) -> None:
    parts = partition_indices(labels, 10, "shard", shards_per_client=2)
    # 1000 samples / 20 shards: each shard is a 50-sample slice of the label-sorted data.
    assert [len(p) for p in parts] == [100] * 10
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)
    _assert_disjoint(parts, len(labels), covering=False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_partitions": 3, "scheme": "zipf"}, "unknown partition scheme"),
        ({"num_partitions": 0, "scheme": "iid"}, "num_partitions"),
        ({"num_partitions": 1001, "scheme": "iid"}, "num_partitions"),
        ({"num_partitions": 3, "scheme": "pathological", "classes_per_client": 11}, "classes_per_client"),
        ({"num_partitions": 3, "scheme": "dirichlet", "alpha": 0.0}, "alpha"),
        ({"num_partitions": 600, "scheme": "shard", "shards_per_client": 2}, "shards"),
    ],
)
def test_partition_argument_errors(labels: np.ndarray, kwargs: dict, match: str) -> None:
    with pytest.raises(DataError, match=match):
        partition_indices(labels, **kwargs)


def test_dirichlet_that_cannot_fill_every_client_suggests_a_fix() -> None:
    tiny = np.array([0] * 10 + [1] * 10)
    with pytest.raises(DataError, match="larger alpha"):
        partition_indices(tiny, 10, "dirichlet", alpha=0.01)


def test_empty_partition_is_named(labels: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    class HalfEmpty:
        dataset = None

        def load_partition(self, pid: int) -> dict[str, list[int]]:
            return {"idx": [] if pid == 1 else [pid]}

    monkeypatch.setattr(partitioners, "make_partitioner", lambda *_, **__: HalfEmpty())
    partition._partition_cached.cache_clear()
    with pytest.raises(DataError, match="partition 1 of 3 got zero samples"):
        partition_indices(labels, 3, "iid", seed=99)
    partition._partition_cached.cache_clear()


def test_partition_names() -> None:
    assert PARTITIONS == ("iid", "dirichlet", "pathological", "shard", "domain")
    assert PARTITIONS == CONFIG_PARTITIONS


# --- per-client splits ----------------------------------------------------------------


@pytest.fixture
def client() -> tuple[np.ndarray, np.ndarray]:
    """A client with 200 samples over 4 classes (100/50/30/20) inside a larger dataset."""
    rng = np.random.default_rng(1)
    global_labels = rng.integers(0, 6, size=2000)
    picks = [
        rng.choice(np.flatnonzero(global_labels == c), n, replace=False)
        for c, n in zip((0, 2, 3, 5), (100, 50, 30, 20), strict=True)
    ]
    return np.concatenate(picks), global_labels


def test_split_keeps_label_proportions(client: tuple[np.ndarray, np.ndarray]) -> None:
    indices, labels = client
    split = split_stratified(indices, labels, (0.8, 0.1, 0.1), seed=0)
    assert isinstance(split, ClientSplit)
    joined = np.concatenate([split.train, split.val, split.test])
    assert len(np.unique(joined)) == len(joined) == len(indices)
    assert set(joined) == set(indices)
    for cls, n in zip((0, 2, 3, 5), (100, 50, 30, 20), strict=True):
        assert abs(np.sum(labels[split.test] == cls) - 0.1 * n) <= 1
        assert abs(np.sum(labels[split.val] == cls) - 0.1 * n) <= 1
        assert abs(np.sum(labels[split.train] == cls) - 0.8 * n) <= 1
    for part in (split.train, split.val, split.test):
        assert part.dtype == np.int64


def test_split_small_classes_go_to_train_first() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2, 2, 2])
    split = split_stratified(np.arange(8), labels, (0.8, 0.1, 0.1))
    # Class 0 (1 sample) and class 1 (2 samples) stay whole in train; class 2
    # (5 samples) gives 4 to train and its tied 0.5/0.5 remainder to val, not test.
    np.testing.assert_array_equal(np.bincount(labels[split.train], minlength=3), [1, 2, 4])
    np.testing.assert_array_equal(labels[split.val], [2])
    assert len(split.test) == 0


def test_split_with_zero_test_share(client: tuple[np.ndarray, np.ndarray]) -> None:
    indices, labels = client
    split = split_stratified(indices, labels, (0.9, 0.1, 0.0), seed=2)
    assert len(split.test) == 0
    assert len(split.train) == 180 and len(split.val) == 20


def test_split_is_deterministic_per_seed(client: tuple[np.ndarray, np.ndarray]) -> None:
    indices, labels = client
    a = split_stratified(indices, labels, seed=5)
    b = split_stratified(indices[::-1].copy(), labels, seed=5)
    c = split_stratified(indices, labels, seed=6)
    np.testing.assert_array_equal(a.test, split_stratified(indices, labels, seed=5).test)
    assert not np.array_equal(a.test, c.test)
    assert len(b.test) == len(a.test)


@pytest.mark.parametrize(
    ("indices", "fractions", "match"),
    [
        (np.arange(10), (0.5, 0.5), "three"),
        (np.arange(10), (0.8, 0.3, 0.1), "sum to 1"),
        (np.arange(10), (1.1, -0.1, 0.0), "non-negative"),
        (np.array([1, 1, 2]), (0.8, 0.1, 0.1), "duplicates"),
        (np.array([5, 50]), (0.8, 0.1, 0.1), "indices must lie"),
    ],
)
def test_split_errors(indices: np.ndarray, fractions: tuple, match: str) -> None:
    with pytest.raises(DataError, match=match):
        split_stratified(indices, np.zeros(20, dtype=np.int64), fractions)


def test_external_test_sample_matches_train_distribution() -> None:
    train_labels = np.array([0] * 60 + [2] * 40)
    pool = np.repeat(np.arange(4), 100)
    picked = sample_external_test(train_labels, pool, size=50, seed=0)
    assert len(np.unique(picked)) == len(picked) == 50
    np.testing.assert_array_equal(np.bincount(pool[picked], minlength=4), [30, 0, 20, 0])
    np.testing.assert_array_equal(picked, sample_external_test(train_labels, pool, size=50, seed=0))
    assert not np.array_equal(picked, sample_external_test(train_labels, pool, size=50, seed=1))


def test_external_test_sample_is_capped_by_the_pool() -> None:
    train_labels = np.array([0] * 3 + [1] * 1)
    pool = np.array([0] * 100 + [1] * 5 + [2] * 100)
    picked = sample_external_test(train_labels, pool, size=40, seed=0)
    np.testing.assert_array_equal(np.bincount(pool[picked], minlength=3), [30, 5, 0])
    with pytest.raises(DataError, match="empty"):
        sample_external_test(np.array([], dtype=np.int64), pool, size=4, seed=0)
    with pytest.raises(DataError, match="size"):
        sample_external_test(train_labels, pool, size=-1, seed=0)


# --- tensors ------------------------------------------------------------------------------


def test_to_float_tensor_layout_and_normalisation() -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(2, 3, 4, 3), dtype=np.uint8)
    images[0, 0, 0] = (0, 255, 128)
    tensor = to_float_tensor(images)
    assert tensor.shape == (2, 3, 3, 4) and tensor.dtype == torch.float32
    assert tensor[0, :, 0, 0].tolist() == pytest.approx([-1.0, 1.0, 128 / 255 * 2 - 1], abs=1e-6)
    np.testing.assert_allclose(tensor[1, 2, 1, 3].item(), images[1, 1, 3, 2] / 127.5 - 1, atol=1e-6)
    with pytest.raises(DataError, match="uint8"):
        to_float_tensor(images.astype(np.float32))


def test_iterate_batches_in_order_without_shuffle() -> None:
    x, y = torch.arange(10).float().unsqueeze(1), torch.arange(10)
    batches = list(iterate_batches(x, y, 4, shuffle=False))
    assert [len(b[1]) for b in batches] == [4, 4, 2]
    assert torch.cat([b[1] for b in batches]).tolist() == list(range(10))


def test_iterate_batches_shuffle_covers_once_and_follows_generator() -> None:
    x, y = torch.arange(23).float().unsqueeze(1), torch.arange(23)

    def epoch(generator: torch.Generator) -> list[int]:
        order = []
        for xb, yb in iterate_batches(x, y, 5, shuffle=True, generator=generator):
            assert torch.equal(xb.squeeze(1).long(), yb)  # pairs stay aligned
            order.extend(yb.tolist())
        return order

    gen = torch.Generator().manual_seed(0)
    first, second = epoch(gen), epoch(gen)
    assert sorted(first) == sorted(second) == list(range(23))
    assert first != second  # the generator advances between epochs
    assert epoch(torch.Generator().manual_seed(0)) == first
    assert epoch(torch.Generator().manual_seed(1)) != first


def test_iterate_batches_errors() -> None:
    with pytest.raises(DataError, match="length"):
        list(iterate_batches(torch.zeros(3, 1), torch.zeros(2), 2, shuffle=False))
    with pytest.raises(DataError, match="batch_size"):
        list(iterate_batches(torch.zeros(3, 1), torch.zeros(3), 0, shuffle=False))
