"""pFedLoRA and the model-heterogeneous baselines: the mechanics each method promises."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters

from fedapp.clientdata import load_client_data
from fedapp.clients.fd import FDClient
from fedapp.clients.fedkd import FedKDClient
from fedapp.clients.fedproto import FedProtoClient
from fedapp.clients.fml import FMLClient
from fedapp.clients.lg_fedavg import LGFedAvgClient
from fedapp.clients.pfedlora import PFedLoRAClient
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError
from fedapp.flops import forward_flops
from fedapp.flower.strategy import ClientUpdate
from fedapp.methods import pfedlora
from fedapp.methods.per_class import merge_per_class
from fedapp.metrics import payload_bytes
from fedapp.models import build_model
from fedapp.params import get_arrays
from fedapp.state import MemoryStateStore
from fedapp.strategies.pfedlora import PFedLoRAStrategy
from fedapp.training import TensorData, train

HETERO = "cnn-1,cnn-2,cnn-3,cnn-4,cnn-5"


def make_config(method: str, **extra):
    return resolve_run_config(
        {"method": method, "client-models": HETERO, "num-partitions": 5, "partition": "iid", "batch-size": 64, **extra}
    )


def make_client(cls, config, partition_id: int, store=None):
    data = load_client_data(config, partition_id, 5)
    return cls(config, data, store if store is not None else MemoryStateStore({}), torch.device("cpu"))


def initial_payload(strategy_cls, config):
    return strategy_cls(config, 10).initial_arrays()


def snapshot(module):
    return [p.detach().clone() for p in module.parameters()]


def changed(before, module):
    return [not torch.equal(b, p.detach()) for b, p in zip(before, module.parameters(), strict=True)]


def test_pfedlora_steps_freeze_what_the_paper_freezes():
    torch.manual_seed(0)
    net = pfedlora.ModelWithAdapter(build_model("cnn-3", 10), pfedlora.LowRankAdapter(500, 20, 10))
    data = TensorData(torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))
    model_before, adapter_before = snapshot(net.model), snapshot(net.adapter)
    seen = []

    def train_step(module, loss_fn, params):
        # Record what each step sees, then run the shared loop.
        seen.append((changed(model_before, net.model), changed(adapter_before, net.adapter)))
        return train(module, data, epochs=1, batch_size=32, lr=0.1, seed=0, loss_fn=loss_fn, params=params)

    pfedlora.train_round(net, 0.5, train_step)
    # At the start of step 2, step 1 has moved every model tensor and no adapter tensor.
    model_moved, adapter_moved = seen[1]
    assert all(model_moved) and not any(adapter_moved)
    # Step 2 then moved the adapter and left the model as step 1 made it.
    after_step1 = snapshot(net.model)
    assert all(changed(adapter_before, net.adapter))
    assert not any(changed(after_step1, net.model))
    # The adapter's parameters are trainable again after the round.
    assert all(p.requires_grad for p in net.parameters())


def test_pfedlora_adapter_kinds_and_the_mu_weighting():
    matrix, direct = pfedlora.LowRankAdapter(500, 40, 10, "matrix"), pfedlora.LowRankAdapter(500, 200, 10, "direct")
    r, s, zero = torch.randn(4, 500), torch.randn(4, 500), torch.zeros(4, 500)
    # Matrix decomposition is one affine map of R (a rank-h product); direct reduction is not affine.
    with torch.no_grad():
        assert torch.allclose(matrix(r + s), matrix(r) + matrix(s) - matrix(zero), atol=1e-5)
        assert not torch.allclose(direct(r + s), direct(r) + direct(s) - direct(zero), atol=1e-3)
    net = pfedlora.ModelWithAdapter(build_model("cnn-5", 10), matrix)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    head_only = pfedlora.local_model_loss(0.0)(net, x, y)
    adapter_only = pfedlora.local_model_loss(1.0)(net, x, y)
    assert torch.isclose(pfedlora.local_model_loss(0.5)(net, x, y), 0.5 * head_only + 0.5 * adapter_only)
    assert torch.isclose(adapter_only, pfedlora.adapter_loss(net, x, y))


def test_only_the_adapter_leaves_a_pfedlora_client_and_heterogeneous_clients_aggregate():
    config = make_config("pfedlora")
    strategy = PFedLoRAStrategy(config, 10)
    adapter = strategy.initial_arrays()
    updates = []
    for pid in (0, 2):  # cnn-1 and cnn-3
        client = make_client(PFedLoRAClient, config, pid)
        arrays, n, metrics = client.fit(adapter, {"server-round": 1})
        assert [a.shape for a in arrays] == [(40, 500), (40,), (10, 40), (10,)]
        assert payload_bytes(ndarrays_to_parameters(arrays).tensors) == payload_bytes(
            ndarrays_to_parameters(adapter).tensors
        )
        private = get_arrays(client.load_personal_model())
        assert sum(a.size for a in arrays) < sum(a.size for a in private) / 50
        assert metrics["train_flops"] > 0 and "adapter_loss" in metrics
        updates.append(ClientUpdate(str(pid), arrays, n, metrics, 0))
    merged = strategy.aggregate_updates(1, updates)
    assert [a.shape for a in merged] == [a.shape for a in adapter]
    total = updates[0].num_examples + updates[1].num_examples
    expected = (updates[0].arrays[0] * updates[0].num_examples + updates[1].arrays[0] * updates[1].num_examples) / total
    np.testing.assert_allclose(merged[0], expected, rtol=1e-5)


def test_pfedlora_records_every_reading_of_its_inference_and_scores_the_chosen_one():
    """The paper does not say whether a client predicts with its head, the adapter or both; every
    round records all three (``eval_head_accuracy``, ``eval_adapter_accuracy``,
    ``eval_combined_accuracy``), and ``pfedlora-inference`` picks the one called ``accuracy``."""
    x = torch.randn(6, 3, 32, 32)
    net = pfedlora.ModelWithAdapter(build_model("cnn-1", 10), pfedlora.LowRankAdapter(500, 40, 10))
    mixed = pfedlora.PFedLoRAPredictor(net, "combined", 0.25)(x).exp()
    expected = 0.75 * torch.softmax(net.model(x), 1) + 0.25 * torch.softmax(net.adapter_logits(x), 1)
    torch.testing.assert_close(mixed, expected)
    torch.testing.assert_close(pfedlora.PFedLoRAPredictor(net, "adapter", 0.25)(x), net.adapter_logits(x))
    with pytest.raises(ValueError, match="inference 'both'"):
        pfedlora.PFedLoRAPredictor(net, "both", 0.5)
    accuracies = {}
    for reading in pfedlora.INFERENCE_READINGS:
        config = make_config("pfedlora", **{"pfedlora-inference": reading})
        adapter = PFedLoRAStrategy(config, 10).initial_arrays()
        client = make_client(PFedLoRAClient, config, 0)
        client.fit(adapter, {"server-round": 1})
        _, _, metrics = client.evaluate(adapter, {"server-round": 1})
        assert metrics["accuracy"] == metrics[f"{reading}_accuracy"]
        accuracies[reading] = {key: metrics[f"{key}_accuracy"] for key in pfedlora.INFERENCE_READINGS}
    # The same training under each reading (it changes only the prediction): the same three figures.
    assert accuracies["head"] == accuracies["adapter"] == accuracies["combined"]


def test_a_lora_start_adds_nothing_until_the_adapter_learns():
    adapter = pfedlora.LowRankAdapter(500, 40, 10, init="lora")
    assert not adapter.up.weight.any() and not adapter.up.bias.any() and adapter.down.weight.std() > 0
    assert not adapter(torch.randn(3, 500)).any()  # uniform logits: the local head alone decides at first
    config = make_config("pfedlora", **{"adapter-init": "lora"})
    assert not np.any(PFedLoRAStrategy(config, 10).initial_arrays()[2])
    with pytest.raises(ConfigError, match="adapter-init"):
        make_config("pfedlora", **{"adapter-init": "zero"})


@pytest.mark.parametrize(
    ("method", "client_cls", "shapes"),
    [
        ("lg-fedavg", LGFedAvgClient, [(10, 500), (10,)]),
        ("fedproto", FedProtoClient, [(10, 500), (10,)]),
        ("fd", FDClient, [(10, 10), (10,)]),
        ("fml", FMLClient, None),
        ("fedkd", FedKDClient, None),
    ],
)
def test_baseline_payloads_have_their_shape_and_hold_no_private_model(method, client_cls, shapes):
    from fedapp.registry import strategy_class  # noqa: PLC0415

    config = make_config(method)
    global_arrays = strategy_class(method)(config, 10).initial_arrays()
    client = make_client(client_cls, config, 0)  # runs cnn-1
    arrays, n, _ = client.fit(global_arrays, {"server-round": 1})
    expected = shapes or [a.shape for a in get_arrays(build_model("cnn-5", 10))]  # the shared small model
    assert [a.shape for a in arrays] == expected
    model = client.load_personal_model()
    assert client.model_name == "cnn-1"
    # LG-FedAvg shares the head by design; everything below it is the private part.
    private = [
        p.detach().numpy() for name, p in model.named_parameters() if method != "lg-fedavg" or "head" not in name
    ]
    payload = sum(a.size for a in arrays)
    assert payload < sum(a.size for a in private)
    private_values = {a.tobytes() for a in private}
    assert not any(a.tobytes() in private_values for a in arrays if a.size > 10)
    # The reply's arrays validate against what the server expects.
    if method in ("fedproto", "fd"):
        assert arrays[1].sum() == n


def test_per_class_merge_weights_by_counts_and_keeps_absent_classes():
    a = (np.array([[1.0, 1.0], [0.0, 0.0], [5.0, 5.0]], np.float32), np.array([1, 0, 2]))
    b = (np.array([[4.0, 4.0], [0.0, 0.0], [0.0, 0.0]], np.float32), np.array([3, 0, 0]))
    previous = np.array([[9.0, 9.0], [7.0, 7.0], [9.0, 9.0]], np.float32)
    merged, present = merge_per_class([a, b], previous)
    np.testing.assert_allclose(merged[0], [3.25, 3.25])  # (1*1 + 3*4) / 4
    np.testing.assert_allclose(merged[1], [7.0, 7.0])  # nobody held class 1: kept
    np.testing.assert_allclose(merged[2], [5.0, 5.0])
    assert present.tolist() == [1.0, 1.0, 1.0]
    fresh, mask = merge_per_class([a, b])
    assert mask.tolist() == [1.0, 0.0, 1.0] and fresh[1].tolist() == [0.0, 0.0]


def test_forward_flops_of_cnn_1_match_its_layer_shapes():
    flops = forward_flops(build_model("cnn-1", 10), (3, 32, 32))
    conv1 = 2 * 3 * 25 * 16 * 28 * 28
    conv2 = 2 * 16 * 25 * 32 * 10 * 10
    fcs = 2 * (800 * 2000 + 2000 * 500 + 500 * 10)
    assert flops == conv1 + conv2 + fcs


def test_mixed_architectures_are_refused_for_whole_model_averaging():
    with pytest.raises(ConfigError, match="mixes architectures, but method 'fedavg'"):
        resolve_run_config({"method": "fedavg", "client-models": HETERO})
    with pytest.raises(ConfigError, match="names 'cnn-9'"):
        resolve_run_config({"method": "pfedlora", "client-models": "cnn-1,cnn-9"})


def test_representation_width_mismatch_is_refused():
    config = resolve_run_config({"method": "lg-fedavg", "client-models": "cnn-1,vgg-2"})
    from fedapp.strategies.lg_fedavg import LGFedAvgStrategy  # noqa: PLC0415

    with pytest.raises(ConfigError, match="one representation width"):
        LGFedAvgStrategy(config, 10).initial_arrays()
