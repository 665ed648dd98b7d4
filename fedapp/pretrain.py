"""Contrastive pretraining of a small open_clip model on labelled images.

Why this module is long: it is one recipe read top to bottom (captions, loss,
augmentation, schedule, the resumable epoch loop and the cache-keyed checkpoint),
each step a short function of its own; the zero-shot accuracy it reports is
:mod:`fedapp.models.zero_shot`'s.

No pretrained weights can be downloaded on an offline machine, yet prompt
learning and CLIP distillation only show their worth on a backbone that knows
something. This module makes such a backbone from an image-classification
source: every image is paired with a caption drawn from several templates
("a photo of a {c}.", "a blurry photo of a {c}.", ...), and both towers are
trained with a symmetric InfoNCE loss in which every pair of the same class
counts as a positive (UniCL's reading of CLIP's loss for labelled data, Yang et
al., 2022), so images of one class are not pushed away from each other's
captions. Augmentation: random 4-pixel-padded crops and horizontal flips.

The images are the ``pretrain`` part of :func:`fedapp.data.reserve.reserve_parts`;
a stratified slice of it is held back for the training curve's zero-shot
accuracy, and the final zero-shot accuracy is measured on the reserve's ``test``
part, which no training (here or federated) ever sees. The result is a
state-dict checkpoint that open_clip's own loader reads
(``load_open_clip(model_name, pretrained=<path>)``).

Runs are deterministic for a seed (per-epoch generators), resumable at epoch
boundaries (``<out>.partial.pt``), and keyed by (model config, data digest,
settings): a finished checkpoint whose key matches is reused, one whose key
differs is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedapp.data.arrays import ArrayDataset, write_atomically
from fedapp.data.reserve import reserve_parts
from fedapp.data.splits import split_stratified
from fedapp.errors import DataError, ModelError
from fedapp.models.clip import LoadedClip, register_tiny_configs
from fedapp.models.image_features import clip_image_batch
from fedapp.models.open_clip_log import open_clip_logging
from fedapp.models.zero_shot import CAPTION_TEMPLATES, caption_tokens, zero_shot_accuracy

__all__ = ["CAPTION_TEMPLATES", "PretrainResult", "PretrainSettings", "pretrain_clip", "zero_shot_accuracy"]

PRECISIONS = ("fp32", "bf16")
_FORMAT = 1  # bump when the training recipe changes, so old cache keys stop matching
_CURVE_SHARE = 0.05  # of the pretraining images, kept back for the training curve


@dataclass(frozen=True)
class PretrainSettings:
    """What a pretraining run depends on besides its data (all part of its cache key)."""

    model_name: str
    epochs: int = 30
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 2.0
    reserve_pretrain: float = 0.5
    reserve_test: float = 0.1
    reserve_seed: int = 0
    seed: int = 0
    templates: tuple[str, ...] = CAPTION_TEMPLATES
    precision: str = "fp32"
    """``"bf16"``: forward passes under bfloat16 autocast (the weights and optimiser stay fp32)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ModelError(f"pretraining precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.epochs < 1 or self.batch_size < 2:
            raise ModelError(f"epochs must be >= 1 and batch size >= 2, got {self.epochs} and {self.batch_size}")
        if not self.templates or any("{c}" not in t for t in self.templates):
            raise ModelError("every caption template needs a '{c}' for the class name")


@dataclass(frozen=True)
class PretrainResult:
    """Where the checkpoint is and how good it is."""

    checkpoint: Path
    key: str
    zero_shot_accuracy: float
    curve: list[dict[str, float | None]]
    cached: bool


def data_digest(source: ArrayDataset) -> str:
    """SHA-256 of the decoded images, labels and class names."""
    digest = hashlib.sha256()
    digest.update(json.dumps(source.class_names).encode())
    digest.update(np.ascontiguousarray(source.labels, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(source.images).tobytes())
    return digest.hexdigest()


def cache_key(settings: PretrainSettings, model_config: dict[str, Any], digest: str) -> str:
    """Identity of a pretraining run: recipe version, model config, data and settings."""
    recipe = asdict(settings)
    if recipe["precision"] == "fp32":
        del recipe["precision"]  # the recipe before bf16 existed: its checkpoints keep their keys
    payload = {"format": _FORMAT, "config": model_config, "data": digest, "settings": recipe}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def model_config_of(model_name: str) -> dict[str, Any]:
    """open_clip's config of ``model_name`` (ours included)."""
    register_tiny_configs()
    import open_clip  # noqa: PLC0415 - only pretraining and CLIP clients need it

    config = open_clip.get_model_config(model_name)
    if config is None:
        raise ModelError(f"unknown open_clip model {model_name!r}")
    return config


def cache_key_of(source: ArrayDataset, settings: PretrainSettings) -> str:
    """The :func:`cache_key` of pretraining on ``source`` with ``settings``, without building the model."""
    return cache_key(settings, model_config_of(settings.model_name), data_digest(source))


def _build(settings: PretrainSettings, device: torch.device) -> tuple[LoadedClip, dict[str, Any]]:
    config = model_config_of(settings.model_name)
    import open_clip  # noqa: PLC0415 - only pretraining and CLIP clients need it

    torch.manual_seed(settings.seed)
    with open_clip_logging():
        model, _, preprocess = open_clip.create_model_and_transforms(settings.model_name)
    model.to(device)  # initialised on the CPU from the seed, so every device starts from the same weights
    clip = LoadedClip(
        model=model,
        preprocess=preprocess,
        tokenizer=open_clip.get_tokenizer(settings.model_name),
        model_name=settings.model_name,
        pretrained="",
        embed_dim=int(config["embed_dim"]),
        text_width=int(config["text_cfg"]["width"]),
        vision_width=int(config["vision_cfg"]["width"]),
    )
    return clip, config


def _augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crops of the 4-pixel reflection-padded images, and horizontal flips.

    The draws come from ``generator`` (on the CPU, so every device draws the same ones);
    the crops and flips are gathered where ``x`` is, in one indexing op for the batch.
    """
    n, _, h, w = x.shape
    padded = F.pad(x, (4, 4, 4, 4), mode="reflect")
    offsets = torch.randint(0, 9, (n, 2), generator=generator).to(x.device)
    flip = (torch.rand(n, generator=generator) < 0.5).to(x.device)
    rows = offsets[:, :1] + torch.arange(h, device=x.device)  # (n, h)
    cols = offsets[:, 1:] + torch.arange(w, device=x.device)  # (n, w)
    batch = torch.arange(n, device=x.device)[:, None, None]
    cropped = padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)  # (n, h, w, c) -> (n, c, h, w)
    return torch.where(flip[:, None, None, None], cropped.flip(-1), cropped).contiguous()


def _multi_positive_loss(
    image: torch.Tensor, text: torch.Tensor, labels: torch.Tensor, logit_scale: torch.Tensor
) -> torch.Tensor:
    """Symmetric InfoNCE where every same-class image/caption pair is a positive."""
    logits = logit_scale.exp() * image @ text.T
    same = (labels[:, None] == labels[None, :]).float()
    targets = same / same.sum(dim=1, keepdim=True)
    image_to_text = -(targets * logits.log_softmax(dim=1)).sum(dim=1).mean()
    text_to_image = -(targets * logits.T.log_softmax(dim=1)).sum(dim=1).mean()
    return (image_to_text + text_to_image) / 2


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # Norms, biases, embeddings' class token and the logit scale are not decayed (as in open_clip's trainer).
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def _sidecar(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + ".json")


def _partial(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + ".partial")


def _read_key(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("key")
    except (OSError, ValueError):
        return None


def default_checkpoint(cache_dir: Path, model_name: str, key: str) -> Path:
    """Where a checkpoint goes when no ``--out`` is given: one file per cache key."""
    return cache_dir / "pretrained" / f"{model_name}-{key}.pt"


def _finished_result(out: Path, key: str) -> PretrainResult | None:
    """The result recorded beside an existing ``out`` made with ``key``; None when there is no ``out``."""
    if not out.exists():
        return None
    if _read_key(_sidecar(out)) != key:
        raise ModelError(
            f"{out} exists but was not made from these settings and data (no {_sidecar(out).name} with key "
            f"{key}); it is left as it is: pass another --out"
        )
    meta = json.loads(_sidecar(out).read_text())
    return PretrainResult(out, key, float(meta["zero_shot_accuracy"]), meta["curve"], cached=True)


def _carve(source: ArrayDataset, settings: PretrainSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of the images that train, that draw the training curve (a stratified slice of the
    reserve's pretraining part) and that measure the result (the reserve's test part)."""
    parts = reserve_parts(
        source.labels, pretrain=settings.reserve_pretrain, test=settings.reserve_test, seed=settings.reserve_seed
    )
    if len(np.unique(source.labels[parts.pretrain])) < source.num_classes:
        raise DataError("reserve-pretrain leaves a class without pretraining images; reserve a larger share")
    if len(parts.test) == 0:
        raise DataError("reserve-test leaves no image to measure the zero-shot accuracy on; reserve a larger share")
    held = split_stratified(parts.pretrain, source.labels, (1 - _CURVE_SHARE, _CURVE_SHARE, 0.0), seed=settings.seed)
    return held.train, held.val, parts.test


def _resume(partial: Path, key: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list, int]:
    """The curve so far and the epoch to start at, restoring model and optimizer from ``partial`` if it exists."""
    if not partial.exists():
        return [], 0
    # Tensors, numbers, strings and lists only: read without unpickling code, onto the model's device.
    state = torch.load(partial, map_location=next(model.parameters()).device, weights_only=True)
    if state.get("key") != key:
        raise ModelError(f"{partial} holds an unfinished run of other settings; remove it or pass another --out")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["curve"], int(state["epoch"]) + 1


def _batch_loss(
    clip: LoadedClip,
    tokens: torch.Tensor,
    source: ArrayDataset,
    batch: np.ndarray,
    template_ids: np.ndarray,
    generator: torch.Generator,
    precision: str = "fp32",
) -> torch.Tensor:
    """The loss of one batch of augmented images, image ``i`` paired with its class's caption from template
    ``template_ids[i]``."""
    model = clip.model
    device = model.logit_scale.device
    labels = torch.as_tensor(source.labels[batch])
    captions = template_ids * source.num_classes + labels.numpy()
    unique, inverse = np.unique(captions, return_inverse=True)
    images = _augment(clip_image_batch(source.images[batch], clip, device=device), generator)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        image_features = F.normalize(model.encode_image(images), dim=-1)
        text_features = F.normalize(model.encode_text(tokens[torch.as_tensor(unique)].to(device)), dim=-1)
    return _multi_positive_loss(
        image_features.float(),
        text_features.float()[torch.as_tensor(inverse, device=device)],
        labels.to(device),
        model.logit_scale,
    )


def _train_epoch(
    clip: LoadedClip,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    source: ArrayDataset,
    train_idx: np.ndarray,
    settings: PretrainSettings,
    epoch: int,
) -> float:
    """One pass over ``train_idx`` in this epoch's seeded order, on the warmup-then-cosine schedule; the mean loss."""
    steps_per_epoch = math.ceil(len(train_idx) / settings.batch_size)
    total_steps, warmup = steps_per_epoch * settings.epochs, max(1, round(settings.warmup_epochs * steps_per_epoch))
    clip.model.train()
    rng = np.random.default_rng([settings.seed, epoch])
    generator = torch.Generator().manual_seed(settings.seed * 100_003 + epoch)
    order = rng.permutation(train_idx)
    losses = []
    for step, start in enumerate(range(0, len(order), settings.batch_size)):
        batch = np.sort(order[start : start + settings.batch_size])
        if len(batch) < 2:
            continue
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(epoch * steps_per_epoch + step, total_steps, warmup, settings.lr)
        template_ids = rng.integers(len(settings.templates), size=len(batch))  # a random caption per image
        loss = _batch_loss(clip, tokens, source, batch, template_ids, generator, settings.precision)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            clip.model.logit_scale.clamp_(0, math.log(100))
        losses.append(loss.detach())  # read once an epoch: a read per step waits for a GPU
    return float(torch.stack(losses).double().mean())


def _train(
    clip: LoadedClip,
    source: ArrayDataset,
    train_idx: np.ndarray,
    curve_idx: np.ndarray,
    settings: PretrainSettings,
    key: str,
    partial: Path,
    on_epoch: Callable[[dict[str, float | None]], None] | None,
) -> list[dict[str, float | None]]:
    """Every epoch not done yet, saving the state to ``partial`` after each; the training curve."""
    tokens = caption_tokens(clip, source.class_names, settings.templates)
    optimizer = torch.optim.AdamW(_param_groups(clip.model, settings.weight_decay), lr=settings.lr)
    curve, first_epoch = _resume(partial, key, clip.model, optimizer)
    images, labels = source.images[curve_idx], source.labels[curve_idx]
    started = time.perf_counter()
    for epoch in range(first_epoch, settings.epochs):
        loss = _train_epoch(clip, optimizer, tokens, source, train_idx, settings, epoch)
        # None when the data is too small to hold a curve slice back.
        held = zero_shot_accuracy(clip, images, labels, source.class_names, settings.templates) if len(images) else None
        row = {"epoch": epoch + 1, "loss": loss, "curve_zero_shot": held, "seconds": time.perf_counter() - started}
        curve.append(row)
        state = {"key": key, "epoch": epoch, "model": clip.model.state_dict(), "optimizer": optimizer.state_dict()}
        write_atomically(partial, lambda handle, state=state: torch.save({**state, "curve": curve}, handle))
        if on_epoch is not None:
            on_epoch(row)
    return curve


def _write_checkpoint(out: Path, clip: LoadedClip, meta: dict[str, Any]) -> None:
    """The model's state dict at ``out`` (as open_clip loads it) and ``meta`` in the sidecar beside it."""
    # On the CPU whatever device trained it: the same file open_clip loads anywhere.
    state_dict = {name: tensor.detach().to("cpu", copy=True) for name, tensor in clip.model.state_dict().items()}
    write_atomically(out, lambda handle: torch.save({"state_dict": state_dict}, handle))
    write_atomically(_sidecar(out), lambda handle: handle.write(json.dumps(meta, indent=2).encode()))


def pretrain_clip(
    source: ArrayDataset,
    settings: PretrainSettings,
    out: Path | None = None,
    *,
    cache_dir: Path | None = None,
    on_epoch: Callable[[dict[str, float | None]], None] | None = None,
    device: torch.device | str = "cpu",
) -> PretrainResult:
    """Pretrain ``settings.model_name`` on the reserve's pretraining part of ``source``.

    Parameters
    ----------
    source : ArrayDataset
        The whole source (all of CIFAR-10's 50,000 training images, say); the
        carve of ``settings.reserve_*`` picks what this run trains and tests on.
    settings : PretrainSettings
        Model, schedule and carve.
    out : Path, optional
        Checkpoint path; default :func:`default_checkpoint` under ``cache_dir``.
        A ``<out>.json`` beside it records the key, the zero-shot accuracy and the
        curve; ``<out>.partial`` holds the state between epochs until the run ends.
    cache_dir : Path, optional
        Needed when ``out`` is not given.
    on_epoch : callable, optional
        Called after every epoch with that epoch's row of the curve (progress).
    device : torch.device or str, default "cpu"
        Where to train (the checkpoint is the same file from any device).

    Returns
    -------
    PretrainResult
        The checkpoint, its key, its zero-shot accuracy on the reserve's test part,
        the curve, and whether it was already there.

    Raises
    ------
    ModelError
        If ``out`` (or its partial state) exists but came from other settings or data.
    DataError
        If the carve leaves a class without pretraining images.
    """
    if out is None and cache_dir is None:
        raise ModelError("pretrain_clip needs an output path or a cache folder")
    key = cache_key_of(source, settings)
    out = Path(out) if out is not None else default_checkpoint(cache_dir, settings.model_name, key)
    finished = _finished_result(out, key)
    if finished is not None:
        return finished  # without building the model: a cached backbone is found in milliseconds
    clip, model_config = _build(settings, torch.device(device))
    train_idx, curve_idx, test_idx = _carve(source, settings)
    curve = _train(clip, source, train_idx, curve_idx, settings, key, _partial(out), on_epoch)
    test_images, test_labels = source.images[test_idx], source.labels[test_idx]
    accuracy = zero_shot_accuracy(clip, test_images, test_labels, source.class_names, settings.templates)
    sizes = {"images": len(source), "pretrain": len(train_idx), "curve": len(curve_idx), "test": len(test_idx)}
    meta = {"key": key, "model_name": settings.model_name, "settings": asdict(settings), "model_config": model_config}
    _write_checkpoint(out, clip, {**meta, "data": sizes, "zero_shot_accuracy": accuracy, "curve": curve})
    _partial(out).unlink(missing_ok=True)
    return PretrainResult(out, key, accuracy, curve, cached=False)
