"""FLOPs from torch's counter on meta stand-ins (fedapp/flops.py): what it counts, that it
touches nothing real, that it is counted once per architecture, and where it differs from
the hand-written rules it replaced."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedapp import flops
from fedapp.flops import count_flops, forward_flops, training_flops, training_step_flops
from fedapp.methods import pfedlora
from fedapp.models import TINY_VIT, build_model, load_open_clip
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder
from fedapp.models.vpt import PromptedViT, VisualPrompts, vision_tower_shape
from fedapp.training import TensorData, cross_entropy_loss, frozen, train

CNN_1_FORWARD = 2 * 3 * 25 * 16 * 28 * 28 + 2 * 16 * 25 * 32 * 10 * 10 + 2 * (800 * 2000 + 2000 * 500 + 500 * 10)
CONV_1 = 2 * 3 * 25 * 16 * 28 * 28


def _batch(n: int = 4, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, size, size), torch.arange(n) % 10


def test_a_training_step_is_forward_and_autograds_backward():
    model = build_model("cnn-1", 10)
    assert forward_flops(model, (3, 32, 32)) == CNN_1_FORWARD
    x, y = _batch(1)
    # Backward: every layer's weight gradient, and the input gradient of every layer but the
    # first (nothing needs the image's gradient). The old rule (3 x forward) charged that too.
    assert training_step_flops(model, cross_entropy_loss, x, y) == 3 * CNN_1_FORWARD - CONV_1
    x4, y4 = _batch(4)
    assert training_step_flops(model, cross_entropy_loss, x4, y4) == 4 * (3 * CNN_1_FORWARD - CONV_1)


def test_frozen_layers_cost_what_autograd_runs():
    net = pfedlora.ModelWithAdapter(build_model("cnn-1", 10), pfedlora.LowRankAdapter(500, 40, 10))
    x, y = _batch(1)
    adapter_forward = 2 * (500 * 40 + 40 * 10)
    head_forward = 2 * 500 * 10
    with frozen(net.model):
        # No gradient reaches the model: its encoder runs forward only, the adapter trains
        # (its first layer needs no input gradient: its input, the representation, is frozen).
        step2 = training_step_flops(net, pfedlora.adapter_loss, x, y)
    assert step2 == (CNN_1_FORWARD - head_forward) + 3 * adapter_forward - 2 * 500 * 40
    with frozen(net.adapter):
        # The frozen adapter passes its input gradient (1 x forward) to the training encoder.
        step1 = training_step_flops(net, pfedlora.local_model_loss(0.5), x, y)
    assert step1 == 3 * CNN_1_FORWARD - CONV_1 + 2 * adapter_forward


def test_counting_computes_nothing_real_and_leaves_the_model_alone():
    model = build_model("cnn-1", 10)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    captured = torch.randn(10)  # a tensor the loss closes over (a teacher's logits, say) stands in too
    x, y = _batch(2)
    counted = training_step_flops(model, lambda m, a, b: F.cross_entropy(m(a) + captured, b), x, y)
    assert counted == 2 * (3 * CNN_1_FORWARD - CONV_1)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


@pytest.fixture
def fresh_counts(monkeypatch, tmp_path):
    """Counts as a new process on a new machine finds them: none in memory, none on disk."""
    monkeypatch.setenv("FEDAPP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(flops, "_step_cache", type(flops._step_cache)())
    return tmp_path / "cache" / "flops"


def test_a_rounds_flops_count_full_batches_and_the_last_one_at_their_sizes(monkeypatch, fresh_counts):
    model = build_model("cnn-1", 10)
    counted: list[int] = []
    real = flops.training_step_flops

    def counting(model, loss_fn, x, y):
        counted.append(len(y))
        return real(model, loss_fn, x, y)

    monkeypatch.setattr(flops, "training_step_flops", counting)
    x, y = _batch(10)
    per_sample = 3 * CNN_1_FORWARD - CONV_1
    assert training_flops(model, cross_entropy_loss, x, y, batch_size=4, epochs=3) == 3 * 10 * per_sample
    assert counted == [4, 2]  # two full batches of 4 and one of 2: two shapes counted
    assert training_flops(model, cross_entropy_loss, x, y, batch_size=4, epochs=1) == 10 * per_sample
    assert counted == [4, 2]  # the same architecture and batches: from the cache
    other = build_model("cnn-3", 10)
    training_flops(other, cross_entropy_loss, x, y, batch_size=4, epochs=1)
    assert counted == [4, 2, 4, 2]


def test_train_reports_its_flops_and_its_random_stream_is_untouched():
    data = TensorData(*_batch(10))
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model("cnn-1", 10)
        runs.append((train(model, data, epochs=2, batch_size=4, lr=0.1, seed=1), model))
    (first, model_a), (second, model_b) = runs
    assert first.flops == second.flops == 2 * 10 * (3 * CNN_1_FORWARD - CONV_1)
    assert first.loss == second.loss
    assert all(torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True))


def test_a_loss_that_reads_values_is_named_once_and_counted_as_zero(caplog):
    caplog.set_level(logging.WARNING, logger="flwr.fedapp")

    def reads_a_value(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        return loss * 2 if loss.item() > 0 else loss

    model = build_model("cnn-1", 10)
    x, y = _batch(4)
    for _ in range(2):
        assert training_flops(model, reads_a_value, x, y, batch_size=4, epochs=1) == 0
    [line] = [r.getMessage() for r in caplog.records if "not counted" in r.getMessage()]
    assert "reads_a_value" in line and "meta" in line


def test_attention_is_counted_in_a_vit_and_matches_the_layer_shapes():
    """The counter against the analytic count it replaced (patch embedding, every block's
    projections, MLP and attention products, head): equal, so attention's QK^T and AV
    are counted."""
    clip = load_open_clip(TINY_VIT)
    shape = vision_tower_shape(TINY_VIT)
    prompts = VisualPrompts(shape, 10, prompt_layers=(1,), prompt_length=4)
    model = PromptedViT(clip, prompts)
    d, tokens = shape.width, 1 + shape.num_patches + prompts.prompt_tokens
    patch = shape.num_patches * 3 * shape.patch_size**2 * d
    block = tokens * (4 * d * d + 2 * shape.mlp_ratio * d * d) + 2 * tokens * tokens * d
    analytic = int(2 * (patch + shape.layers * block + d * 10))
    x = torch.randn(1, 3, shape.image_size, shape.image_size)
    with torch.no_grad():
        assert count_flops(lambda: model(x)) == analytic


def test_a_text_prompts_step_pays_the_text_tower_once_per_batch(clip):
    encoder = PromptTextEncoder(clip, ("zero", "one", "two"))
    context = PromptContext(4, encoder.token_width, generator=0)
    features = F.normalize(torch.randn(8, encoder.embed_dim), dim=-1)

    def step(n: int) -> int:
        def loss(ctx: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(x @ encoder(ctx.context).T, y)

        return training_step_flops(context, loss, features[:n], torch.arange(n) % 3)

    one, eight = step(1), step(8)
    logits = 2 * encoder.embed_dim * 3  # one sample's logits, forward
    # The class prompts run through the frozen tower once a step (with the gradient back to
    # the context), whatever the batch: only the logits grow with it.
    assert one > 100 * logits
    assert eight - one == 7 * 2 * logits  # forward and the gradient to the text features


def test_a_count_is_kept_on_disk_for_the_next_process_and_a_bad_entry_is_counted_again(monkeypatch, fresh_counts):
    """A deployed ClientApp is a new process per message: the count of its first message serves the next."""
    model, (x, y) = build_model("cnn-1", 10), _batch(4)
    expected = 4 * (3 * CNN_1_FORWARD - CONV_1)
    assert flops.cached_step_flops(model, cross_entropy_loss, x, y) == expected
    (entry,) = fresh_counts.iterdir()
    assert json.loads(entry.read_text()) == {"flops": expected}
    monkeypatch.setattr(flops, "_step_cache", type(flops._step_cache)())  # the next process
    monkeypatch.setattr(flops, "training_step_flops", lambda *args: pytest.fail("counted again"))
    assert flops.cached_step_flops(model, cross_entropy_loss, x, y) == expected
    entry.write_text("{not json")
    monkeypatch.setattr(flops, "_step_cache", type(flops._step_cache)())
    monkeypatch.setattr(flops, "training_step_flops", lambda *args: 7)
    assert flops.cached_step_flops(model, cross_entropy_loss, x, y) == 7
    assert json.loads(entry.read_text()) == {"flops": 7}


def test_the_count_is_flop_counter_modes_own(clip):
    """The counter is torch's FlopCounterMode without its per-module breakdown (and without the
    dynamo guard that imports torch._dynamo): the same totals, forward and backward."""
    from torch.utils.flop_counter import FlopCounterMode  # noqa: PLC0415

    from fedapp.flops import _MetaStandIns  # noqa: PLC0415

    vit = PromptedViT(load_open_clip(TINY_VIT), VisualPrompts(vision_tower_shape(TINY_VIT), 10, prompt_length=4))
    encoder = PromptTextEncoder(clip, ("zero", "one", "two"))
    context = PromptContext(4, encoder.token_width, generator=0)
    steps = [
        lambda: cross_entropy_loss(build_model("cnn-3", 10), *_batch(2)).backward(),
        lambda: cross_entropy_loss(vit, *_batch(2)).backward(),
        lambda: encoder(context.context).sum().backward(),
    ]
    for step in steps:
        with _MetaStandIns(), FlopCounterMode(display=False) as reference:
            step()
        assert count_flops(step) == reference.get_total_flops() > 0
