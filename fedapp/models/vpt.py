"""Visual prompt tuning on a frozen open_clip vision transformer.

One prompted forward pass serves every visual-prompt method (FedVPT, FedVPT-D,
local VPT, head-only FedAvg and PEP-FedPT). The token sequence is
``[CLS, prompt slots..., patches]``; a *slot* is a run of prompt tokens that is
inserted the first time a layer writes it and overwritten by later layers that
write it again, so

* shallow VPT writes the ``shared`` slot before block 1 only (the tokens then
  flow through every block),
* deep VPT writes it before every block,
* PEP-FedPT writes ``shared`` before block 1 and a per-sample ``class`` slot
  (a mixture of class-specific prompts) before each of its class layers.

Only :class:`VisualPrompts` trains; the backbone stays frozen. Layers are
numbered from 1 (the first transformer block), as in the papers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.errors import ModelError
from fedapp.models.clip import LoadedClip, _open_clip, _resolve_model_name, register_tiny_configs
from fedapp.models.open_clip_log import open_clip_logging

__all__ = [
    "ClassMixer",
    "PromptedViT",
    "VisionTowerShape",
    "VisualPrompts",
    "encode_prompt_tokens",
    "vision_tower_shape",
]

ClassMixer = Callable[[int, Tensor], Tensor]
"""``mixer(j, cls)`` → ``(batch, classes)`` weights of the class prompts at the
``j``-th class layer, given the CLS token entering that layer."""


@dataclass(frozen=True)
class VisionTowerShape:
    """What a prompt learner needs to know about a ViT, read from its config."""

    width: int
    layers: int
    image_size: int
    patch_size: int
    mlp_ratio: float

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@functools.lru_cache(maxsize=32)
def vision_tower_shape(model_name: str) -> VisionTowerShape:
    """Shape of an open_clip model's vision transformer, from its config alone
    (no weights are built or downloaded).

    Raises
    ------
    ModelError
        If the model is unknown or its image tower is not a plain ViT
        (ResNet or timm towers have no token sequence to prompt).
    """
    register_tiny_configs()
    name = _resolve_model_name(model_name)
    with open_clip_logging():
        cfg = (_open_clip().get_model_config(name) or {}).get("vision_cfg", {})
    layers = cfg.get("layers")
    if cfg.get("timm_model_name") or not isinstance(layers, int):
        raise ModelError(
            f"open_clip model {model_name!r} has no plain ViT image tower (visual prompts need one); "
            "use a ViT model such as ViT-B-16 or fedapp-tiny-vit"
        )
    size = cfg.get("image_size", 224)
    size = size if isinstance(size, int) else size[0]
    return VisionTowerShape(
        width=int(cfg["width"]),
        layers=layers,
        image_size=int(size),
        patch_size=int(cfg["patch_size"]),
        mlp_ratio=float(cfg.get("mlp_ratio", 4.0)),
    )


def _prompt_init(shape: Sequence[int], width: int, patch_size: int, generator: torch.Generator) -> Tensor:
    # VPT's initialisation: uniform with the Xavier bound of the patch projection.
    bound = math.sqrt(6.0 / float(3 * patch_size**2 + width))
    return (torch.rand(*shape, generator=generator) * 2 - 1) * bound


class VisualPrompts(nn.Module):
    """Everything that trains (and, in the federated methods, travels).

    Parameters
    ----------
    shape
        The vision tower the prompts are for.
    num_classes
        Output size of the linear head.
    prompt_layers
        Layers (from 1) that write the ``shared`` slot: ``(1,)`` for shallow
        VPT, ``1..L`` for deep VPT, ``()`` for a head alone.
    prompt_length
        Tokens in the ``shared`` slot.
    class_layers
        Layers (from 1, each at least 2) that write the per-sample ``class``
        slot; ``()`` for none.
    class_length
        Tokens per class prompt.
    seed
        Seed of the prompt and head initialisation.
    """

    def __init__(
        self,
        shape: VisionTowerShape,
        num_classes: int,
        *,
        prompt_layers: Sequence[int] = (1,),
        prompt_length: int = 8,
        class_layers: Sequence[int] = (),
        class_length: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for what, layers in (("prompt", prompt_layers), ("class-prompt", class_layers)):
            bad = [layer for layer in layers if not 1 <= layer <= shape.layers]
            if bad:
                raise ModelError(f"{what} layers {bad} are outside the ViT's blocks 1..{shape.layers}")
        if any(layer < 2 for layer in class_layers):
            raise ModelError("class-prompt layers start at 2: layer 1 would mix on a CLS token every image shares")
        if (prompt_layers and prompt_length < 1) or (class_layers and class_length < 1):
            raise ModelError("a prompt slot needs at least one token")
        generator = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.prompt_layers = tuple(sorted(set(prompt_layers)))
        self.class_layers = tuple(sorted(set(class_layers)))
        width = shape.width
        self.prompts = nn.Parameter(
            _prompt_init((len(self.prompt_layers), prompt_length, width), width, shape.patch_size, generator)
        )
        self.class_prompts = nn.Parameter(
            _prompt_init((len(self.class_layers), num_classes, class_length, width), width, shape.patch_size, generator)
        )
        self.head = nn.Linear(width, num_classes)
        with torch.no_grad():
            head_bound = 1.0 / math.sqrt(width)
            self.head.weight.copy_((torch.rand(num_classes, width, generator=generator) * 2 - 1) * head_bound)
            self.head.bias.zero_()

    @property
    def num_classes(self) -> int:
        return self.head.out_features

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens in the sequence once every slot is written."""
        shared = self.prompts.shape[1] if self.prompt_layers else 0
        return shared + (self.class_prompts.shape[2] if self.class_layers else 0)

    def mixed_class_prompt(self, j: int, weights: Tensor) -> Tensor:
        """``(batch, class_length, width)``: the class prompts of class layer ``j``
        averaged with per-sample ``weights`` of shape ``(batch, classes)``."""
        return torch.einsum("bc,cpd->bpd", weights.to(self.class_prompts.dtype), self.class_prompts[j])


