"""SDFed math: projector geometry, losses, the local objective and local prompt lengths."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from fedapp.errors import ConfigError, ModelError
from fedapp.methods import local_prompt_lengths, sdfed
from fedapp.methods.local_prompt_lengths import parse_local_lengths, sample_local_lengths
from fedapp.methods.sdfed import (
    SDFedClassifier,
    SDFedWeights,
    build_projector,
    mechanism_figures,
    refine,
    removed_energy,
    retention_loss,
    round_classifier,
    sdfed_class_logits,
    sdfed_logits,
    sdfed_loss,
    separation_loss,
    subspace_projector,
    top_right_singular_vectors,
)
from fedapp.models import LoadedClip
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder, clip_logits

CLASS_NAMES = ("cat", "dog", "bird")


@pytest.fixture(scope="module")
def encoder(clip: LoadedClip) -> PromptTextEncoder:
    return PromptTextEncoder(clip, CLASS_NAMES)


@pytest.fixture(scope="module")
def width(clip: LoadedClip) -> int:
    assert clip.text_width == 64  # the tiny model's token width, used as d below
    return clip.text_width


def _random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_projector_is_symmetric_idempotent_and_constant(width: int) -> None:
    g = _random(8, width, seed=0).requires_grad_()
    r = subspace_projector(g)
    assert r.shape == (width, width) and not r.requires_grad
    torch.testing.assert_close(r, r.T, atol=1e-5, rtol=0)
    torch.testing.assert_close(r @ r, r, atol=1e-5, rtol=0)


def test_projector_removes_exactly_the_top_directions(width: int) -> None:
    g = _random(8, width, seed=1)
    proj = build_projector(g, lam=0.6, mode="rank")
    assert proj.rank == 8 and proj.k == 4  # floor(0.6 * 8)
    _, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
    x_top = vh[:4].float()
    # Same subspace as the SVD's top-4 (signs may differ).
    torch.testing.assert_close(proj.removed_directions.T @ proj.removed_directions, x_top.T @ x_top, atol=1e-5, rtol=0)
    r = proj.matrix
    torch.testing.assert_close(x_top @ r, torch.zeros(4, width), atol=1e-5, rtol=0)
    kept = vh[4:8].float()  # rest of the row space
    torch.testing.assert_close(kept @ r, kept, atol=1e-5, rtol=0)
    g_c = _random(16, width, seed=2)
    torch.testing.assert_close(refine(g_c, r) @ x_top.T, torch.zeros(16, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.trace(r), torch.tensor(float(width - 4)), atol=1e-4, rtol=0)


def test_rank_mode_uses_numerical_rank(width: int) -> None:
    g = _random(8, 5, seed=3) @ _random(5, width, seed=4)  # rank 5 in an 8-row prompt
    proj = build_projector(g, lam=0.6, mode="rank")
    assert proj.rank == 5 and proj.k == 3
    assert build_projector(g, lam=0.6, mode="rank", rank_tol=1e9).k == 0
    assert torch.equal(build_projector(g, lam=0.0).matrix, torch.eye(width))


def test_dim_mode_removes_floor_lambda_d(width: int) -> None:
    g = _random(8, width, seed=5)
    proj = build_projector(g, lam=0.6, mode="dim")
    assert proj.k == int(0.6 * width) == 38
    r = proj.matrix
    torch.testing.assert_close(r @ r, r, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.trace(r), torch.tensor(float(width - 38)), atol=1e-4, rtol=0)
    torch.testing.assert_close(g @ r, torch.zeros(8, width), atol=1e-4, rtol=0)  # whole row space removed
    assert top_right_singular_vectors(g, 38).shape == (38, width)


def test_projector_errors(width: int) -> None:
    g = _random(8, width, seed=6)
    with pytest.raises(ConfigError, match="mode 'full'"):
        subspace_projector(g, mode="full")
    with pytest.raises(ConfigError, match="lambda"):
        subspace_projector(g, lam=1.5)
    with pytest.raises(ModelError, match="2-D"):
        subspace_projector(g[0])
    with pytest.raises(ModelError, match="width 32 does not match"):
        refine(_random(4, 32, seed=7), subspace_projector(g))


def test_refine_passes_gradients(width: int) -> None:
    g_c = _random(6, width, seed=8).requires_grad_()
    refine(g_c, subspace_projector(_random(8, width, seed=9))).sum().backward()
    assert g_c.grad is not None and g_c.grad.abs().sum() > 0


def test_separation_loss_hinge() -> None:
    d_global = torch.tensor([1.0, 0.0])
    far = torch.tensor([0.0, 1.0])  # distance sqrt(2) > 0.8
    near = torch.tensor([0.8, 0.6])  # distance sqrt(0.4) ~ 0.632 < 0.8
    assert float(separation_loss(far, d_global, gamma=0.8)) == 0.0
    assert float(separation_loss(near, d_global, gamma=0.8)) == pytest.approx(0.8 - 0.4**0.5)
    assert float(separation_loss(near, d_global, gamma=0.6)) == 0.0


def test_retention_loss(encoder: PromptTextEncoder, width: int) -> None:
    g_c = _random(6, width, seed=10) * 0.02
    d_local = encoder.encode_bare(g_c)
    assert float(retention_loss(d_local, encoder.encode_bare(refine(g_c, torch.eye(width))))) == 0.0
    refined = refine(g_c, subspace_projector(_random(8, width, seed=11)))
    value = retention_loss(d_local, encoder.encode_bare(refined))
    assert float(value) > 0
    assert float(value) == pytest.approx(float((d_local - encoder.encode_bare(refined)).norm() ** 2), rel=1e-5)


def test_sdfed_logits_average_the_branches() -> None:
    f = torch.nn.functional.normalize(_random(5, 4, seed=12), dim=-1)
    tg = torch.nn.functional.normalize(_random(3, 4, seed=13), dim=-1)
    tl = torch.nn.functional.normalize(_random(3, 4, seed=14), dim=-1)
    scale = torch.tensor(2.0)
    expected = 0.5 * (clip_logits(f, tg, scale) + clip_logits(f, tl, scale))
    torch.testing.assert_close(sdfed_logits(f, tg, tl, scale), expected)
    torch.testing.assert_close(sdfed_logits(f, tg, tg, scale), scale.exp() * f @ tg.T)


def test_sdfed_loss_trains_both_prompts_only(clip: LoadedClip, encoder: PromptTextEncoder, width: int) -> None:
    global_ctx = PromptContext(8, width, generator=15)
    local_ctx = PromptContext(12, width, generator=16)
    r = subspace_projector(global_ctx.context)
    features = torch.nn.functional.normalize(_random(6, encoder.embed_dim, seed=17), dim=-1)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    loss, parts = sdfed_loss(
        encoder, global_ctx(), local_ctx(), r, features, labels, clip.model.logit_scale, SDFedWeights()
    )
    assert torch.isfinite(loss) and loss.ndim == 0
    assert set(parts) == {"loss", "ce", "retention", "separation"}
    assert all(part.ndim == 0 and not part.requires_grad for part in parts.values())
    parts = {name: float(part) for name, part in parts.items()}
    assert parts["loss"] == pytest.approx(parts["ce"] + parts["retention"] + parts["separation"], rel=1e-5)
    loss.backward()
    for ctx in (global_ctx, local_ctx):
        assert ctx.context.grad is not None and ctx.context.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in clip.model.parameters())


def test_weights_validation() -> None:
    assert SDFedWeights() == SDFedWeights(alpha=1.0, beta=1.0, gamma=0.8, lam=0.6)
    with pytest.raises(ConfigError, match="alpha"):
        SDFedWeights(alpha=-1.0)
    with pytest.raises(ConfigError, match="lambda"):
        SDFedWeights(lam=2.0)


def test_sample_local_lengths() -> None:
    a = sample_local_lengths(50, seed=3)
    assert a == sample_local_lengths(50, seed=3)
    assert a != sample_local_lengths(50, seed=4)
    assert len(a) == 50 and all(4 <= n <= 64 for n in a)
    assert set(sample_local_lengths(200, seed=0, low=2, high=3)) == {2, 3}
    with pytest.raises(ConfigError):
        sample_local_lengths(3, seed=0, low=8, high=4)


def test_parse_local_lengths() -> None:
    assert parse_local_lengths("16", 3, seed=0) == [16, 16, 16]
    assert parse_local_lengths(16, 2, seed=0) == [16, 16]
    assert parse_local_lengths("4,8,16,32", 6, seed=0) == [4, 8, 16, 32, 4, 8]
    assert parse_local_lengths(" 4, 8 ", 3, seed=0) == [4, 8, 4]
    assert parse_local_lengths("random", 10, seed=1) == sample_local_lengths(10, seed=1)
    drawn = parse_local_lengths("random:4-8", 20, seed=1)
    assert drawn == sample_local_lengths(20, seed=1, low=4, high=8) and all(4 <= n <= 8 for n in drawn)
    for bad in ("", "abc", "4;8", "0", "4,0", "random:9-4", "random:4", "-3"):
        with pytest.raises(ConfigError, match="local prompt lengths"):
            parse_local_lengths(bad, 4, seed=0)


def test_local_lengths_stay_importable_from_sdfed_and_need_no_torch() -> None:
    assert sdfed.parse_local_lengths is parse_local_lengths and sdfed.sample_local_lengths is sample_local_lengths
    # The config check parses the lengths; the module itself imports no torch.
    tree = ast.parse(Path(local_prompt_lengths.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "re", "numpy", "fedapp.errors"}


def test_round_classifier_refuses_a_local_prompt_that_is_not_finite(
    clip: LoadedClip, encoder: PromptTextEncoder, width: int
) -> None:
    # refine() runs in every step and checks shapes only; the values are checked once a round.
    local_ctx = PromptContext(4, width, generator=21)
    with torch.no_grad():
        local_ctx.context[1, 0] = float("nan")
    refine(local_ctx.context, torch.eye(width))  # no read of values here
    with pytest.raises(ModelError, match="local prompt contains NaN"):
        round_classifier(encoder, PromptContext(8, width, generator=20), local_ctx, SDFedWeights(), 1.0)


def test_the_projector_removes_little_of_a_local_prompt_by_rank_and_much_by_width(width: int) -> None:
    """What refinement takes from a local prompt in each reading of ⌊λm⌋ (issue 41): by the rank
    of G_s (8 tokens: 4 directions) a random local prompt keeps nearly all its energy; by the
    token width (the paper's literal m) it keeps about 1 - λ of it."""
    global_prompt, local_prompt = _random(8, width, seed=30), _random(16, width, seed=31)
    by_rank = removed_energy(local_prompt, build_projector(global_prompt, lam=0.6, mode="rank").matrix)
    by_width = removed_energy(local_prompt, build_projector(global_prompt, lam=0.6, mode="dim").matrix)
    assert 0.0 < by_rank < 0.2 and 0.4 < by_width < 0.8
    assert removed_energy(local_prompt, torch.eye(width)) == pytest.approx(0.0, abs=1e-6)


def test_an_sdfed_round_reports_its_loss_terms_and_the_removed_energy(encoder: PromptTextEncoder, width: int) -> None:
    global_ctx, local_ctx = PromptContext(8, width, generator=32), PromptContext(12, width, generator=33)
    model = round_classifier(encoder, global_ctx, local_ctx, SDFedWeights(), torch.tensor(1.0))
    features = torch.nn.functional.normalize(_random(6, encoder.embed_dim, seed=34), dim=-1)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    figures = mechanism_figures(model, features, labels, SDFedWeights())
    assert set(figures) == {"sdfed_ce", "sdfed_retention", "sdfed_separation", "projector_removed_energy"}
    expected = sdfed_loss(encoder, global_ctx(), local_ctx(), model.projector, features, labels, 1.0)[1]
    assert figures["sdfed_ce"] == pytest.approx(float(expected["ce"]))
    assert figures["projector_removed_energy"] == pytest.approx(removed_energy(local_ctx.context, model.projector))


def test_the_default_projector_is_the_papers_floor_lambda_m_over_the_token_width(
    encoder: PromptTextEncoder, width: int
) -> None:
    """The paper's X = [x_1, ..., x_m] and its top ⌊λm⌋ (issue 41): the run config, the functions and
    the round's classifier all default to it; the old default (the rank) removed 4 directions."""
    from fedapp.config import RunConfig  # noqa: PLC0415

    assert RunConfig.from_values({"method": "sdfed"}).options.projector_mode == "dim"
    global_ctx = PromptContext(8, width, generator=40)
    model = round_classifier(encoder, global_ctx, PromptContext(6, width, generator=41), SDFedWeights(), 1.0)
    torch.testing.assert_close(torch.trace(model.projector), torch.tensor(float(width - int(0.6 * width))))
    assert build_projector(global_ctx.context).k == int(0.6 * width)


def test_the_sequence_combination_is_the_default_everywhere() -> None:
    """The evidence decides where the paper does not (issue 41): one sequence beat the average in
    every seed under pathological skew, so the run config, the weights and the classifier default to it."""
    from fedapp.config import RunConfig  # noqa: PLC0415

    assert RunConfig.from_values({"method": "sdfed"}).options.sdfed_combination == "sequence"
    assert SDFedWeights().combination == "sequence"
    for function in (sdfed_class_logits, SDFedClassifier.__init__):
        assert inspect.signature(function).parameters["combination"].default == "sequence"


def test_the_sequence_combination_encodes_one_prompt_of_both(encoder: PromptTextEncoder, width: int) -> None:
    global_ctx, local_ctx = PromptContext(8, width, generator=42), PromptContext(6, width, generator=43)
    features = torch.nn.functional.normalize(_random(5, encoder.embed_dim, seed=44), dim=-1)
    sequence = round_classifier(encoder, global_ctx, local_ctx, SDFedWeights(combination="sequence"), 1.0)
    average = round_classifier(encoder, global_ctx, local_ctx, SDFedWeights(combination="average"), 1.0)
    refined = refine(local_ctx.context, sequence.projector)
    with torch.no_grad():
        text = encoder.encode_classes(torch.cat([global_ctx.context, refined]))
        torch.testing.assert_close(sequence(features), clip_logits(features, text, 1.0))
        assert not torch.allclose(sequence(features), average(features))
    labels = torch.tensor([0, 1, 2, 0, 1])
    loss, _ = sequence.loss(features, labels, SDFedWeights(combination="sequence"))
    loss.backward()
    assert global_ctx.context.grad.abs().sum() > 0 and local_ctx.context.grad.abs().sum() > 0
    with pytest.raises(ConfigError, match="unknown SDFed combination 'concat'"):
        SDFedWeights(combination="concat")


def test_a_detached_separation_leaves_the_global_prompt_to_the_cross_entropy(
    encoder: PromptTextEncoder, width: int
) -> None:
    """L_sep as written moves G_s too (each client pushes the shared prompt away from its own local
    prompt before upload); with ``separation_moves_global=False`` only G_c feels it."""
    global_ctx = PromptContext(8, width, generator=45)
    local_ctx = PromptContext(8, width, generator=47)
    features = torch.nn.functional.normalize(_random(4, encoder.embed_dim, seed=46), dim=-1)
    labels = torch.tensor([0, 1, 2, 0])
    eye = torch.eye(width)

    def gradients(weights: SDFedWeights) -> tuple[torch.Tensor, torch.Tensor, dict]:
        global_ctx.context.grad = local_ctx.context.grad = None
        loss, terms = sdfed_loss(encoder, global_ctx(), local_ctx(), eye, features, labels, 1.0, weights)
        loss.backward()
        return global_ctx.context.grad.clone(), local_ctx.context.grad.clone(), terms

    # γ = 2 (the largest distance of unit vectors) keeps the hinge active.
    as_written = gradients(SDFedWeights(alpha=0.0, gamma=2.0))
    detached = gradients(SDFedWeights(alpha=0.0, gamma=2.0, separation_moves_global=False))
    ce_alone = gradients(SDFedWeights(alpha=0.0, beta=0.0))
    assert float(as_written[2]["separation"]) == float(detached[2]["separation"]) > 0  # the hinge is active
    torch.testing.assert_close(detached[0], ce_alone[0])  # G_s: the cross-entropy's gradient alone
    assert not torch.allclose(as_written[0], ce_alone[0])
    torch.testing.assert_close(as_written[1], detached[1])  # G_c: the same either way
