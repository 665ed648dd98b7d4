"""SDFed math: subspace refinement, retention/separation losses, the local objective.

Our reading of the paper is on the docs' SDFed page. Each client holds a
shared global prompt ``G_s`` (8 × d_tok) and a private local prompt ``G_c``
(S_l × d_tok). Once per round the received ``G_s`` yields a projector ``R``
that removes its dominant right-singular directions; the local branch uses
``G̃_c = G_c R``. One sequence ``[G_s][G̃_c][class]`` goes through the frozen
text encoder (or, the other reading, two branches ``[G_s][class]`` and
``[G̃_c][class]`` through the same encoder and class tokens, their cosines
averaged). How long each
client's ``G_c`` is comes from :mod:`fedapp.methods.local_prompt_lengths`, the projector and
refinement from :mod:`fedapp.methods.sdfed_subspace` (both re-exported here, where callers such
as the config check and the client import them).

Nothing here imports Flower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.errors import ConfigError
from fedapp.methods.local_prompt_lengths import parse_local_lengths, sample_local_lengths
from fedapp.methods.sdfed_subspace import (
    PROJECTOR_MODES,
    Projector,
    build_projector,
    check_prompt,
    refine,
    removed_energy,
    subspace_projector,
    top_right_singular_vectors,
)
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder, clip_logits
from fedapp.training import LossFn

__all__ = [
    "COMBINATIONS",
    "DEFAULT_COMBINATION",
    "PROJECTOR_MODES",
    "Projector",
    "SDFedClassifier",
    "SDFedWeights",
    "build_projector",
    "mechanism_figures",
    "parse_local_lengths",
    "refine",
    "removed_energy",
    "retention_loss",
    "round_classifier",
    "sample_local_lengths",
    "sdfed_class_logits",
    "sdfed_logits",
    "sdfed_loss",
    "sdfed_train_loss",
    "separation_loss",
    "subspace_projector",
    "top_right_singular_vectors",
]

COMBINATIONS: tuple[str, ...] = ("average", "sequence")
"""How the two prompts make a class's text: ``average`` encodes ``[G_s][class]`` and
``[G̃_c][class]`` and averages the two cosines; ``sequence`` (default, the reading that
scored higher in the claims) encodes one sequence ``[SOS][G_s][G̃_c][class][EOS]``."""

DEFAULT_COMBINATION = "sequence"
"""The one default of :data:`COMBINATIONS` for the weights, the classifier and the logits."""


def retention_loss(d_local: Tensor, d_refined: Tensor) -> Tensor:
    """Information retention ``L_str = ‖d(G_c) − d(G_c R)‖²`` (mean over leading dims)."""
    return (d_local - d_refined).pow(2).sum(dim=-1).mean()


def separation_loss(d_local: Tensor, d_global: Tensor, gamma: float = 0.8) -> Tensor:
    """Divergence control ``L_sep = ReLU(γ − ‖d(G_c) − d(G_s)‖)`` (mean over leading dims)."""
    distance = torch.linalg.vector_norm(d_local - d_global, dim=-1)
    return F.relu(gamma - distance).mean()


def sdfed_logits(
    image_features: Tensor,
    text_global: Tensor,
    text_local: Tensor,
    logit_scale: Tensor | float,
) -> Tensor:
    """``s · ½ (cos(f, t^G) + cos(f, t^L))`` for normalised features.

    Parameters
    ----------
    image_features : Tensor
        ``(N, D)``, normalised.
    text_global, text_local : Tensor
        ``(K, D)`` class embeddings of the two branches, normalised.
    logit_scale : Tensor or float
        The frozen model's log temperature; ``s = exp(logit_scale)``.

    Returns
    -------
    Tensor
        ``(N, K)`` logits.
    """
    return 0.5 * (
        clip_logits(image_features, text_global, logit_scale) + clip_logits(image_features, text_local, logit_scale)
    )


def sdfed_class_logits(
    encoder: PromptTextEncoder,
    global_ctx: Tensor,
    refined_ctx: Tensor,
    image_features: Tensor,
    logit_scale: Tensor | float,
    combination: str = DEFAULT_COMBINATION,
) -> Tensor:
    """Logits of the two prompts combined as ``combination`` says (:data:`COMBINATIONS`).

    Parameters
    ----------
    encoder : PromptTextEncoder
        The frozen text encoder with this client's classes.
    global_ctx, refined_ctx : Tensor
        ``G_s`` ``(8, d_tok)`` and ``G̃_c = G_c R`` ``(S_l, d_tok)``.
    image_features : Tensor
        ``(N, D)``, normalised.
    logit_scale : Tensor or float
        The frozen model's log temperature.
    combination : str
        ``average`` or ``sequence``.

    Returns
    -------
    Tensor
        ``(N, K)`` logits.
    """
    if combination == "sequence":
        return clip_logits(image_features, encoder.encode_classes(torch.cat([global_ctx, refined_ctx])), logit_scale)
    return sdfed_logits(
        image_features, encoder.encode_classes(global_ctx), encoder.encode_classes(refined_ctx), logit_scale
    )


@dataclass(frozen=True)
class SDFedWeights:
    """SDFed's loss weights and refinement hyper-parameters (paper defaults).

    Attributes
    ----------
    alpha : float
        Weight of the retention loss ``L_str``.
    beta : float
        Weight of the separation loss ``L_sep``.
    gamma : float
        Margin γ of ``L_sep``.
    lam : float
        Fraction λ of directions the projector removes.
    combination : str
        One of :data:`COMBINATIONS`.
    separation_moves_global : bool
        Whether ``L_sep``'s gradient reaches ``G_s`` (True, the loss as written: each
        client also pushes the shared prompt away from its local one before upload) or
        only ``G_c`` (False: ``G_s`` is a fixed target inside ``L_sep``).
    """

    alpha: float = 1.0
    beta: float = 1.0
    gamma: float = 0.8
    lam: float = 0.6
    combination: str = DEFAULT_COMBINATION
    separation_moves_global: bool = True

    def __post_init__(self) -> None:
        if self.combination not in COMBINATIONS:
            raise ConfigError(f"unknown SDFed combination {self.combination!r}; valid: {', '.join(COMBINATIONS)}")
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"SDFed {name} must be a finite non-negative number; got {value}")
        if not 0.0 <= self.lam <= 1.0:
            raise ConfigError(f"SDFed lambda must lie in [0, 1]; got {self.lam}")


def sdfed_loss(
    encoder: PromptTextEncoder,
    global_ctx: Tensor,
    local_ctx: Tensor,
    projector: Tensor,
    image_features: Tensor,
    labels: Tensor,
    logit_scale: Tensor | float,
    weights: SDFedWeights | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SDFed's client objective ``CE + α L_str + β L_sep``.

    The logits combine ``G_s`` and ``G_c R`` as ``weights.combination`` says;
    ``d(·)`` is :meth:`PromptTextEncoder.encode_bare`. Both prompts get
    gradients (the global prompt is trained locally before upload, through
    ``L_sep`` too unless ``weights.separation_moves_global`` is False).

    Parameters
    ----------
    encoder : PromptTextEncoder
        The frozen text encoder with this client's classes.
    global_ctx : Tensor
        ``G_s``, ``(8, d_tok)``.
    local_ctx : Tensor
        ``G_c``, ``(S_l, d_tok)``.
    projector : Tensor
        ``R`` from :func:`subspace_projector`, ``(d_tok, d_tok)``.
    image_features : Tensor
        ``(N, D)`` normalised frozen image features.
    labels : Tensor
        ``(N,)`` class indices into the encoder's classes.
    logit_scale : Tensor or float
        The frozen model's log temperature.
    weights : SDFedWeights, optional
        Defaults to the paper's values.

    Returns
    -------
    tuple[Tensor, dict[str, Tensor]]
        The scalar loss, and ``loss``, ``ce``, ``retention``, ``separation``
        as detached 0-d tensors on the features' device (``float()`` reads one;
        on a GPU that read waits for the step, so the training loop does not).
    """
    weights = weights or SDFedWeights()
    refined = refine(local_ctx, projector)
    logits = sdfed_class_logits(encoder, global_ctx, refined, image_features, logit_scale, weights.combination)
    ce = F.cross_entropy(logits, labels.to(logits.device))
    d_local = encoder.encode_bare(local_ctx)
    retention = retention_loss(d_local, encoder.encode_bare(refined))
    separation_target = global_ctx if weights.separation_moves_global else global_ctx.detach()
    separation = separation_loss(d_local, encoder.encode_bare(separation_target), weights.gamma)
    loss = ce + weights.alpha * retention + weights.beta * separation
    terms = {"loss": loss, "ce": ce, "retention": retention, "separation": separation}
    return loss, {name: term.detach() for name, term in terms.items()}


