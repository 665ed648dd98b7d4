"""Visual prompt tuning, PEP-FedPT's mixing and prototypes, and held-out clients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedapp.clientdata import held_out_clients, load_client_data
from fedapp.clients.fedvpt import FedVPTClient
from fedapp.clients.head_fedavg import HeadFedAvgClient
from fedapp.clients.local_vpt import LocalVPTClient
from fedapp.clients.pep_fedpt import PEPFedPTClient
from fedapp.config import held_out_partitions, resolve_run_config
from fedapp.errors import ConfigError, ModelError
from fedapp.flower.driver import stand_in_manager
from fedapp.flower.strategy import ClientUpdate
from fedapp.methods.pep_fedpt import MixingRecorder, ccmp_mixer, class_prior, mixing_weights, relative_change
from fedapp.methods.per_class import merge_per_class
from fedapp.methods.visual_prompts import build_visual_prompts
from fedapp.models import TINY_VIT, load_open_clip
from fedapp.models.vpt import PromptedViT, VisualPrompts, vision_tower_shape
from fedapp.params import get_arrays
from fedapp.state import MemoryStateStore
from fedapp.strategies.fedvpt import FedVPTStrategy
from fedapp.strategies.pep_fedpt import PEPFedPTStrategy
from fedapp.training import TensorData

CLASSES = 10
WIDTH = 128  # fedapp-tiny-vit


def setup(method: str, **extra):
    return resolve_run_config(
        {
            "method": method,
            "clip-model": TINY_VIT,
            "num-partitions": 4,
            "partition": "pathological",
            "classes-per-client": 2,
            "batch-size": 32,
            "prompt-length": 2,
            "class-prompt-length": 2,
            **extra,
        }
    )


def make_client(cls, config, pid: int, store=None):
    return cls(config, load_client_data(config, pid, 4), store or MemoryStateStore({}), torch.device("cpu"))


@pytest.fixture(scope="module")
def vit():
    return load_open_clip(TINY_VIT)


@pytest.fixture(scope="module")
def shape():
    return vision_tower_shape(TINY_VIT)


# ----- the prompted ViT -------------------------------------------------------------


def test_without_prompts_the_tower_computes_open_clips_own_features(vit, shape):
    model = PromptedViT(vit, VisualPrompts(shape, CLASSES, prompt_layers=()))
    images = torch.randn(3, 3, 32, 32)
    pooled, _ = model.tokens(images)
    with torch.no_grad():
        expected = vit.model.visual(images)
    torch.testing.assert_close(pooled.detach() @ vit.model.visual.proj, expected, atol=1e-5, rtol=1e-4)


def test_images_of_another_size_are_resized_to_the_towers_input(vit, shape):
    model = PromptedViT(vit, VisualPrompts(shape, CLASSES, prompt_layers=()))
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, CLASSES)


def test_shallow_prompts_enter_once_and_deep_prompts_at_every_layer(vit, shape):
    images = torch.randn(4, 3, 32, 32)
    for layers in [(1,), tuple(range(1, shape.layers + 1))]:
        prompts = VisualPrompts(shape, CLASSES, prompt_layers=layers, prompt_length=3)
        model = PromptedViT(vit, prompts)
        model(images).sum().backward()
        grads = prompts.prompts.grad
        assert grads.shape == (len(layers), 3, WIDTH)
        # Every layer's prompts shape the output; the frozen tower gets no gradient.
        assert all(float(g.abs().sum()) > 0 for g in grads)
        assert all(p.grad is None for p in vit.model.visual.parameters())


def test_class_layers_must_start_at_two_and_fit_the_tower(shape):
    with pytest.raises(ModelError, match="start at 2"):
        VisualPrompts(shape, CLASSES, class_layers=(1, 5), class_length=2)
    with pytest.raises(ModelError, match="outside"):
        VisualPrompts(shape, CLASSES, class_layers=(5, 9), class_length=2)


# ----- CCMP ---------------------------------------------------------------------------


def test_mixing_weights_are_a_distribution_per_sample_over_the_clients_classes():
    gen = torch.Generator().manual_seed(0)
    cls = torch.randn(16, WIDTH, generator=gen)
    prototypes = torch.randn(CLASSES, WIDTH, generator=gen)
    prior = class_prior(np.array([3, 0, 5, 0, 0, 1, 0, 0, 0, 1]))
    weights = mixing_weights(cls, prototypes, torch.ones(CLASSES), prior, temperature=0.1)
    assert weights.shape == (16, CLASSES)
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(16))
    assert bool((weights >= 0).all())
    assert float(weights[:, prior == 0].abs().max()) == 0.0
    # Samples differ in their weights: the mixture is per sample, not per client.
    assert float((weights - weights[0]).abs().max()) > 1e-3


def test_a_one_hot_prior_mixes_exactly_that_classes_prompt(shape):
    prompts = VisualPrompts(shape, CLASSES, class_layers=(5, 6, 7), class_length=3, seed=1)
    prior = class_prior(np.eye(CLASSES, dtype=np.int64)[4] * 7)
    prototypes = np.random.default_rng(0).normal(size=(CLASSES, 3 * WIDTH)).astype(np.float32)
    mixer = ccmp_mixer(prototypes, np.ones(CLASSES), prior, temperature=0.05, num_layers=3)
    cls = torch.randn(5, WIDTH)
    for j in range(3):
        mixed = prompts.mixed_class_prompt(j, mixer(j, cls))
        torch.testing.assert_close(mixed, prompts.class_prompts[j, 4].expand(5, -1, -1))


def test_before_any_prototype_exists_the_mixture_is_the_prior_weighted_mean():
    prior = class_prior(np.array([1, 3, 0, 0, 0, 0, 0, 0, 0, 0]))
    weights = mixing_weights(torch.randn(2, WIDTH), torch.randn(CLASSES, WIDTH), torch.zeros(CLASSES), prior, 0.1)
    torch.testing.assert_close(weights, prior.expand(2, -1))


def test_class_prompts_receive_gradient_only_for_classes_the_mixture_uses(vit, shape):
    prompts = VisualPrompts(shape, CLASSES, class_layers=(5, 6, 7), class_length=2)
    prior = class_prior(np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 0]))
    mixer = ccmp_mixer(np.zeros((CLASSES, 3 * WIDTH), np.float32), np.zeros(CLASSES), prior, 0.1, 3)
    PromptedViT(vit, prompts, mixer)(torch.randn(4, 3, 32, 32)).sum().backward()
    per_class = prompts.class_prompts.grad.abs().sum(dim=(0, 2, 3))
    assert bool((per_class[:2] > 0).all()) and float(per_class[2:].sum()) == 0.0


# ----- prototypes ---------------------------------------------------------------------


def test_prototypes_follow_the_momentum_rule_and_absent_classes_keep_theirs():
    previous = np.arange(12, dtype=np.float32).reshape(4, 3) + 1.0
    present = np.array([1, 1, 1, 0], np.float32)  # class 3 has no prototype yet
    a = (np.full((4, 3), 10.0, np.float32), np.array([2, 0, 0, 1]))
    b = (np.full((4, 3), 40.0, np.float32), np.array([1, 0, 3, 1]))
    merged, mask = merge_per_class([a, b], previous, momentum=0.5, previous_present=present)
    pooled0 = (2 * 10 + 1 * 40) / 3
    np.testing.assert_allclose(merged[0], 0.5 * previous[0] + 0.5 * pooled0)
    np.testing.assert_allclose(merged[1], previous[1])  # nobody held class 1 this round
    np.testing.assert_allclose(merged[2], 0.5 * previous[2] + 0.5 * 40.0)
    np.testing.assert_allclose(merged[3], 25.0)  # first sighting: the pooled mean, no momentum
    assert mask.tolist() == [1, 1, 1, 1]


def test_pep_fedpt_strategy_averages_the_learner_and_smooths_prototypes():
    config = setup("pep-fedpt", **{"prototype-momentum": 0.25})
    strategy = PEPFedPTStrategy(config, CLASSES)
    start = strategy.initial_arrays()
    strategy.global_arrays = start
    k = len(start) - 2

    def upload(value: float, counts: list[int]) -> list[np.ndarray]:
        learner = [np.full_like(a, value) for a in start[:k]]
        return [*learner, np.full_like(start[k], value), np.array(counts, np.int64)]

    first = strategy.aggregate_updates(
        1,
        [
            ClientUpdate("a", upload(1.0, [5] + [0] * 9), 10, {}, 0),
            ClientUpdate("b", upload(4.0, [0, 5] + [0] * 8), 30, {}, 0),
        ],
    )
    for array in first[:k]:
        np.testing.assert_allclose(array, 3.25)  # (1 * 10 + 4 * 30) / 40
    np.testing.assert_allclose(first[k][0], 1.0)
    np.testing.assert_allclose(first[k][1], 4.0)
    assert first[k + 1].tolist() == [1, 1] + [0] * 8
    strategy.global_arrays = first
    second = strategy.aggregate_updates(2, [ClientUpdate("a", upload(9.0, [5] + [0] * 9), 10, {}, 0)])
    np.testing.assert_allclose(second[k][0], 0.25 * 1.0 + 0.75 * 9.0)
    np.testing.assert_allclose(second[k][1], 4.0)  # absent this round


# ----- clients ---------------------------------------------------------------------


def test_pep_fedpt_client_uploads_global_arrays_and_class_statistics_only():
    config = setup("pep-fedpt")
    strategy = PEPFedPTStrategy(config, CLASSES)
    start = strategy.initial_arrays()
    mapping: dict = {}
    client = make_client(PEPFedPTClient, config, 1, MemoryStateStore(mapping))
    arrays, n, metrics = client.fit(start, {"server-round": 1})
    learner_shapes = [a.shape for a in get_arrays(build_visual_prompts(config.values, CLASSES))]
    assert [a.shape for a in arrays] == [*learner_shapes, (CLASSES, 3 * WIDTH), (CLASSES,)]
    assert arrays[-1].dtype == np.int64 and arrays[-1].tolist() == client.data.label_counts().tolist()
    held = arrays[-1] > 0
    assert np.all(np.abs(arrays[-2][held]).sum(axis=1) > 0) and np.all(arrays[-2][~held] == 0)
    assert n == len(client.data.train) and metrics["train_flops"] > 0
    # The mechanism's figures (issue 41): how far the round moved the class prompts and the head,
    # and the mixing's entropy (at most ln(classes)) and agreement with the labels.
    assert metrics["class_prompt_change"] > 0 and metrics["head_change"] > 0
    assert 0.0 <= metrics["mix_entropy"] <= np.log(CLASSES) + 1e-6 and 0.0 <= metrics["mix_top_is_label"] <= 1.0
    # The prompts and head trained; the client kept nothing for itself.
    assert any(not np.array_equal(a, b) for a, b in zip(arrays[:-2], start[:-2], strict=True))
    assert mapping == {}
    # Every trainable tensor of the client's model is one of the arrays it uploads.
    model = client._model(start)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in model.prompts.parameters()}
    assert not any(p.requires_grad for p in client.clip.model.parameters())


def test_a_client_of_another_partition_evaluates_with_the_global_state_and_its_own_prior():
    config = setup("pep-fedpt")
    start = PEPFedPTStrategy(config, CLASSES).initial_arrays()
    trained, _, _ = make_client(PEPFedPTClient, config, 0).fit(start, {"server-round": 1})
    strategy = PEPFedPTStrategy(config, CLASSES)
    strategy.global_arrays = start
    strategy.initial_arrays()
    merged = strategy.aggregate_updates(1, [ClientUpdate("a", trained, 10, {}, 0)])
    unseen = make_client(PEPFedPTClient, config, 3)
    _loss, n, metrics = unseen.evaluate(merged, {"server-round": 1})
    assert n == len(unseen.data.test) and 0.0 <= metrics["accuracy"] <= 1.0
    # The mixing on the test images, recorded as in training (eval_mix_* in metrics.jsonl).
    assert 0.0 <= metrics["mix_entropy"] <= np.log(CLASSES) + 1e-6 and 0.0 <= metrics["mix_top_is_label"] <= 1.0


@pytest.mark.parametrize(
    "cls, method", [(FedVPTClient, "fedvpt"), (FedVPTClient, "fedvpt-d"), (HeadFedAvgClient, "head-fedavg")]
)
def test_federated_vpt_clients_send_back_every_trainable_array(cls, method):
    config = setup(method)
    start = FedVPTStrategy(config, CLASSES).initial_arrays()
    client = make_client(cls, config, 2)
    arrays, _, _ = client.fit(start, {"server-round": 1})
    assert [a.shape for a in arrays] == [a.shape for a in start]
    assert any(not np.array_equal(a, b) for a, b in zip(arrays, start, strict=True))
    _loss, n_test, metrics = client.evaluate(arrays, {"server-round": 1})
    assert n_test == len(client.data.test) and 0.0 <= metrics["accuracy"] <= 1.0


def test_deep_prompts_are_per_layer_and_head_only_sends_no_prompt():
    shallow, deep, head = (
        FedVPTStrategy(setup(m), CLASSES).initial_arrays() for m in ("fedvpt", "fedvpt-d", "head-fedavg")
    )
    assert shallow[0].shape == (1, 2, WIDTH) and deep[0].shape == (8, 2, WIDTH)
    assert head[0].size == 0 and head[1].size == 0


def test_local_vpt_keeps_its_prompts_in_its_store_and_sends_nothing():
    config = setup("local-vpt")
    store = MemoryStateStore({})
    arrays, _, _ = make_client(LocalVPTClient, config, 1, store).fit([], {"server-round": 1})
    assert arrays == []
    first = store.load("prompts")
    make_client(LocalVPTClient, config, 1, store).fit([], {"server-round": 2})
    second = store.load("prompts")
    assert any(not np.array_equal(first[k], second[k]) for k in first)


# ----- held-out clients -------------------------------------------------------------


def test_held_out_clients_never_train_and_are_evaluated_with_the_global_state():
    config = setup("pep-fedpt", **{"num-partitions": 8, "held-out-fraction": 0.25, "min-clients": 2})
    held = held_out_clients(config)
    assert len(held) == 2
    manager = stand_in_manager(8)
    strategy = PEPFedPTStrategy(config, CLASSES)
    params = strategy.initialize_parameters(manager)
    for server_round in (1, 2, 3):
        fit = strategy.configure_fit(server_round, params, manager)
        assert {p.partition for p, _ in fit} == set(range(8)) - held
        evaluated = strategy.configure_evaluate(server_round, params, manager)
        assert {p.partition for p, _ in evaluated} == set(range(8))


def test_a_method_without_a_global_state_does_not_evaluate_held_out_clients():
    config = setup("local-vpt", **{"num-partitions": 8, "held-out-fraction": 0.25, "min-clients": 2})
    from fedapp.strategies.standalone import StandaloneStrategy  # noqa: PLC0415

    manager = stand_in_manager(8)
    strategy = StandaloneStrategy(config, CLASSES)
    params = strategy.initialize_parameters(manager)
    held = held_out_clients(config)
    assert {p.partition for p, _ in strategy.configure_evaluate(1, params, manager)} == set(range(8)) - held


# ----- configuration ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"method": "pep-fedpt", "clip-model": TINY_VIT, "class-prompt-layers": "5,x"}, "'x' is not a layer"),
        (
            {"method": "pep-fedpt", "clip-model": TINY_VIT, "class-prompt-layers": "1,2"},
            r"layers \[1\] are outside 2..8",
        ),
        ({"method": "pep-fedpt", "clip-model": "fedapp-tiny-clip"}, r"layers \[5, 6, 7\] are outside 2..2"),
        ({"method": "fedvpt", "clip-model": "RN50"}, "no plain ViT image tower"),
        ({"method": "fedvpt", "client-clip-models": "fedapp-tiny-vit,fedapp-tiny-clip"}, "set 'clip-model' only"),
        ({"num-partitions": 4, "held-out-fraction": 0.75, "min-clients": 2}, "leaving 1 to train"),
        ({"held-out-fraction": 0.95}, "held-out-fraction"),
    ],
)
def test_bad_visual_prompt_configs_are_refused_with_the_key_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run_config(overrides)


def test_held_out_partitions_depend_on_the_seed_only():
    a = resolve_run_config({"num-partitions": 20, "held-out-fraction": 0.2})
    b = resolve_run_config({"num-partitions": 20, "held-out-fraction": 0.2, "lr": 0.5})
    c = resolve_run_config({"num-partitions": 20, "held-out-fraction": 0.2, "seed": 3})
    assert held_out_partitions(a) == held_out_partitions(b)
    assert len(held_out_partitions(a)) == 4 and held_out_partitions(a) != held_out_partitions(c)
    assert held_out_partitions(resolve_run_config({})) == frozenset()


def test_a_covered_draw_keeps_a_training_client_for_every_class_a_held_out_client_holds():
    """Issue 41: the seed-only draw could hold out the only clients of a class, so the held-out
    clients were scored on classes nobody trained on. Class sets where client 0 alone holds class 0:"""
    config = resolve_run_config({"num-partitions": 10, "held-out-fraction": 0.2})
    lonely = [{0, 1}] + [{c, c + 1} for c in range(1, 10)]  # 1..10; class 0 only on client 0
    seeds_holding_out_client_0 = [
        seed
        for seed in range(40)
        if 0 in held_out_partitions(resolve_run_config({"num-partitions": 10, "held-out-fraction": 0.2, "seed": seed}))
    ]
    assert seeds_holding_out_client_0  # the old draw does it for some seeds
    for seed in seeds_holding_out_client_0:
        seeded = resolve_run_config({"num-partitions": 10, "held-out-fraction": 0.2, "seed": seed})
        covered = held_out_partitions(seeded, lonely)
        assert len(covered) == 2 and 0 not in covered
        training = [lonely[p] for p in range(10) if p not in covered]
        assert all(any(c in t for t in training) for p in covered for c in lonely[p])
        anyway = resolve_run_config(
            {"num-partitions": 10, "held-out-fraction": 0.2, "seed": seed, "held-out-draw": "any"}
        )
        assert 0 in held_out_partitions(anyway, lonely)
    # Where the plain draw already covers every class, it is kept as it is.
    spread = [set(range(10))] * 10
    assert held_out_partitions(config, spread) == held_out_partitions(config)
    with pytest.raises(ConfigError, match=r"'held-out-fraction' = 0\.5 asks for 5 held-out clients, but only 0"):
        held_out_partitions(
            resolve_run_config({"num-partitions": 10, "held-out-fraction": 0.5}), [{c} for c in range(10)]
        )


def test_the_server_draws_held_out_clients_from_the_partition():
    config = setup("pep-fedpt", **{"num-partitions": 10, "held-out-fraction": 0.3, "class-assignment": "random"})
    parts = [set(np.unique(load_client_data(config, p, 10).splits["train"].labels).tolist()) for p in range(10)]
    held = held_out_clients(config)
    assert len(held) == 3
    training = set().union(*(parts[p] for p in range(10) if p not in held))
    assert all(parts[p] <= training for p in held)


class UniformMixer(torch.nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.classes = classes

    def forward(self, j: int, cls: torch.Tensor) -> torch.Tensor:
        return torch.full((cls.shape[0], self.classes), 1.0 / self.classes)


def test_mixing_figures_read_the_weights_the_mixer_gives():
    shape = vision_tower_shape(TINY_VIT)
    prompts = VisualPrompts(shape, 4, prompt_layers=(1,), prompt_length=2, class_layers=(5, 6), class_length=2)
    model = PromptedViT(load_open_clip(TINY_VIT), prompts, mixer=UniformMixer(4))
    data = TensorData(torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 2, 3, 0, 0]))
    with MixingRecorder(model, data.y) as recorder, torch.no_grad():
        for start in (0, 4):  # in order, in batches, as the prototype pass runs
            model.tokens(data.x[start : start + 4])
    figures = recorder.figures()
    assert figures["mix_entropy"] == pytest.approx(np.log(4), rel=1e-6)  # uniform: the most uncertain
    assert figures["mix_top_is_label"] == pytest.approx(3 / 6)  # uniform's argmax is class 0
    assert relative_change(torch.ones(4), torch.ones(4) * 1.5) == pytest.approx(0.5)
    assert relative_change(torch.zeros(2), torch.ones(2)) == 0.0


def test_the_prompt_learning_rate_scale_moves_the_prompts_and_leaves_the_heads_step_alone():
    """prompt-lr-scale (issue 41): the prompts train at lr times it, the head at lr. With momentum 0
    and one step, the prompt's update is exactly proportional to the scale, the head's unchanged."""
    start = FedVPTStrategy(setup("fedvpt"), CLASSES).initial_arrays()
    names = list(build_visual_prompts(setup("fedvpt").values, CLASSES).state_dict())
    head = [i for i, name in enumerate(names) if name.startswith("head.")]
    prompts = [i for i in range(len(names)) if i not in head and start[i].size]
    moved = {}
    for scale in (1.0, 4.0):
        config = setup("fedvpt", **{"prompt-lr-scale": scale, "momentum": 0.0, "batch-size": 10_000})
        arrays, _, _ = make_client(FedVPTClient, config, 2).fit(start, {"server-round": 1})
        moved[scale] = [arrays[i] - start[i] for i in range(len(start))]
    for i in head:
        np.testing.assert_array_equal(moved[4.0][i], moved[1.0][i])
    for i in prompts:
        assert np.abs(moved[1.0][i]).max() > 0
        np.testing.assert_allclose(moved[4.0][i], 4.0 * moved[1.0][i], rtol=1e-4, atol=1e-9)


def test_the_oracle_mixer_gives_each_sample_its_own_labels_prompt_in_training_and_evaluation():
    """pep-mixer = "oracle" (issue 41): the ablation that bounds what the per-sample mixing can give."""
    from fedapp.methods.pep_fedpt import OracleMixer, labelled_forward  # noqa: PLC0415

    config = setup("pep-fedpt", **{"pep-mixer": "oracle"})
    start = PEPFedPTStrategy(config, CLASSES).initial_arrays()
    client = make_client(PEPFedPTClient, config, 1)
    arrays, _, metrics = client.fit(start, {"server-round": 1})
    # Every sample's weights are one-hot on its label: entropy 0, top class always the label.
    assert metrics["mix_entropy"] == pytest.approx(0.0, abs=1e-6) and metrics["mix_top_is_label"] == 1.0
    assert metrics["class_prompt_change"] > 0
    _loss, n, scored = client.evaluate(arrays, {"server-round": 1})
    assert n == len(client.data.test) and 0.0 <= scored["accuracy"] <= 1.0
    assert scored["mix_top_is_label"] == 1.0 and scored["mix_entropy"] == pytest.approx(0.0, abs=1e-6)
    model = client._model(arrays)
    assert isinstance(model.mixer, OracleMixer)
    test = client.images("test")
    x, y = test.x[:4], test.y[:4]
    # The label's own prompt: the same logits as a one-hot prior's mixer would give a client of that class.
    with torch.no_grad():
        logits = labelled_forward(model, x, y)
        for i in range(len(y)):
            alone = labelled_forward(model, x[i : i + 1], y[i : i + 1])
            torch.testing.assert_close(logits[i : i + 1], alone, rtol=1e-4, atol=1e-5)
    with pytest.raises(ModelError, match="cannot predict an image whose label it is not shown"):
        model(x)
    # The paper's mixer does not see the labels at all: labelled_forward is its plain forward.
    ccmp = setup("pep-fedpt")
    plain = make_client(PEPFedPTClient, ccmp, 1)._model(PEPFedPTStrategy(ccmp, CLASSES).initial_arrays())
    with torch.no_grad():
        torch.testing.assert_close(labelled_forward(plain, x, y), plain(x))
