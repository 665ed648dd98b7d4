"""Text prompt learning over a frozen open_clip CLIP model (CoOp-style).

Shared by CoOp-local, PromptFL and SDFed:

* :class:`PromptTextEncoder` runs learnable context vectors through the frozen
  text tower, reproducing ``CLIP.encode_text`` on token embeddings;
* :class:`PromptContext` holds the learnable ``(length, width)`` context;
* :func:`clip_logits` turns normalised features into CLIP logits;
* :func:`class_phrase` reads a class folder name as text.

The frozen image side is in :mod:`fedapp.models.image_features`. Nothing here
imports Flower.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedapp.errors import ModelError
from fedapp.models.clip import LoadedClip
from fedapp.models.text_tower import text_tower

__all__ = [
    "DEFAULT_TEMPLATE",
    "PromptContext",
    "PromptTextEncoder",
    "class_phrase",
    "clip_logits",
]

DEFAULT_TEMPLATE = "{name}."
"""Text that follows the learned context for each class (CoOp's suffix)."""


def class_phrase(name: str) -> str:
    """A class folder name as text for a caption or prompt (``"pickup_truck"`` -> ``"pickup truck"``)."""
    return name.replace("_", " ")


class PromptTextEncoder(nn.Module):
    """The frozen CLIP text tower applied to learned context vectors.

    For class ``k`` the token sequence is
    ``[SOS][ctx_1..ctx_L][class-name tokens][.][EOT][pad...]``, cut to the
    model's context length and pooled where ``CLIP.encode_text`` pools (the EOT
    position for the usual ``argmax`` pooling). The suffix of every class is
    tokenised once and kept as embeddings, so only the context varies per call
    and any context length ``L`` works on the same instance.

    The tower's modules are shared with the :class:`LoadedClip` (not copied):
    their parameters stay frozen and the tower stays in eval mode whatever
    :meth:`train` is called with.

    Parameters
    ----------
    clip : LoadedClip
        The frozen model and its tokenizer.
    class_names : Sequence[str]
        One name per class; underscores are read as spaces (as CoOp does).
    template : str, default "{name}."
        The text after the context for each class; must contain ``{name}``.

    Raises
    ------
    ModelError
        If the model has no supported text tower, the tokenizer does not emit
        ``[SOS] text [EOT]`` rows of the model's context length, or
        ``class_names`` is empty.
    """

    def __init__(self, clip: LoadedClip, class_names: Sequence[str], template: str = DEFAULT_TEMPLATE) -> None:
        super().__init__()
        if isinstance(class_names, str) or len(class_names) == 0:
            raise ModelError("class_names must be a non-empty sequence of strings")
        if "{name}" not in template:
            raise ModelError(f"prompt template {template!r} has no {{name}} placeholder")
        tower, pool_type, eos_id = text_tower(clip.model)
        self._pool_type = pool_type
        self._eos_id = eos_id
        self._class_names = tuple(str(name) for name in class_names)
        self._tokenizer = clip.tokenizer
        self._model_name = clip.model_name

        # Shared frozen modules (registered so .to()/.parameters() see them).
        self.token_embedding: nn.Embedding = tower.token_embedding
        self.transformer: nn.Module = tower.transformer
        self.ln_final: nn.Module = tower.ln_final
        self.positional_embedding: nn.Parameter = tower.positional_embedding
        self.text_projection: nn.Parameter | nn.Linear | None = tower.text_projection
        self.register_buffer("attn_mask", tower.attn_mask, persistent=False)
        self._context_length = int(self.positional_embedding.shape[0])
        self.requires_grad_(False)
        super().train(False)

        if self._eot_positions(self._tokenize([""]))[0] != 1:
            raise ModelError(f"tokenizer of {clip.model_name} does not emit [SOS][text][EOT] rows")
        texts = [template.format(name=class_phrase(name)) for name in self._class_names]
        suffix, eot = self._embed_suffixes(texts)
        self.register_buffer("sos_embedding", suffix[0, :1].clone(), persistent=False)
        # Everything after SOS: class tokens, ".", EOT and padding.
        self.register_buffer("class_suffix", suffix[:, 1:].clone(), persistent=False)
        self.register_buffer("class_eot", eot, persistent=False)
        bare, bare_eot = self._embed_suffixes([""])
        self.register_buffer("bare_suffix", bare[:, 1:].clone(), persistent=False)
        self.register_buffer("bare_eot", bare_eot, persistent=False)
        # Read once here, not per call: a read of a value is a host-device sync on a GPU.
        self._longest_class = int(eot.argmax())
        self._class_needed = int(eot[self._longest_class])  # its class tokens + "." + EOT
        self._bare_needed = int(bare_eot[0])

    # ------------------------------------------------------------------ setup
    def _tokenize(self, texts: list[str]) -> Tensor:
        ids = torch.as_tensor(self._tokenizer(texts))
        if ids.ndim != 2 or ids.shape[1] != self._context_length:
            raise ModelError(
                f"tokenizer of {self._model_name} returned shape {tuple(ids.shape)}; "
                f"expected (n, {self._context_length}) to match the model's context length"
            )
        return ids.to(self.token_embedding.weight.device)

    def _eot_positions(self, ids: Tensor) -> Tensor:
        # Same rule as open_clip's text_global_pool, so our pooling matches encode_text.
        if self._pool_type == "eos":
            return (ids == self._eos_id).int().argmax(dim=-1)
        return ids.argmax(dim=-1)

    @torch.no_grad()
    def _embed_suffixes(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        ids = self._tokenize(texts)
        return self.token_embedding(ids), self._eot_positions(ids)

    def train(self, mode: bool = True) -> PromptTextEncoder:
        """Set the training flag without unfreezing the shared tower.

        The tower stays in eval mode: it is shared by every user of the
        :class:`LoadedClip` and must behave identically for all of them.
        """
        self.training = mode
        return self

    # ------------------------------------------------------------- properties
    @property
    def token_width(self) -> int:
        """Width ``d_tok`` of a token embedding (and of a context vector)."""
        return int(self.token_embedding.embedding_dim)

    @property
    def embed_dim(self) -> int:
        """Width of the joint image/text embedding produced by the encoder."""
        if self.text_projection is None:
            return self.token_width
        if isinstance(self.text_projection, nn.Linear):
            return int(self.text_projection.out_features)
        return int(self.text_projection.shape[1])

    @property
    def context_length(self) -> int:
        """Number of token positions the text tower reads."""
        return self._context_length

    @property
    def num_classes(self) -> int:
        """Number of classes this encoder builds prompts for."""
        return len(self._class_names)

    @property
    def class_names(self) -> tuple[str, ...]:
        """The class names, as given."""
        return self._class_names

    def max_context_tokens(self, num_class_tokens: int | None = None) -> int:
        """Longest context that fits before the class tokens and EOT.

        Parameters
        ----------
        num_class_tokens : int, optional
            Tokens between the context and EOT (class name plus ``"."``).
            Default: those of this encoder's longest class; ``0`` gives the
            limit for :meth:`encode_bare`.

        Returns
        -------
        int
            ``context_length - 2 - num_class_tokens`` (SOS and EOT take two).
        """
        if num_class_tokens is None:
            num_class_tokens = self._class_needed - 1
        return self._context_length - 2 - int(num_class_tokens)

    # --------------------------------------------------------------- encoding
    @torch.no_grad()
    def word_embeddings(self, text: str) -> Tensor:
        """Token embeddings of ``text`` without SOS/EOT (e.g. CoOp's "a photo of a" init).

        Parameters
        ----------
        text : str
            Words to embed.

        Returns
        -------
        Tensor
            ``(n_tokens, token_width)``, detached.
        """
        ids = self._tokenize([text])
        eot = int(self._eot_positions(ids)[0])
        return self.token_embedding(ids[0, 1:eot]).clone()

    def _check_context(self, context: Tensor, needed_after: int, what: str) -> None:
        if context.ndim != 2:
            raise ModelError(f"prompt context must be 2-D (length, width); got shape {tuple(context.shape)}")
        if context.shape[1] != self.token_width:
            raise ModelError(
                f"prompt width {context.shape[1]} does not match the text encoder's token width {self.token_width}"
            )
        length = context.shape[0]
        if 1 + length + needed_after > self._context_length:
            raise ModelError(
                f"prompt context of {length} tokens is too long: {what} needs {needed_after} tokens after it "
                f"and the model's context length is {self._context_length}, so at most "
                f"{self._context_length - 1 - needed_after} context tokens fit"
            )

    def _encode(self, context: Tensor, suffix: Tensor, eot: Tensor) -> Tensor:
        """Run ``[SOS][context][suffix]`` rows through the tower; normalised output."""
        cast_dtype = self._cast_dtype()
        context = context.to(device=suffix.device, dtype=cast_dtype)
        rows, length = suffix.shape[0], context.shape[0]
        x = torch.cat(
            [
                self.sos_embedding.to(cast_dtype).expand(rows, -1, -1),
                context.unsqueeze(0).expand(rows, -1, -1),
                suffix.to(cast_dtype),
            ],
            dim=1,
        )[:, : self._context_length]  # inserting L tokens pushes L padding tokens out
        # From here on as CLIP.encode_text (the Transformer handles batch_first itself).
        x = x + self.positional_embedding.to(cast_dtype)
        x = self.transformer(x, attn_mask=self.attn_mask)
        x = self.ln_final(x)
        x = x[torch.arange(rows, device=x.device), self._pool_index(eot, length, rows)]
        if isinstance(self.text_projection, nn.Linear):
            x = self.text_projection(x)
        elif self.text_projection is not None:
            x = x @ self.text_projection
        # float32 out, as the cached image features: logits and loss stay fp32 under fp16/bf16.
        return F.normalize(x.float(), dim=-1)

    def _cast_dtype(self) -> torch.dtype:
        get = getattr(self.transformer, "get_cast_dtype", None)
        return get() if callable(get) else self.positional_embedding.dtype

    def _pool_index(self, eot: Tensor, length: int, rows: int) -> Tensor:
        if self._pool_type == "first":
            return torch.zeros(rows, dtype=torch.long, device=eot.device)
        if self._pool_type == "last":
            return torch.full((rows,), self._context_length - 1, dtype=torch.long, device=eot.device)
        return eot + length  # the EOT moved right by the context length

    def encode_classes(self, context: Tensor) -> Tensor:
        """Encode ``[SOS][context][class name][.][EOT]`` for every class.

        Parameters
        ----------
        context : Tensor
            ``(L, token_width)`` context vectors; gradients flow back to it.

        Returns
        -------
        Tensor
            ``(num_classes, embed_dim)`` float32, L2-normalised.

        Raises
        ------
        ModelError
            If the width differs from :attr:`token_width`, or the context is
            so long that a class suffix would be cut off.
        """
        longest = self._longest_class
        self._check_context(context, self._class_needed, f"class {self._class_names[longest]!r}")
        return self._encode(context, self.class_suffix, self.class_eot)

    def encode_bare(self, context: Tensor) -> Tensor:
        """Encode ``[SOS][context][EOT]`` (SDFed's ``d(G)``).

        Parameters
        ----------
        context : Tensor
            ``(L, token_width)`` context vectors; gradients flow back to it.

        Returns
        -------
        Tensor
            ``(embed_dim,)`` float32, L2-normalised.

        Raises
        ------
        ModelError
            On a width mismatch or a context longer than ``context_length - 2``.
        """
        self._check_context(context, self._bare_needed, "the EOT token")
        return self._encode(context, self.bare_suffix, self.bare_eot)[0]

    def forward(self, context: Tensor) -> Tensor:
        """Alias of :meth:`encode_classes`."""
        return self.encode_classes(context)


class PromptContext(nn.Module):
    """Learnable context vectors, initialised N(0, 0.02²) as in CoOp.

    Parameters
    ----------
    length : int
        Number of context tokens ``L`` (at least 1).
    width : int
        Token width ``d_tok`` of the text encoder.
    generator : torch.Generator or int, optional
        Source of the initial values: a generator, or a seed for a fresh one.
        ``None`` uses torch's global generator.
    std : float, default 0.02
        Standard deviation of the initial values.
    """

    def __init__(
        self,
        length: int,
        width: int,
        generator: torch.Generator | int | None = None,
        std: float = 0.02,
    ) -> None:
        super().__init__()
        if int(length) < 1 or int(width) < 1:
            raise ModelError(f"prompt context needs positive length and width; got ({length}, {width})")
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        values = torch.randn(int(length), int(width), generator=generator) * std
        self.context = nn.Parameter(values)

    @property
    def length(self) -> int:
        """Number of context tokens."""
        return int(self.context.shape[0])

    @property
    def width(self) -> int:
        """Width of each context vector."""
        return int(self.context.shape[1])

    def forward(self) -> Tensor:
        """Return the context parameter."""
        return self.context


def clip_logits(image_features: Tensor, text_features: Tensor, logit_scale: Tensor | float) -> Tensor:
    """CLIP logits ``exp(logit_scale) · f @ tᵀ``.

    Parameters
    ----------
    image_features : Tensor
        ``(N, D)``, already L2-normalised.
    text_features : Tensor
        ``(K, D)``, already L2-normalised.
    logit_scale : Tensor or float
        The model's log temperature (``clip.model.logit_scale``).

    Returns
    -------
    Tensor
        ``(N, K)`` logits.
    """
    scale = torch.as_tensor(logit_scale, device=image_features.device).exp()
    return scale * image_features @ text_features.to(image_features.dtype).T