class PromptedViT(nn.Module):
    """A frozen open_clip ViT run with :class:`VisualPrompts` and a linear head.

    Takes images normalised with the backbone's statistics at any resolution
    (they are resized to the backbone's input size here, so clients can keep
    small native-resolution tensors in memory).

    Parameters
    ----------
    clip
        The frozen backbone; only its vision tower is used.
    prompts
        The trainable prompts and head.
    mixer
        Required when ``prompts`` has class layers: gives the per-sample class
        weights at each of them.
    """

    def __init__(self, clip: LoadedClip, prompts: VisualPrompts, mixer: ClassMixer | None = None) -> None:
        super().__init__()
        visual = clip.model.visual
        if getattr(visual, "attn_pool", None) is not None or getattr(visual, "pool_type", "tok") != "tok":
            raise ModelError(f"{clip.model_name}: visual prompts need a ViT pooled on its CLS token")
        if not hasattr(visual, "conv1") or not hasattr(visual, "transformer"):
            raise ModelError(f"{clip.model_name} has no plain ViT image tower (visual prompts need one)")
        if prompts.class_layers and mixer is None:
            raise ModelError("class-specific prompts need a mixer")
        # Kept out of the module tree: the backbone is shared and frozen, and must
        # not show up in parameters(), state_dict() or .to() of the learner.
        self._visual = [visual]
        self.prompts = prompts
        self.mixer = mixer
        size = visual.image_size
        self.input_size = tuple(size) if isinstance(size, tuple | list) else (int(size), int(size))
        self._shared_at = {layer - 1: i for i, layer in enumerate(prompts.prompt_layers)}
        self._class_at = {layer - 1: j for j, layer in enumerate(prompts.class_layers)}

    @property
    def visual(self) -> nn.Module:
        return self._visual[0]

    def _embed(self, images: Tensor) -> Tensor:
        visual = self.visual
        if tuple(images.shape[-2:]) != self.input_size:
            shrink = self.input_size[0] < images.shape[-2]
            images = F.interpolate(images, size=self.input_size, mode="bilinear", align_corners=False, antialias=shrink)
        dtype = visual.conv1.weight.dtype
        x = visual.conv1(images.to(dtype)).flatten(2).transpose(1, 2)
        cls = visual.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + visual.positional_embedding.to(x.dtype)
        return visual.ln_pre(x)

    def tokens(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Run the prompted tower.

        Returns
        -------
        pooled : Tensor
            ``(batch, width)``: the final CLS token after the backbone's last norm.
        class_layer_cls : Tensor
            ``(batch, len(class_layers), width)``: the CLS token entering each
            class layer (what PEP-FedPT's prototypes average); empty without
            class layers.
        """
        x = self._embed(images)
        batch = x.shape[0]
        slots: dict[str, int] = {}  # slot name -> length, in sequence order after CLS
        seen = []
        transformer = self.visual.transformer
        for index, block in enumerate(transformer.resblocks):
            if index in self._shared_at:
                prompt = self.prompts.prompts[self._shared_at[index]]
                x = _write_slot(x, slots, "shared", prompt.to(x.dtype).expand(batch, -1, -1))
            if index in self._class_at:
                j = self._class_at[index]
                cls = x[:, 0]
                seen.append(cls)
                weights = self.mixer(j, cls)
                x = _write_slot(x, slots, "class", self.prompts.mixed_class_prompt(j, weights).to(x.dtype))
            x = block(x) if transformer.batch_first else block(x.transpose(0, 1)).transpose(0, 1)
        pooled = self.visual.ln_post(x[:, 0])
        class_cls = torch.stack(seen, dim=1) if seen else x.new_zeros(batch, 0, x.shape[-1])
        return pooled.float(), class_cls.float()

    def forward(self, images: Tensor) -> Tensor:
        return self.prompts.head(self.tokens(images)[0])


def _write_slot(x: Tensor, slots: dict[str, int], name: str, prompt: Tensor) -> Tensor:
    """Insert (first write) or overwrite (later writes) the slot ``name``."""
    offset = 1
    for slot, length in slots.items():
        if slot == name:
            if length != prompt.shape[1]:
                raise ModelError(f"slot {name!r} is {length} tokens, a later layer wrote {prompt.shape[1]}")
            return torch.cat([x[:, :offset], prompt, x[:, offset + length :]], dim=1)
        offset += length
    slots[name] = prompt.shape[1]
    return torch.cat([x[:, :offset], prompt, x[:, offset:]], dim=1)


def encode_prompt_tokens(visual: nn.Module, tokens: Tensor) -> Tensor:
    """Encode prompt tokens alone with a frozen ViT: ``F_image([CLS][tokens])``.

    Parameters
    ----------
    visual
        An open_clip ``VisionTransformer`` (pooled on its CLS token).
    tokens
        ``(batch, p, width)`` prompt tokens; they carry no positional embedding.

    Returns
    -------
    Tensor
        ``(batch, embed_dim)``: the CLS output projected into the joint space.
    """
    dtype = visual.conv1.weight.dtype
    cls = (visual.class_embedding + visual.positional_embedding[0]).to(dtype).expand(tokens.shape[0], 1, -1)
    x = visual.ln_pre(torch.cat([cls, tokens.to(dtype)], dim=1))
    transformer = visual.transformer
    for block in transformer.resblocks:
        x = block(x) if transformer.batch_first else block(x.transpose(0, 1)).transpose(0, 1)
    pooled = visual.ln_post(x[:, 0])
    return (pooled @ visual.proj if visual.proj is not None else pooled).float()
