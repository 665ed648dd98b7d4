"""FedD2P (*Leveraging Foundation Models for Efficient Federated Learning in Resource-Restricted
Edge Networks*): IoT CNN clients distil per-class
knowledge into a server-held CLIP through a linguistic-assistance prompt generator.

Client side (no foundation model anywhere near it):

* S1: per-class soft labels ``l_c = mean over class-c samples of softmax(f(x) / tau1)``
  and class counts are uploaded;
* S3: local training on ``CE(f(x), y) + w * KL(g_y || softmax(f(x) / T))`` with
  ``g_y`` the server's knowledge for the sample's class.

Server side: the count-weighted per-class knowledge ``a_c``; a generator turns
the class-description text embeddings ``E`` into ``p`` visual prompt tokens per
class, ``m_c = F_image([CLS][h_c])`` encodes them with the frozen image tower,
and ``g_c = softmax_j(cos(m_c, e_j) / tau2)`` is trained on
``sum_c CE(g_c, c) + KL(a_c || g_c)`` (the FM never trains); ``g`` goes back.

This module imports no open_clip: a client that imports it stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.data.tensors import iterate_batches
from fedapp.errors import ConfigError
from fedapp.methods.fedd2p_options import TEMPLATES
from fedapp.methods.per_class import class_distillation_loss
from fedapp.models.text_prompt import class_phrase
from fedapp.training import LossFn, TensorData

if TYPE_CHECKING:
    from fedapp.models.clip import LoadedClip

DATASET_TEMPLATES = {"digits": "digit"}


GENERATORS = ("attention", "mlp")


# ----- client side ----------------------------------------------------------------


def soft_labels(model: nn.Module, x: Tensor, temperature: float) -> Tensor:
    """``softmax(f(x) / tau1)`` per sample: what a client averages per class."""
    return F.softmax(model(x) / temperature, dim=1)


def knowledge_loss(knowledge: np.ndarray, present: np.ndarray, weight: float, temperature: float) -> LossFn:
    """``CE(f(x), y) + weight * KL(g_y || softmax(f(x) / T))`` for samples whose class
    has knowledge (``present``); plain CE for the others."""

    def kl_to_knowledge(student: Tensor, teacher: Tensor) -> Tensor:
        # Per sample; class_distillation_loss takes the mean over the samples with knowledge.
        return F.kl_div(F.log_softmax(student / temperature, dim=1), teacher, reduction="none").sum(dim=1)

    return class_distillation_loss(knowledge, present, weight, kl_to_knowledge)


# ----- server side ----------------------------------------------------------------


def class_distribution_figures(rows: np.ndarray, present: np.ndarray) -> dict[str, float]:
    """How sharp per-class distributions are (``a_c`` or ``g_c``), over the classes ``present``:
    the mean mass on the row's own class, and the mean entropy (nats). Empty without a class."""
    held = np.flatnonzero(np.asarray(present) > 0)
    if held.size == 0:
        return {}
    own = rows[held, held].astype(np.float64)
    probabilities = np.clip(rows[held].astype(np.float64), 1e-12, 1.0)
    entropy = -(probabilities * np.log(probabilities)).sum(axis=1)
    return {"true_class_mass": float(own.mean()), "entropy": float(entropy.mean())}


