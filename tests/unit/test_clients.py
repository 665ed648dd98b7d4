"""Clients on their own (no Flower runtime): training, evaluation, personal state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedapp.clientdata import load_client_data, partition
from fedapp.clients.fedavg import FedAvgClient
from fedapp.clients.standalone import StandaloneClient
from fedapp.config import resolve_run_config
from fedapp.params import get_arrays
from fedapp.state import DiskStateStore, MemoryStateStore


@pytest.fixture(scope="module")
def config():
    return resolve_run_config({"model": "cnn-5", "num-partitions": 4, "partition": "iid"})


@pytest.fixture(scope="module")
def data(config):
    return load_client_data(config, 1, 4)


def test_client_data_split_is_8_1_1_of_its_partition(data):
    sizes = np.array([len(data.train), len(data.val), len(data.test)])
    assert sizes.sum() > 400  # a quarter of 1,797 digits
    np.testing.assert_allclose(sizes / sizes.sum(), [0.8, 0.1, 0.1], atol=0.02)
    assert data.train.x.shape[1:] == (3, 32, 32) and data.train.x.dtype == torch.float32


def test_a_process_partitions_the_source_once_for_all_the_clients_it_serves(monkeypatch):
    """A simulation worker builds one client after another; the partition of the whole label
    array (checks, hash, one copy per client) is computed once, not per client."""
    from fedapp import clientdata  # noqa: PLC0415 - its module-level helpers are what is counted

    config = resolve_run_config({"num-partitions": 6, "partition": "pathological", "seed": 7})
    computed = []
    monkeypatch.setattr(clientdata, "partition", lambda *args: computed.append(args) or partition(*args))
    clientdata._partition_cached.cache_clear()
    clientdata._client_data_cached.cache_clear()
    clients = [load_client_data(config, p, 6) for p in range(6)]
    assert len(computed) == 1
    expected = partition(config, clientdata.load_dataset(config), 6)
    for client, indices in zip(clients, expected, strict=True):
        train_labels = client.train.y.numpy()
        assert set(train_labels) <= set(clientdata.load_dataset(config).labels[indices])
    assert all(not part.flags.writeable for part in clientdata._partition_cached(config, 6))


def test_fedavg_client_returns_a_trained_model_of_the_same_layout(config, data):
    client = FedAvgClient(config, data, MemoryStateStore({}), torch.device("cpu"))
    start = get_arrays(client.new_model())
    arrays, n, metrics = client.fit(start, {"server-round": 1})
    assert n == len(data.train) and np.isfinite(metrics["train_loss"])
    assert [a.shape for a in arrays] == [a.shape for a in start]
    assert any(not np.array_equal(a, b) for a, b in zip(arrays, start, strict=True))
    _loss, n_test, eval_metrics = client.evaluate(arrays, {"server-round": 1})
    assert n_test == len(data.test) and 0.0 <= eval_metrics["accuracy"] <= 1.0


def test_fedavg_client_is_deterministic_for_a_seed_round_and_partition(config, data):
    client = FedAvgClient(config, data, MemoryStateStore({}), torch.device("cpu"))
    start = get_arrays(client.new_model())
    first, _, _ = client.fit(start, {"server-round": 3})
    second, _, _ = client.fit(start, {"server-round": 3})
    other, _, _ = client.fit(start, {"server-round": 4})
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_standalone_model_persists_between_client_instances(config, data, tmp_path, backend):
    store = MemoryStateStore({}) if backend == "memory" else DiskStateStore(tmp_path, "run", 1)
    # Flower builds a new client object every round; only the store carries over.
    first = StandaloneClient(config, data, store, torch.device("cpu"))
    params, _, metrics = first.fit([], {"server-round": 1})
    assert params == [] and metrics["personal_rounds"] == 1
    trained = get_arrays(first.load_personal_model())
    assert any(not np.array_equal(a, b) for a, b in zip(trained, get_arrays(first.new_model()), strict=True))
    second = StandaloneClient(config, data, store, torch.device("cpu"))
    assert all(np.array_equal(a, b) for a, b in zip(get_arrays(second.load_personal_model()), trained, strict=True))
    _, _, metrics = second.fit([], {"server-round": 2})
    assert metrics["personal_rounds"] == 2


def _image_folder(root, counts: dict[str, int], seed: int = 0):
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    for name, count in counts.items():
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def test_node_local_data_dir_replaces_the_partition(tmp_path):
    shared = _image_folder(tmp_path / "shared", {"cat": 30, "dog": 30})
    local = _image_folder(tmp_path / "local", {"cat": 8, "dog": 12}, seed=1)
    config = resolve_run_config(
        {"dataset": "imagefolder", "data-dir": str(shared), "model": "cnn-5", "cache-dir": str(tmp_path / "cache")}
    )
    data = load_client_data(config, 0, 2, local_data_dir=str(local))
    assert len(data.train) + len(data.val) + len(data.test) == 20
    assert data.class_names == ("cat", "dog")
    assert data.label_counts().tolist() == [6, 10]  # 8:1:1 of 8 cats and 12 dogs, per class


def test_external_test_split_follows_the_clients_label_distribution(tmp_path):
    counts = {name: 40 for name in ("a", "b", "c", "d")}
    train = _image_folder(tmp_path / "train", counts)
    test = _image_folder(tmp_path / "test", counts, seed=2)
    config = resolve_run_config(
        {
            "dataset": "imagefolder",
            "data-dir": str(train),
            "test-data-dir": str(test),
            "partition": "pathological",
            "classes-per-client": 2,
            "num-partitions": 4,
            "model": "cnn-5",
            "cache-dir": str(tmp_path / "cache"),
        }
    )
    data = load_client_data(config, 0, 4)
    train_classes = set(data.train.y.tolist())
    assert len(train_classes) == 2
    assert set(data.test.y.tolist()) <= train_classes
    assert len(data.test) == 160 // 4  # an equal share of the external split
    local = len(data.train) + len(data.val)
    assert abs(len(data.val) - 0.1 * local) <= 2  # the client's own data is split 9:1 train/val
