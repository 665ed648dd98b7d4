"""Loading frozen open_clip backbones, offline when asked to be.

``pretrained`` is resolved here, before open_clip sees it, so that every bad
value fails fast with a :class:`~fedapp.errors.ModelError` and an unknown tag
never triggers a download attempt:

* ``""`` or ``"none"``: random initialisation, no network;
* a local file (``.pt``, ``.pth``, ``.bin``, ``.safetensors``, ``.npz``, or
  anything containing a path separator): architecture built, then checkpoint
  loaded;
* otherwise an open_clip pretrained tag for ``model_name``, downloaded by
  open_clip as usual.

The tiny configs shipped in ``model_configs/`` build random-init models that
run in milliseconds on CPU, for tests and smoke runs.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedapp.errors import ModelError
from fedapp.models.open_clip_log import open_clip_logging

if TYPE_CHECKING:
    from open_clip.model import CLIP

log = logging.getLogger("flwr.fedapp")

__all__ = [
    "SHIPPED_MODELS",
    "SMALL_CLIP",
    "TINY_CLIP",
    "TINY_CONFIG_DIR",
    "TINY_MODELS",
    "TINY_VIT",
    "TINY_VIT_B",
    "LoadedClip",
    "clear_clip_cache",
    "load_open_clip",
    "local_checkpoint",
    "register_tiny_configs",
]

TINY_CLIP = "fedapp-tiny-clip"
"""Tiny random-init CLIP (embed 32, widths 64, 2+2 layers, 32x32 images)."""

TINY_VIT_B = "fedapp-tiny-vit-b"
"""ViT-B-32 widths (embed 512, vision 768, text 512) with only 2+2 layers.

