"""FedPer, the worked example of docs/extending.md, is a method in a package of its own
(``examples/fedper``, issue 64): its math (the base-layer view), its client (uploads the base,
keeps its head) and its strategy (averages the base only), tested from the package's folder
(tests/system/test_plugin_package.py installs it and runs it through its entry point)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from fedapp.catalog import CATALOG
from fedapp.clientdata import load_client_data
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError
from fedapp.flower.strategy import ClientUpdate
from fedapp.models import build_model
from fedapp.params import get_arrays, set_arrays
from fedapp.state import MemoryStateStore
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "fedper"

# The package from its folder, not installed: this process's catalog does not list it, so the two
# halves are built directly, on a config whose keys are FedPer's (the local SGD ones).
sys.path.insert(0, str(EXAMPLE))
try:
    from fedapp_fedper import FEDPER
    from fedapp_fedper.base_layers import BaseLayers
    from fedapp_fedper.client import FedPerClient
    from fedapp_fedper.options import FedPerOptions
    from fedapp_fedper.strategy import FedPerStrategy
finally:
    sys.path.remove(str(EXAMPLE))


def make_config(**extra):
    assert "fedper" not in CATALOG  # (installed, it would be: the last test)
    values = {"method": "fedavg", "num-partitions": 4, "partition": "pathological", "batch-size": 64, **extra}
    return resolve_run_config(values)


def make_client(config, partition_id: int, store: MemoryStateStore, personal_layers: int = 1) -> FedPerClient:
    data = load_client_data(config, partition_id, config.num_partitions)
    client = FedPerClient(config, data, store, torch.device("cpu"))
    client.options = FedPerOptions(personal_layers)  # what an installed fedper's config would hold
    return client


def make_strategy(config, personal_layers: int = 1) -> FedPerStrategy:
    strategy = FedPerStrategy(config, 10)
    strategy.options = FedPerOptions(personal_layers)
    return strategy


def test_base_layers_are_a_view_of_everything_but_the_head():
    model = build_model("cnn-1", num_classes=10)
    base = BaseLayers(model)
    names = set(base.state_dict())
    assert names and not any(name.startswith("head.") for name in names)
    assert names | {f"head.{n}" for n in model.head.state_dict()} == set(model.state_dict())
    zeros = [np.zeros_like(a) for a in get_arrays(base)]
    set_arrays(base, zeros)  # loading into the view changes the model's own tensors
    assert all(torch.count_nonzero(p) == 0 for name, p in model.named_parameters() if not name.startswith("head."))
    assert torch.count_nonzero(model.head.weight) > 0
    with pytest.raises(ValueError, match=r"has 1 layers with weights: keep 1\.\.0 personal, not 1"):
        BaseLayers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_more_personal_layers_keep_the_model_s_last_layers_with_weights_out_of_the_base():
    model = build_model("cnn-1", num_classes=10)  # conv1, conv2, pool (no weights), fc1, fc2, head
    assert {name.split(".")[0] for name in BaseLayers(model, 2).state_dict()} == {"conv1", "conv2", "fc1"}
    assert {name.split(".")[0] for name in BaseLayers(model, 4).state_dict()} == {"conv1"}
    with pytest.raises(ValueError, match=r"keep 1\.\.4 personal, not 5"):
        BaseLayers(model, 5)
    config = make_config()
    assert [a.shape for a in make_strategy(config, 2).initial_arrays()] == [
        a.shape for a in get_arrays(BaseLayers(model, 2))
    ]
    FedPerOptions(4).check(config.values)
    with pytest.raises(ConfigError, match="'fedper-personal-layers' = 5 leaves no layer of 'cnn-1' to share"):
        FedPerOptions(5).check(config.values)
    assert FEDPER.options is FedPerOptions and FEDPER.keys == ("fedper-personal-layers",)


def test_a_client_uploads_its_base_layers_and_keeps_its_trained_head():
    config = make_config()
    base = make_strategy(config).initial_arrays()
    store = MemoryStateStore({})
    client = make_client(config, 0, store)
    arrays, num_examples, metrics = client.fit(base, {"server-round": 1})
    assert [a.shape for a in arrays] == [a.shape for a in base] and num_examples > 0
    assert any(not np.array_equal(a, b) for a, b in zip(arrays, base, strict=True))  # the base trained
    head = client.load_personal_model().head.weight.detach().clone()
    fresh = make_client(config, 0, store)  # a new process on the same node: the head is its own
    torch.testing.assert_close(fresh.load_personal_model().head.weight, head)
    other = make_client(config, 1, MemoryStateStore({}))
    assert not torch.equal(other.load_personal_model().head.weight, head)
    assert metrics["train_flops"] > 0


def test_the_strategy_averages_base_layers_by_examples():
    config = make_config()
    strategy = make_strategy(config)
    base = strategy.initial_arrays()
    updates = [
        ClientUpdate("a", [np.full_like(a, 1.0) for a in base], 30, {}, 0),
        ClientUpdate("b", [np.full_like(a, 4.0) for a in base], 10, {}, 0),
    ]
    merged = strategy.aggregate_updates(1, updates)
    for array in merged:
        np.testing.assert_allclose(array, 1.75)  # (30 * 1 + 10 * 4) / 40
    assert FEDPER.new_client_note.startswith("only the base layers are shared")
