"""CoOp-local, PromptFL and SDFed clients on the tiny random-init open_clip model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters

from fedapp.clientdata import load_client_data
from fedapp.clients.coop_local import CoOpLocalClient
from fedapp.clients.promptfl import PromptFLClient
from fedapp.clients.sdfed import SDFedClient
from fedapp.clients.text_prompt import FEATURES
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError
from fedapp.flower.strategy import ClientUpdate
from fedapp.metrics import payload_bytes
from fedapp.state import MemoryStateStore
from fedapp.strategies.promptfl import PromptFLStrategy
from fedapp.strategies.sdfed import SDFedStrategy

WIDTH = 64  # token width of fedapp-tiny-clip


def setup(method: str, **extra):
    config = resolve_run_config(
        {
            "method": method,
            "num-partitions": 4,
            "partition": "iid",
            "local-prompt-lengths": "4,16",
            "shots-per-class": 8,
            **extra,
        }
    )
    return config


def client(cls, config, pid: int, store):
    return cls(config, load_client_data(config, pid, 4), store, torch.device("cpu"))


def test_only_the_global_prompt_leaves_an_sdfed_client():
    config = setup("sdfed")
    global_prompt = SDFedStrategy(config, 10).initial_arrays()
    assert [a.shape for a in global_prompt] == [(8, WIDTH)]
    sdfed = client(SDFedClient, config, 0, MemoryStateStore({}))
    arrays, _, metrics = sdfed.fit(global_prompt, {"server-round": 1})
    assert [(a.shape, a.dtype) for a in arrays] == [((8, WIDTH), np.float32)]
    assert arrays[0].nbytes == 8 * WIDTH * 4
    sent = payload_bytes(ndarrays_to_parameters(arrays).tensors)
    assert 8 * WIDTH * 4 < sent <= 8 * WIDTH * 4 + 128  # the array plus its .npy header
    assert metrics["local_prompt_length"] == 4
    assert not np.array_equal(arrays[0], global_prompt[0])  # the global prompt trained locally


def test_local_prompts_of_different_lengths_coexist_and_persist():
    config = setup("sdfed")
    global_prompt = SDFedStrategy(config, 10).initial_arrays()
    stores = {0: MemoryStateStore({}), 1: MemoryStateStore({})}
    saved = {}
    for pid, store in stores.items():
        client(SDFedClient, config, pid, store).fit(global_prompt, {"server-round": 1})
        saved[pid] = store.load("local_prompt")["context"]
    assert saved[0].shape == (4, WIDTH) and saved[1].shape == (16, WIDTH)
    # Round 2: a new client object per round (as Flower makes) starts from the stored prompt.
    again = client(SDFedClient, config, 1, stores[1])
    model = again._classifier(global_prompt[0])
    np.testing.assert_array_equal(model.local_context.context.detach().numpy(), saved[1])
    again.fit(global_prompt, {"server-round": 2})
    assert not np.array_equal(stores[1].load("local_prompt")["context"], saved[1])


def test_promptfl_and_coop_local_payloads():
    config = setup("promptfl")
    context = PromptFLStrategy(config, 10).initial_arrays()
    arrays, n, _ = client(PromptFLClient, config, 0, MemoryStateStore({})).fit(context, {"server-round": 1})
    assert [a.shape for a in arrays] == [(8, WIDTH)] and n <= 8 * 10  # 8 shots per class at most
    store = MemoryStateStore({})
    coop = client(CoOpLocalClient, resolve_run_config({**config.as_dict(), "method": "coop-local"}), 0, store)
    arrays, _, _ = coop.fit([], {"server-round": 1})
    assert arrays == [] and store.load("context")["context"].shape == (8, WIDTH)
    _, _, metrics = coop.evaluate([], {"server-round": 1})
    assert 0.0 <= metrics["accuracy"] <= 1.0


def test_image_features_are_encoded_once_per_client_and_split():
    config = setup("promptfl", seed=7)
    context = PromptFLStrategy(config, 10).initial_arrays()
    before = FEATURES.encode_count
    promptfl = client(PromptFLClient, config, 2, MemoryStateStore({}))
    promptfl.fit(context, {"server-round": 1})
    promptfl.evaluate(context, {"server-round": 1})
    assert FEATURES.encode_count == before + 3  # train, test and validation
    client(PromptFLClient, config, 2, MemoryStateStore({})).fit(context, {"server-round": 2})
    assert FEATURES.encode_count == before + 3  # the next round reuses them


def test_backbones_with_different_token_widths_are_refused():
    config = setup("sdfed", **{"client-clip-models": "fedapp-tiny-clip,fedapp-tiny-vit-b"})
    with pytest.raises(ConfigError, match="different text token widths"):
        SDFedStrategy(config, 10).initial_arrays()


def test_shots_per_class_limits_every_clients_training_set():
    config = resolve_run_config({"num-partitions": 4, "partition": "iid", "shots-per-class": 3})
    data = load_client_data(config, 0, 4)
    assert np.bincount(data.splits["train"].labels).max() <= 3
    assert len(data.splits["test"]) > 10  # test split untouched


def test_bad_local_prompt_lengths_are_refused():
    with pytest.raises(ConfigError):
        resolve_run_config({"method": "sdfed", "local-prompt-lengths": "four"})


def test_clients_on_different_backbones_with_one_token_width_share_the_global_prompt():
    config = setup("sdfed", **{"client-clip-models": "fedapp-tiny-clip,fedapp-tiny-clip-b"})
    strategy = SDFedStrategy(config, 10)
    global_prompt = strategy.initial_arrays()
    updates = []
    for pid in (0, 1):
        sdfed = client(SDFedClient, config, pid, MemoryStateStore({}))
        assert sdfed.clip_model_name == ("fedapp-tiny-clip", "fedapp-tiny-clip-b")[pid]
        arrays, n, metrics = sdfed.fit(global_prompt, {"server-round": 1})
        updates.append(ClientUpdate(str(pid), arrays, n, metrics, 0))
    assert client(SDFedClient, config, 1, MemoryStateStore({})).clip.embed_dim == 48  # another backbone
    merged = strategy.aggregate_updates(1, updates)
    total = updates[0].num_examples + updates[1].num_examples
    expected = sum(u.arrays[0] * u.num_examples for u in updates) / total
    np.testing.assert_allclose(merged[0], expected, rtol=1e-5, atol=1e-7)