For exercising code whose shapes must match a real ViT-B-32 without weights.
"""

TINY_CLIP_B = "fedapp-tiny-clip-b"
"""Another tiny backbone with TINY_CLIP's text token width (64) but a different image
tower and embedding size: clients running the two can share one text prompt."""

TINY_VIT = "fedapp-tiny-vit"
"""An 8-block ViT for 32x32 images (patch 8, width 128): deep enough for PEP-FedPT's
class layers 5-7 and small enough to prompt-tune on CPU."""

TINY_MODELS: tuple[str, ...] = (TINY_CLIP, TINY_CLIP_B, TINY_VIT_B, TINY_VIT)

SMALL_CLIP = "fedapp-small-clip"
"""A CLIP small enough to pretrain on 2 CPU cores (``benchmarks/pretrain_clip.py``):
ViT image tower at 32 px (patch 8, width 192, 8 blocks), text tower of width 128 with
4 blocks, embedding 128. Random-init until given the checkpoint the script writes."""

SHIPPED_MODELS: tuple[str, ...] = (*TINY_MODELS, SMALL_CLIP)
"""Every config in ``model_configs/``."""
TINY_CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "pure_fp16", "pure_bf16")
_PRECISION_DTYPES = {
    "fp16": torch.float16,
    "pure_fp16": torch.float16,
    "bf16": torch.bfloat16,
    "pure_bf16": torch.bfloat16,
}
_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".npz")
_RANDOM_INIT = ("", "none")
_COMMON_MODELS = ("ViT-B-32", "ViT-B-16", "ViT-L-14", "RN50")


def _open_clip() -> ModuleType:
    # Lazy: importing open_clip (and timm) takes seconds that CNN-only clients should not pay.
    import open_clip  # noqa: PLC0415

    return open_clip


@dataclass(frozen=True)
class LoadedClip:
    """A frozen open_clip model with what is needed to feed it.

    Attributes
    ----------
    model : open_clip.model.CLIP
        In ``eval()`` mode with ``requires_grad=False`` on every parameter.
        Shared by every caller in the process (see :func:`load_open_clip`):
        do not train or mutate it in place.
    preprocess : callable
        open_clip's evaluation transform (PIL image -> tensor).
    tokenizer : callable
        Maps a string or list of strings to a ``(N, context_length)`` tensor.
    model_name : str
        The open_clip model config name.
    pretrained : str
        Normalised source: ``""`` (random init), an absolute checkpoint path, or
        a cleaned pretrained tag.
    embed_dim : int
        Width of the joint image/text embedding.
    text_width : int
        Width of the text tower's token embeddings.
    vision_width : int
        Width of the vision tower's residual stream (pre-projection features).
    precision : str
        The open_clip precision it was loaded with (one of :data:`PRECISIONS`).
    """

    model: CLIP
    preprocess: Callable[[Any], torch.Tensor]
    tokenizer: Callable[..., torch.Tensor]
    model_name: str
    pretrained: str
    embed_dim: int
    text_width: int
    vision_width: int
    precision: str = "fp32"

    @property
    def compute_dtype(self) -> torch.dtype:
        """Dtype of the encoders' matmuls, and so of the inputs they expect.

        With ``fp16``/``bf16`` open_clip casts the linear, conv and attention
        weights only; layer norms and embeddings stay float32.
        """
        return _PRECISION_DTYPES.get(self.precision, torch.float32)


def register_tiny_configs() -> None:
    """Make the configs in ``model_configs/`` known to open_clip.

    Idempotent: the directory is added once, so repeated calls neither grow
    open_clip's search path nor rescan it.
    """
    open_clip = _open_clip()
    # add_model_config appends to open_clip's search path unconditionally.
    if TINY_CONFIG_DIR in open_clip.factory._MODEL_CONFIG_PATHS and all(
        name in open_clip.list_models() for name in SHIPPED_MODELS
    ):
        return
    open_clip.add_model_config(TINY_CONFIG_DIR)


def local_checkpoint(pretrained: str) -> Path | None:
    """The checkpoint file ``pretrained`` names (absolute), or ``None`` for a tag or random init.

    Needs no open_clip, so a launcher can check it before it starts anything. Raises ModelError when
    ``pretrained`` reads as a path (a checkpoint suffix, a separator, ``~``) with no file there.
    """
    value = (pretrained or "").strip()
    if value.lower() in _RANDOM_INIT or not _looks_like_path(value):
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        kind = "is a directory, not a file" if path.is_dir() else "not found"
        raise ModelError(f"checkpoint {kind}: {value}")
    return path.resolve()


def _looks_like_path(value: str) -> bool:
    return "/" in value or os.sep in value or value.startswith("~") or value.lower().endswith(_CHECKPOINT_SUFFIXES)


def _resolve_model_name(model_name: str) -> str:
    open_clip = _open_clip()
    # open_clip itself accepts "ViT-B/32" for "ViT-B-32".
    name = model_name.strip().replace("/", "-")
    valid = open_clip.list_models()
    if name in valid:
        return name
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    examples = [*SHIPPED_MODELS, *(m for m in _COMMON_MODELS if m in valid)]
    raise ModelError(
        f"unknown open_clip model {model_name!r}.{hint} Valid names include "
        f"{', '.join(examples)} ({len(valid)} in total, see open_clip.list_models())"
    )


def _resolve_pretrained(model_name: str, pretrained: str) -> str:
    """Normalise ``pretrained`` to ``""``, an absolute file path or a clean tag.

    Runs before any open_clip loading, so nothing is downloaded for a bad value.
    """
    open_clip = _open_clip()
    value = (pretrained or "").strip()
    if value.lower() in _RANDOM_INIT:
        return ""
    checkpoint = local_checkpoint(value)
    if checkpoint is not None:
        return str(checkpoint)
    tags = open_clip.list_pretrained_tags_by_model(model_name)
    # open_clip matches tags case-insensitively with "-" read as "_".
    tag = value.lower().replace("-", "_")
    if tag in tags:
        return tag
    # A bare file name in the working directory is still a checkpoint.
    if Path(value).is_file():
        return str(Path(value).resolve())
    known = (
        f"valid tags: {', '.join(tags)}"
        if tags
        else "it has no pretrained tags; pass '' for random init or a checkpoint path"
    )
    raise ModelError(f"unknown pretrained tag {pretrained!r} for {model_name}; {known}")


def _text_width(model: nn.Module, cfg: dict[str, Any]) -> int:
    text = getattr(model, "text", model)  # CustomTextCLIP keeps the tower in .text
    embedding = getattr(text, "token_embedding", None)
    if isinstance(embedding, nn.Embedding):
        return int(embedding.embedding_dim)
    hf_config = getattr(getattr(text, "transformer", None), "config", None)
    if hf_config is not None and hasattr(hf_config, "hidden_size"):
        return int(hf_config.hidden_size)
    return int(cfg["text_cfg"]["width"])


def _vision_width(model: nn.Module, cfg: dict[str, Any]) -> int:
    visual = model.visual
    transformer = getattr(visual, "transformer", None)
    if transformer is not None and hasattr(transformer, "width"):
        return int(transformer.width)  # open_clip ViT
    trunk = getattr(visual, "trunk", None)
    if trunk is not None and hasattr(trunk, "num_features"):
        return int(trunk.num_features)  # timm tower
    attnpool = getattr(visual, "attnpool", None)
    if attnpool is not None:
        return int(attnpool.c_proj.in_features)  # ModifiedResNet
    return int(cfg["vision_cfg"]["width"])


def _init_seed(model_name: str) -> int:
    """The seed a backbone's random initialisation is drawn from (a function of its name)."""
    return int.from_bytes(hashlib.sha256(model_name.encode()).digest()[:4], "little") & 0x7FFFFFFF


@functools.lru_cache(maxsize=8)
def _load_cached(model_name: str, pretrained: str, device: str, precision: str) -> LoadedClip:
    started = time.perf_counter()
    with open_clip_logging():
        clip = _load(model_name, pretrained, device, precision)
    # Once per backbone and process: what a worker's first round pays before any training.
    log.info("backbone %s (%s) loaded on %s in %.1f s", model_name, precision, device, time.perf_counter() - started)
    return clip


