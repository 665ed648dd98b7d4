"""PEP-FedPT's class-contextualised mixed prompts (CCMP), without Flower.

At class layer l, sample x on client k mixes the global class prompts with

    w_c(x) ∝ prior_k[c] · exp(cos(cls_{l-1}(x), mu^l_c) / tau),

normalised over classes, where ``prior_k`` is the client's label distribution
and ``mu^l`` the global class prototypes (means of ``cls_{l-1}`` pooled on the
server with momentum, see :func:`fedapp.methods.per_class.merge_per_class`).

Our readings where the paper is silent: a class without a prototype yet (no
training client has held it) scores a cosine of 0, so in round 1 the mixture
is the prior-weighted mean of the class prompts, the optimum of the paper's
quadratic bound; prototypes travel flattened as ``(classes, layers * width)``
so one per-class merge serves every class layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.errors import ModelError
from fedapp.models.vpt import ClassMixer

MIXERS = ("ccmp", "oracle")
"""``ccmp``: the paper's per-sample mixing; ``oracle``: each sample's own label's class prompt
(an ablation that reads the labels, in training and in evaluation: it bounds what the mixing can give)."""


def class_prior(label_counts: np.ndarray) -> Tensor:
    """The client's empirical label distribution ``(classes,)``."""
    counts = torch.as_tensor(np.asarray(label_counts), dtype=torch.float32)
    total = counts.sum()
    if total <= 0:
        raise ValueError("a class prior needs at least one labelled sample")
    return counts / total


def mixing_weights(cls: Tensor, prototypes: Tensor, present: Tensor, prior: Tensor, temperature: float) -> Tensor:
    """Per-sample weights of the class prompts at one class layer.

    Parameters
    ----------
    cls
        ``(batch, width)`` CLS tokens entering the layer.
    prototypes
        ``(classes, width)`` global prototypes of that layer.
    present
        ``(classes,)`` 1 where a prototype exists, 0 where it does not yet.
    prior
        ``(classes,)`` the client's label distribution; classes it lacks get weight 0.
    temperature
        tau > 0; smaller is sharper.

    Returns
    -------
    Tensor
        ``(batch, classes)``, each row a probability distribution.
    """
    cosine = F.normalize(cls.float(), dim=-1) @ F.normalize(prototypes.float(), dim=-1).T
    cosine = cosine * (present.float() > 0)
    # log(prior) turns the product with the prior into a sum inside the softmax.
    scores = cosine / temperature + torch.log(prior.float().clamp(min=0))
    return torch.softmax(scores, dim=-1)


def ccmp_mixer(
    prototypes: np.ndarray, present: np.ndarray, prior: Tensor, temperature: float, num_layers: int
) -> ClassMixer:
    """A :data:`~fedapp.models.vpt.ClassMixer` from the flattened global prototypes.

    ``prototypes`` is ``(classes, num_layers * width)`` as the server sends it.
    """
    classes = prototypes.shape[0]
    per_layer = torch.as_tensor(prototypes, dtype=torch.float32).reshape(classes, num_layers, -1).transpose(0, 1)
    mask = torch.as_tensor(present, dtype=torch.float32)

    def mix(j: int, cls: Tensor) -> Tensor:
        return mixing_weights(cls, per_layer[j].to(cls.device), mask.to(cls.device), prior.to(cls.device), temperature)

    return mix


class OracleMixer(nn.Module):
    """The ``oracle`` ablation's mixer: weights one-hot on each sample's true label, so every
    sample gets exactly its class's prompt. It needs the batch's labels, shown to it by
    :func:`labels_shown`; without them (an unlabelled image) it refuses to guess."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.labels: Tensor | None = None

    def forward(self, j: int, cls: Tensor) -> Tensor:
        if self.labels is None:
            raise ModelError(
                "pep-mixer = 'oracle' mixes each sample's own label's prompt: it is an ablation that reads the "
                "labels, and cannot predict an image whose label it is not shown"
            )
        return F.one_hot(self.labels.to(cls.device), self.num_classes).to(torch.float32)


@contextlib.contextmanager
def labels_shown(model: nn.Module, labels: Tensor) -> Iterator[None]:
    """Shows ``labels`` to ``model``'s mixer while the block runs if it is an :class:`OracleMixer`
    (any other mixer never sees them)."""
    mixer = getattr(model, "mixer", None)
    if not isinstance(mixer, OracleMixer):
        yield
        return
    mixer.labels = labels
    try:
        yield
    finally:
        mixer.labels = None


def labelled_forward(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
    """``model(images)``, its mixer shown the labels (see :func:`labels_shown`)."""
    with labels_shown(model, labels):
        return model(images)


def labelled_cross_entropy(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
    """The training loop's cross-entropy of :func:`labelled_forward`."""
    return F.cross_entropy(labelled_forward(model, images, labels), labels)


class MixingRecorder:
    """Records how the per-sample mixing behaves while ``model`` runs over ``labels``' samples in
    order (the pass that computes the prototypes, so no pass of its own): the mean entropy (nats)
    of the class weights over samples and class layers (``mix_entropy``; ln(classes) is uniform,
    0 is one class), and how often their top class is the sample's label (``mix_top_is_label``).

    ``with MixingRecorder(model, labels) as recorder: ...`` then ``recorder.figures()``; ``model``
    is a :class:`~fedapp.models.vpt.PromptedViT` whose mixer is a module.
    """

    def __init__(self, model: nn.Module, labels: Tensor) -> None:
        self.model, self.labels = model, labels
        self.entropy = self.hits = 0.0
        self.seen, self.start, self.end = 0, 0, 0

    def _record(self, _mixer: nn.Module, inputs: tuple, weights: Tensor) -> None:
        if inputs[0] == 0:  # the first class layer of a new batch: the next samples in order
            self.start, self.end = self.end, self.end + weights.shape[0]
        labels = self.labels[self.start : self.end].to(weights.device)
        # Summed on the device; read once in figures().
        self.entropy = self.entropy + (-(weights * weights.clamp_min(1e-12).log()).sum(dim=1).sum()).double()
        self.hits = self.hits + (weights.argmax(dim=1) == labels).sum().double()
        self.seen += weights.shape[0]

    def __enter__(self) -> MixingRecorder:
        self._handle = self.model.mixer.register_forward_hook(self._record)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()

    def figures(self) -> dict[str, float]:
        if self.seen == 0:
            return {}
        return {"mix_entropy": float(self.entropy) / self.seen, "mix_top_is_label": float(self.hits) / self.seen}


def relative_change(before: Tensor, after: Tensor) -> float:
    """``||after - before|| / ||before||``: how far a round's training moved a tensor (0 without a norm)."""
    before = before.to(device=after.device, dtype=torch.float32)  # taken before training moved the model
    norm = float(before.norm())
    return float((after.float() - before).norm()) / norm if norm > 0 else 0.0
