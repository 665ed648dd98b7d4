"""The reserve carve: pretraining, test and federated images never meet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedapp.clientdata import check_data, load_client_data, load_dataset, shared_test_pool
from fedapp.config import resolve_run_config
from fedapp.data.reserve import reserve_parts
from fedapp.errors import ConfigError, DataError

CLASSES = ("ant", "bee", "cow")
PER_CLASS = 40


def _numbered_images(root: Path) -> Path:
    """An ImageFolder whose every image carries a unique id in its first two pixels' red values."""
    ident = 0
    for cls in CLASSES:
        (root / cls).mkdir(parents=True)
        for _ in range(PER_CLASS):
            pixels = np.full((32, 32, 3), 128, dtype=np.uint8)
            pixels[0, 0, 0], pixels[0, 1, 0] = divmod(ident, 256)
            Image.fromarray(pixels).save(root / cls / f"{ident}.png")
            ident += 1
    return root


def _ids(images: np.ndarray) -> set[int]:
    return {int(a) * 256 + int(b) for a, b in zip(images[:, 0, 0, 0], images[:, 0, 1, 0], strict=True)}


def test_parts_are_disjoint_stratified_and_cover_the_source() -> None:
    labels = np.repeat(np.arange(4), [50, 30, 20, 10])
    parts = reserve_parts(labels, pretrain=0.4, test=0.2, seed=3)
    together = np.concatenate([parts.pretrain, parts.test, parts.federated])
    assert sorted(together.tolist()) == list(range(len(labels)))
    for cls, count in enumerate([50, 30, 20, 10]):
        assert np.sum(labels[parts.pretrain] == cls) == round(0.4 * count)
        assert np.sum(labels[parts.test] == cls) == round(0.2 * count)
    again = reserve_parts(labels, pretrain=0.4, test=0.2, seed=3)
    np.testing.assert_array_equal(parts.pretrain, again.pretrain)
    other = reserve_parts(labels, pretrain=0.4, test=0.2, seed=4)
    assert not np.array_equal(parts.pretrain, other.pretrain)


@pytest.mark.parametrize(("pretrain", "test", "message"), [(1.0, 0.0, "reserve-pretrain"), (0.6, 0.4, "no data")])
def test_bad_shares_are_refused(pretrain: float, test: float, message: str) -> None:
    with pytest.raises(DataError, match=message):
        reserve_parts(np.zeros(10, dtype=np.int64), pretrain=pretrain, test=test, seed=0)


def test_no_client_sees_a_pretraining_image_and_tests_only_on_the_reserved_test_part(tmp_path: Path) -> None:
    root = _numbered_images(tmp_path / "data")
    config = resolve_run_config(
        {
            "dataset": "imagefolder",
            "data-dir": str(root),
            "cache-dir": str(tmp_path / "cache"),
            "reserve-pretrain": 0.5,
            "reserve-test": 0.25,
            "partition": "iid",
            "num-partitions": 3,
        }
    )
    full = load_dataset(resolve_run_config({"dataset": "imagefolder", "data-dir": str(root)}))
    parts = reserve_parts(full.labels, pretrain=0.5, test=0.25, seed=0)
    pretrain_ids, test_ids = _ids(full.images[parts.pretrain]), _ids(full.images[parts.test])
    assert len(pretrain_ids) == 60 and len(test_ids) == 30

    federated = check_data(config, 3)
    assert len(federated) == 30 and not _ids(federated.images) & (pretrain_ids | test_ids)
    pool, where = shared_test_pool(config)
    assert _ids(pool.images) == test_ids and "reserve-test" in where
    seen_in_training: set[int] = set()
    for pid in range(3):
        client = load_client_data(config, pid, 3)
        trained = _ids(client.splits["train"].images) | _ids(client.splits["val"].images)
        assert not trained & pretrain_ids and not trained & test_ids
        assert _ids(client.splits["test"].images) <= test_ids
        seen_in_training |= trained
    assert seen_in_training == _ids(federated.images)


def test_reserve_test_and_test_data_dir_cannot_both_be_set(tmp_path: Path) -> None:
    root = _numbered_images(tmp_path / "data")
    with pytest.raises(ConfigError, match="'reserve-test' and 'test-data-dir'"):
        resolve_run_config(
            {"dataset": "imagefolder", "data-dir": str(root), "test-data-dir": str(root), "reserve-test": 0.1}
        )
    with pytest.raises(ConfigError, match="leave no data"):
        resolve_run_config({"reserve-pretrain": 0.7, "reserve-test": 0.3})


def test_local_split_sets_each_clients_train_val_test_shares() -> None:
    config = resolve_run_config({"local-split": "0.75,0,0.25", "partition": "iid", "num-partitions": 4})
    client = load_client_data(config, 0, 4)
    sizes = {name: len(split) for name, split in client.splits.items()}
    total = sum(sizes.values())
    assert sizes["val"] == 0 and abs(sizes["test"] / total - 0.25) < 0.03
    for bad in ("0.5,0.5", "0.9,0.2,-0.1", "0,0.5,0.5", "a,b,c"):
        with pytest.raises(ConfigError, match="'local-split'"):
            resolve_run_config({"local-split": bad})