def _load(model_name: str, pretrained: str, device: str, precision: str) -> LoadedClip:
    open_clip = _open_clip()
    # Without pretrained weights the backbone is its random initialisation: draw it from a
    # seed of the model's name, not from whatever the process's RNG has done so far, so every
    # worker process, the server and every run hold the same backbone. The caller's RNG is
    # left as it was.
    cuda = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(_init_seed(model_name))
            model, _, preprocess = open_clip.create_model_and_transforms(
                model_name,
                pretrained=pretrained or None,
                device=device,
                precision=precision,
            )
    except Exception as err:
        # Name the source: a corrupt or mismatched checkpoint and a failed tag
        # download both surface as bare RuntimeErrors inside open_clip.
        if Path(pretrained).is_absolute():  # resolved checkpoint paths are absolute
            raise ModelError(f"checkpoint {pretrained} could not be loaded into {model_name}: {err}") from err
        if pretrained:
            raise ModelError(
                f"could not fetch pretrained weights {model_name}:{pretrained} ({err}); "
                "offline runs need a local checkpoint path"
            ) from err
        raise
    model.eval()
    model.requires_grad_(False)
    if precision != "fp32" and torch.device(device).type == "cpu":
        # Honoured, so a CPU run computes in the dtype a GPU run would; but CPUs without
        # half-precision matmul units are slow at it (a 2-core AMD EPYC without AVX-512 ran a
        # ViT-B-32-wide image tower 10x slower in bf16 and 20x slower in fp16 than in fp32).
        log.warning(
            "precision = %s on CPU: the frozen encoders of %s run in %s as asked, but on most CPUs "
            "many times slower than in fp32; use precision = fp32 for CPU runs",
            precision,
            model_name,
            str(_PRECISION_DTYPES[precision]).removeprefix("torch."),
        )
    cfg = open_clip.get_model_config(model_name)
    return LoadedClip(
        model=model,
        preprocess=preprocess,
        tokenizer=open_clip.get_tokenizer(model_name),
        model_name=model_name,
        pretrained=pretrained,
        embed_dim=int(cfg["embed_dim"]),
        text_width=_text_width(model, cfg),
        vision_width=_vision_width(model, cfg),
        precision=precision,
    )


def load_open_clip(
    model_name: str,
    pretrained: str = "",
    *,
    device: str = "cpu",
    precision: str = "fp32",
) -> LoadedClip:
    """Load a frozen open_clip model, its eval transform and tokenizer.

    Results are cached per process, keyed on the normalised arguments, so a
    worker builds each backbone once; the same :class:`LoadedClip` is returned
    to every caller.

    Parameters
    ----------
    model_name : str
        An open_clip config name (``open_clip.list_models()``) or one of
        :data:`SHIPPED_MODELS`.
    pretrained : str, default ""
        ``""``/``"none"`` for random init, a local checkpoint file, or an
        open_clip pretrained tag for ``model_name``.
    device : str, default "cpu"
        Torch device to place the model on.
    precision : str, default "fp32"
        One of :data:`PRECISIONS`.

    Returns
    -------
    LoadedClip
        The frozen model (``eval()``, no parameter requires grad) and metadata.

    Raises
    ------
    ModelError
        Unknown model name, unknown tag, missing or unloadable checkpoint,
        unknown precision, or a failed tag download.
    """
    register_tiny_configs()
    if precision not in PRECISIONS:
        raise ModelError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    name = _resolve_model_name(model_name)
    source = _resolve_pretrained(name, pretrained)
    return _load_cached(name, source, str(device), precision)


def clear_clip_cache() -> None:
    """Drop every cached :class:`LoadedClip` (frees the backbones' memory)."""
    _load_cached.cache_clear()


@functools.lru_cache(maxsize=32)
def _text_cfg(model_name: str) -> dict[str, Any]:
    """The ``text_cfg`` of an open_clip model's config (no weights are built or downloaded).

    Cached: config validation asks for every client, and clients validate their
    run config on every message."""
    register_tiny_configs()
    cfg = _open_clip().get_model_config(_resolve_model_name(model_name))
    if cfg is None or "text_cfg" not in cfg:
        raise ModelError(f"open_clip model {model_name!r} has no text tower config")
    return cfg["text_cfg"]


def text_token_width(model_name: str) -> int:
    """Token-embedding width of an open_clip model's text tower, read from its
    config, so the server can size a prompt without loading (or downloading) weights."""
    return int(_text_cfg(model_name).get("width", 512))


def text_context_length(model_name: str) -> int:
    """Tokens the text tower of an open_clip model reads (start, prompt, class name, end),
    from its config alone."""
    return int(_text_cfg(model_name).get("context_length", 77))