class SDFedClassifier(nn.Module):
    """SDFed's prompt classifier (one sequence or two branches); ``projector`` is fixed for the round."""

    def __init__(
        self,
        encoder: PromptTextEncoder,
        global_context: PromptContext,
        local_context: PromptContext,
        projector: Tensor,
        logit_scale: Tensor | float,
        combination: str = DEFAULT_COMBINATION,
    ) -> None:
        super().__init__()
        self.combination = combination
        self.encoder = encoder
        self.global_context = global_context
        self.local_context = local_context
        self.register_buffer("projector", projector.detach().clone())
        self.register_buffer("logit_scale", torch.as_tensor(logit_scale).detach().clone())

    def loss(self, features: Tensor, labels: Tensor, weights: SDFedWeights) -> tuple[Tensor, dict[str, Tensor]]:
        """:func:`sdfed_loss` of this round's prompts, projector and temperature."""
        return sdfed_loss(
            self.encoder,
            self.global_context.context,
            self.local_context.context,
            self.projector,
            features,
            labels,
            self.logit_scale,
            weights,
        )

    def forward(self, image_features: Tensor) -> Tensor:
        refined = refine(self.local_context.context, self.projector)
        return sdfed_class_logits(
            self.encoder, self.global_context.context, refined, image_features, self.logit_scale, self.combination
        )