@torch.no_grad()
def distillation_term(
    model: nn.Module, data: TensorData, knowledge: np.ndarray, present: np.ndarray, temperature: float, device
) -> float:
    """S3's KL term, ``KL(g_y || softmax(f(x) / T))``, averaged over the samples whose class has
    knowledge (0 when none has): how far the device still is from the server's knowledge."""
    rows = torch.as_tensor(knowledge, dtype=torch.float32, device=device)
    mask = torch.as_tensor(present, dtype=torch.float32, device=device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    model.to(device)
    model.eval()
    for xb, yb in iterate_batches(data.x, data.y, 256, shuffle=False):
        xb, yb = xb.to(device), yb.to(device)
        log_student = F.log_softmax(model(xb) / temperature, dim=1)
        per_sample = F.kl_div(log_student, rows[yb], reduction="none").sum(dim=1)
        total += (per_sample * mask[yb]).sum()
        count += mask[yb].sum()
    return float(total / count) if float(count) > 0 else 0.0


def class_descriptions(class_names: Sequence[str], template: str, dataset: str = "") -> list[str]:
    """One description per class from a template name (:data:`TEMPLATES`), a literal
    template containing ``{c}``, or ``""`` for the dataset's default."""
    chosen = template or TEMPLATES[DATASET_TEMPLATES.get(dataset, "photo")]
    chosen = TEMPLATES.get(chosen, chosen)
    if "{c}" not in chosen:
        raise ConfigError(
            f"config key 'd2p-template' = {template!r} is neither one of {', '.join(TEMPLATES)} "
            "nor a template containing {c}"
        )
    return [chosen.format(c=class_phrase(name)) for name in class_names]


def _heads(width: int) -> int:
    return next(h for h in (8, 4, 2, 1) if width % h == 0)


class PromptGenerator(nn.Module):
    """Maps the class-description embeddings ``E (classes, d)`` to visual prompt
    tokens ``(classes, p, vision_width)``.

    ``kind="attention"`` is the paper's linguistic assistance: multi-head
    self-attention over the classes, ``h_c = softmax(q_c K^T / sqrt(d)) V W_h``;
    ``kind="mlp"`` maps each class on its own (the ablation).
    """

    def __init__(self, text_dim: int, vision_width: int, prompt_tokens: int, kind: str = "attention") -> None:
        super().__init__()
        if kind not in GENERATORS:
            raise ConfigError(f"config key 'd2p-generator' = {kind!r} is not one of: {', '.join(GENERATORS)}")
        self.kind = kind
        self.prompt_tokens = prompt_tokens
        self.vision_width = vision_width
        if kind == "attention":
            self.mixer: nn.Module = nn.MultiheadAttention(text_dim, _heads(text_dim), batch_first=True)
        else:
            self.mixer = nn.Sequential(nn.Linear(text_dim, text_dim), nn.GELU(), nn.Linear(text_dim, text_dim))
        self.out = nn.Linear(text_dim, prompt_tokens * vision_width)  # W_h

    def forward(self, text: Tensor) -> Tensor:
        if self.kind == "attention":
            batch = text.unsqueeze(0)
            hidden = self.mixer(batch, batch, batch, need_weights=False)[0].squeeze(0)
        else:
            hidden = self.mixer(text)
        return self.out(hidden).view(text.shape[0], self.prompt_tokens, self.vision_width)


class ServerKnowledgeModel(nn.Module):
    """The frozen CLIP, the class-description embeddings and the trainable generator."""

    def __init__(
        self, clip: LoadedClip, descriptions: Sequence[str], *, prompt_tokens: int, kind: str, seed: int = 0
    ) -> None:
        super().__init__()
        from fedapp.models.vpt import encode_prompt_tokens  # noqa: PLC0415 - server only

        self._clip = [clip]  # frozen and shared: kept out of parameters() and state_dict()
        self._encode = encode_prompt_tokens
        with torch.no_grad():
            tokens = clip.tokenizer(list(descriptions))
            device = next(clip.model.parameters()).device
            text = clip.model.encode_text(tokens.to(device)).float()
        self.register_buffer("text", F.normalize(text, dim=-1))
        torch.manual_seed(seed)
        self.generator = PromptGenerator(self.text.shape[1], clip.vision_width, prompt_tokens, kind)

    @property
    def clip(self) -> LoadedClip:
        return self._clip[0]

    def class_logits(self, temperature: float) -> Tensor:
        """``cos(m_c, e_j) / tau2``: row c scores class c's prompted image embedding
        against every class description."""
        prompts = self.generator(self.text)
        image = F.normalize(self._encode(self.clip.model.visual, prompts), dim=-1)
        return image @ self.text.T / temperature


def train_generator(
    model: ServerKnowledgeModel,
    knowledge: np.ndarray,
    present: np.ndarray,
    *,
    steps: int,
    lr: float,
    temperature: float,
    distil: bool = True,
) -> float:
    """Train the generator alone on ``sum_c CE(g_c, c) + KL(a_c || g_c)`` over the
    classes with knowledge (``distil=False``: the CE term only, baseline B3).

    Returns the last step's loss.
    """
    device = model.text.device
    target = torch.as_tensor(knowledge, dtype=torch.float32, device=device)
    rows = torch.nonzero(torch.as_tensor(present, device=device) > 0).flatten()
    if rows.numel() == 0:
        return float("nan")
    optimizer = torch.optim.Adam(model.generator.parameters(), lr=lr)
    model.generator.train()
    loss = torch.zeros(())
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        logits = model.class_logits(temperature)[rows]
        loss = F.cross_entropy(logits, rows, reduction="sum")
        if distil:
            loss = loss + F.kl_div(F.log_softmax(logits, dim=1), target[rows], reduction="sum")
        loss.backward()
        optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def global_knowledge(model: ServerKnowledgeModel, temperature: float) -> np.ndarray:
    """``g (classes, classes)``: each row the distribution the generator gives a class."""
    model.generator.eval()
    return F.softmax(model.class_logits(temperature), dim=1).cpu().numpy().astype(np.float32)
