"""FedD2P: soft-label uploads, count-weighted knowledge, the server-only generator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedapp.clientdata import load_client_data
from fedapp.clients.fedd2p import FedD2PClient
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError
from fedapp.flower.strategy import ClientUpdate
from fedapp.inprocess import run_in_process
from fedapp.methods.fedd2p import (
    PromptGenerator,
    ServerKnowledgeModel,
    class_descriptions,
    class_distribution_figures,
    distillation_term,
    global_knowledge,
    knowledge_loss,
    train_generator,
)
from fedapp.state import MemoryStateStore
from fedapp.strategies.fedd2p import FedD2PStrategy
from fedapp.training import TensorData

CLASSES = 10


def setup(method: str = "fedd2p", **extra):
    return resolve_run_config(
        {
            "method": method,
            "client-models": "vgg-2,vgg-3,vgg-4",
            "num-partitions": 4,
            "partition": "dirichlet",
            "alpha": 0.5,
            "d2p-steps": 5,
            **extra,
        }
    )


def make_client(config, pid: int, store=None) -> FedD2PClient:
    return FedD2PClient(config, load_client_data(config, pid, 4), store or MemoryStateStore({}), torch.device("cpu"))


def test_clients_upload_per_class_soft_labels_that_are_distributions_with_counts():
    config = setup()
    client = make_client(config, 1)
    assert client.model_name == "vgg-3"  # client-models cycled by partition
    start = FedD2PStrategy(config, CLASSES).initial_arrays()
    (soft, counts), n, _ = client.fit(start, {"server-round": 1})
    assert soft.shape == (CLASSES, CLASSES) and counts.dtype == np.int64
    assert counts.tolist() == client.data.label_counts().tolist() and n == counts.sum()
    held = counts > 0
    np.testing.assert_allclose(soft[held].sum(axis=1), 1.0, rtol=1e-5)
    assert np.all(soft[~held] == 0) and np.all(soft >= 0)


def test_soft_labels_are_softened_by_tau1():
    start = FedD2PStrategy(setup(), CLASSES).initial_arrays()
    sharp, soft = (
        make_client(setup(**{"d2p-tau1": tau}), 0).fit(start, {"server-round": 1})[0][0] for tau in (1.0, 10.0)
    )
    held = sharp.sum(axis=1) > 0
    assert soft[held].max(axis=1).mean() < sharp[held].max(axis=1).mean()


def test_the_pooled_knowledge_is_weighted_by_class_counts():
    strategy = FedD2PStrategy(setup("fedd2p-agg"), CLASSES)
    strategy.global_arrays = strategy.initial_arrays()
    a = np.eye(CLASSES, dtype=np.float32)
    b = np.full((CLASSES, CLASSES), 1 / CLASSES, np.float32)
    counts_a = np.array([3, 0] + [1] * 8, np.int64)
    counts_b = np.array([1, 2] + [1] * 8, np.int64)
    pooled, present = strategy.aggregate_updates(
        1, [ClientUpdate("a", [a, counts_a], 10, {}, 0), ClientUpdate("b", [b, counts_b], 10, {}, 0)]
    )
    np.testing.assert_allclose(pooled[0], 0.75 * a[0] + 0.25 * b[0], rtol=1e-6)
    np.testing.assert_allclose(pooled[1], b[1], rtol=1e-6)  # only b holds class 1
    np.testing.assert_allclose(pooled[2], 0.5 * a[2] + 0.5 * b[2], rtol=1e-6)
    assert present.tolist() == [1.0] * CLASSES


def test_the_client_loss_distils_the_knowledge_of_each_samples_class():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(4, 5), torch.tensor([0, 2, 2, 0])
    knowledge = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]], np.float32)
    present = np.ones(3, np.float32)
    loss = knowledge_loss(knowledge, present, weight=0.5, temperature=2.0)(model, x, y)
    out = model(x)
    teacher = torch.as_tensor(knowledge)[y]
    expected = F.cross_entropy(out, y) + 0.5 * F.kl_div(F.log_softmax(out / 2.0, 1), teacher, reduction="batchmean")
    torch.testing.assert_close(loss, expected)
    # Knowledge of a class absent from the batch does not matter; that of a class in it does.
    other_row = knowledge.copy()
    other_row[1] = [0.0, 0.0, 1.0]
    torch.testing.assert_close(knowledge_loss(other_row, present, 0.5, 2.0)(model, x, y), loss)
    own_row = knowledge.copy()
    own_row[2] = [1.0, 0.0, 0.0]
    assert not torch.allclose(knowledge_loss(own_row, present, 0.5, 2.0)(model, x, y), loss)
    # Classes without knowledge yet train on cross-entropy alone.
    torch.testing.assert_close(knowledge_loss(knowledge, np.zeros(3), 0.5, 2.0)(model, x, y), F.cross_entropy(out, y))


def test_first_round_is_a_cross_entropy_warm_up_of_its_own_length():
    config = setup(**{"warmup-epochs": 3})
    store = MemoryStateStore({})
    client = make_client(config, 0, store)
    assert client.round_epochs() == 3
    client.fit(FedD2PStrategy(config, CLASSES).initial_arrays(), {"server-round": 1})
    again = make_client(config, 0, store)
    assert again.round_epochs() is None and again.personal_rounds() == 1


@pytest.fixture(scope="module")
def server_model(clip):
    names = [str(i) for i in range(CLASSES)]
    return ServerKnowledgeModel(clip, class_descriptions(names, "digit"), prompt_tokens=4, kind="attention")


def test_only_the_generator_trains_on_the_server(server_model, clip):
    frozen_before = [p.detach().clone() for p in clip.model.parameters()]
    generator_before = [p.detach().clone() for p in server_model.generator.parameters()]
    text_before = server_model.text.clone()
    knowledge = np.full((CLASSES, CLASSES), 1 / CLASSES, np.float32)
    train_generator(server_model, knowledge, np.ones(CLASSES), steps=3, lr=1e-2, temperature=0.1)
    assert all(torch.equal(a, b) for a, b in zip(frozen_before, clip.model.parameters(), strict=True))
    assert torch.equal(text_before, server_model.text)
    after = server_model.generator.parameters()
    assert all(not torch.equal(a, b) for a, b in zip(generator_before, after, strict=True))
    assert {id(p) for p in server_model.parameters()} == {id(p) for p in server_model.generator.parameters()}


def test_generator_training_lowers_its_loss_and_yields_distributions(server_model):
    knowledge = np.eye(CLASSES, dtype=np.float32) * 0.9 + 0.01
    first = train_generator(server_model, knowledge, np.ones(CLASSES), steps=1, lr=1e-2, temperature=0.1)
    later = train_generator(server_model, knowledge, np.ones(CLASSES), steps=30, lr=1e-2, temperature=0.1)
    assert later < first
    g = global_knowledge(server_model, 0.1)
    assert g.shape == (CLASSES, CLASSES)
    np.testing.assert_allclose(g.sum(axis=1), 1.0, rtol=1e-5)


def test_ground_truth_only_generator_ignores_the_clients_knowledge(clip):
    names = [str(i) for i in range(CLASSES)]
    results = []
    for knowledge in (np.eye(CLASSES, dtype=np.float32), np.full((CLASSES, CLASSES), 0.1, np.float32)):
        model = ServerKnowledgeModel(clip, class_descriptions(names, "photo"), prompt_tokens=2, kind="mlp", seed=3)
        train_generator(model, knowledge, np.ones(CLASSES), steps=3, lr=1e-2, temperature=0.1, distil=False)
        results.append(global_knowledge(model, 0.1))
    np.testing.assert_allclose(results[0], results[1])


def test_attention_generator_mixes_classes_and_mlp_does_not():
    torch.manual_seed(0)
    text = torch.randn(5, 16)
    for kind, mixes in (("attention", True), ("mlp", False)):
        generator = PromptGenerator(16, 24, prompt_tokens=3, kind=kind)
        out = generator(text)
        assert out.shape == (5, 3, 24)
        changed = text.clone()
        changed[4] += 1.0
        moved = not torch.allclose(generator(changed)[0], out[0])
        assert moved == mixes  # class 0's prompt depends on class 4's description only with attention


def test_class_descriptions_use_the_papers_templates():
    assert class_descriptions(["7"], "", "digits") == ["a photo of digit 7"]
    assert class_descriptions(["sea_lion"], "") == ["a photo of a sea lion"]
    assert class_descriptions(["banded"], "texture") == ["banded texture"]
    assert class_descriptions(["Forest"], "satellite") == ["a centered satellite photo of Forest"]
    assert class_descriptions(["cat"], "an image of a {c}") == ["an image of a cat"]
    with pytest.raises(ConfigError, match="d2p-template"):
        resolve_run_config({"method": "fedd2p", "d2p-template": "no placeholder"})


def test_fedd2p_strategy_sends_generator_knowledge_and_logs_its_loss():
    config = setup()
    strategy = FedD2PStrategy(config, CLASSES, class_names=[f"c{i}" for i in range(CLASSES)])
    strategy.global_arrays = strategy.initial_arrays()
    soft = np.full((CLASSES, CLASSES), 0.1, np.float32)
    update = ClientUpdate("a", [soft, np.ones(CLASSES, np.int64)], 5, {}, 0)
    knowledge, present = strategy.aggregate_updates(1, [update])
    np.testing.assert_allclose(knowledge.sum(axis=1), 1.0, rtol=1e-5)
    assert present.tolist() == [1.0] * CLASSES
    assert np.isfinite(strategy._round_log[1].extra["generator_loss"])


@pytest.mark.parametrize("method", ["fedd2p", "fedd2p-agg"])
def test_the_client_distils_at_tau1_as_the_papers_eq_3_writes_it(method):
    """Eq. 3: L_CE(f(x), y) + L_KL(sigma_tau(f(x)), g_c), the same sigma_tau as the soft labels of
    Eq. 2 (tau1 = 10, "for softening local outputs"). The earlier reading distilled at
    kd-temperature = 1; it stays available as d2p-distil-temperature = 1."""
    knowledge = np.full((CLASSES, CLASSES), 0.02, np.float32)
    np.fill_diagonal(knowledge, 1 - 0.02 * (CLASSES - 1))
    present = np.ones(CLASSES, np.float32)
    client = make_client(setup(method), 0)
    model = client.new_model()
    x, y = client.data.train.x[:8], client.data.train.y[:8]
    loss = client.loss([knowledge, present])(model, x, y)
    torch.testing.assert_close(loss, knowledge_loss(knowledge, present, 1.0, 10.0)(model, x, y))
    assert not torch.allclose(loss, knowledge_loss(knowledge, present, 1.0, 1.0)(model, x, y))
    earlier = make_client(setup(method, **{"d2p-distil-temperature": 1.0}), 0)
    torch.testing.assert_close(
        earlier.loss([knowledge, present])(model, x, y), knowledge_loss(knowledge, present, 1.0, 1.0)(model, x, y)
    )


def test_the_sharpness_of_a_and_g_and_the_devices_distillation_gap_are_figures_of_every_round():
    rows = np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], np.float32)
    figures = class_distribution_figures(rows, np.array([1.0, 1.0, 0.0]))
    assert figures["true_class_mass"] == pytest.approx((0.7 + 0.5) / 2)
    entropy = -(0.7 * np.log(0.7) + 0.2 * np.log(0.2) + 0.1 * np.log(0.1)) - 2 * 0.5 * np.log(0.5)
    assert figures["entropy"] == pytest.approx(entropy / 2, rel=1e-5)
    assert class_distribution_figures(rows, np.zeros(3)) == {}

    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    data = TensorData(torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2]))
    present = np.array([1.0, 1.0, 0.0], np.float32)
    log_student = F.log_softmax(model(data.x) / 2.0, dim=1)
    kl = F.kl_div(log_student, torch.as_tensor(rows)[data.y], reduction="none").sum(dim=1)
    expected = float(kl[data.y != 2].mean().detach())
    assert distillation_term(model, data, rows, present, 2.0, "cpu") == pytest.approx(expected, rel=1e-5)
    assert distillation_term(model, data, rows, np.zeros(3), 2.0, "cpu") == 0.0

    history = run_in_process(
        {"method": "fedd2p", "client-models": "vgg-2", "num-partitions": 2, "num-rounds": 2, "shots-per-class": 3,
         "d2p-steps": 2}
    ).history  # fmt: skip
    for record in history:
        for name in ("a_true_class_mass", "a_entropy", "g_true_class_mass", "g_entropy", "fit_distillation_kl"):
            assert np.isfinite(record.extra[name]), (record.round, name)
        assert 0.0 <= record.extra["g_true_class_mass"] <= 1.0