@torch.no_grad()
def mechanism_figures(model: SDFedClassifier, features: Tensor, labels: Tensor, weights: SDFedWeights) -> dict:
    """What shows SDFed's mechanism at work on a client's data, after its round's training: the
    loss's three terms (``sdfed_ce``, ``sdfed_retention`` L_str, ``sdfed_separation`` L_sep) on
    its training features, and the share of its local prompt's energy the projector removes
    (``projector_removed_energy``)."""
    _, terms = model.loss(features, labels, weights)
    figures = {f"sdfed_{name}": float(terms[name]) for name in ("ce", "retention", "separation")}
    figures["projector_removed_energy"] = removed_energy(model.local_context.context, model.projector)
    return figures


def sdfed_train_loss(weights: SDFedWeights) -> LossFn:
    """CE + alpha L_str + beta L_sep for the shared train loop."""

    def loss(model: SDFedClassifier, features: Tensor, labels: Tensor) -> Tensor:
        return model.loss(features, labels, weights)[0]

    return loss


def round_classifier(
    encoder: PromptTextEncoder,
    global_context: PromptContext,
    local_context: PromptContext,
    weights: SDFedWeights,
    logit_scale: Tensor | float,
    projector_mode: str = "dim",
) -> SDFedClassifier:
    """One round's classifier: subspace refinement from the global prompt as received
    (the projector is built once per round and held fixed), then the classifier of both prompts.

    Raises
    ------
    ModelError
        If either prompt is not 2-D or holds NaN or infinite values.
    """
    check_prompt(local_context.context.detach(), "local prompt")
    projector = build_projector(global_context.context.detach(), lam=weights.lam, mode=projector_mode)
    return SDFedClassifier(
        encoder, global_context, local_context, projector.matrix, logit_scale, combination=weights.combination
    )
