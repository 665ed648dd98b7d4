"""Where an open_clip model keeps its text tower, and whether prompt learning can drive it.

:class:`~fedapp.models.text_prompt.PromptTextEncoder` feeds learned context
vectors through the frozen tower's own modules; :func:`text_tower` finds those
modules (on ``CLIP`` itself, or in ``CustomTextCLIP.text``) and refuses towers
whose ``encode_text`` it could not reproduce on free-form token embeddings.

Nothing here imports Flower.
"""

from __future__ import annotations

from torch import nn

from fedapp.errors import ModelError

__all__ = ["POOL_TYPES", "text_tower"]

POOL_TYPES = ("argmax", "eos", "first", "last")
"""open_clip text pool types that prompt learning reproduces."""


def text_tower(model: nn.Module) -> tuple[nn.Module, str, int | None]:
    """Return the module holding the text tower, its pool type and EOS id.

    ``CLIP`` keeps the tower's parts on itself; ``CustomTextCLIP`` keeps an
    open_clip ``TextTransformer`` in ``.text``.

    Parameters
    ----------
    model : nn.Module
        An open_clip model.

    Returns
    -------
    tuple[nn.Module, str, int or None]
        The module with ``token_embedding``, ``transformer``, ``ln_final``,
        ``positional_embedding``, ``text_projection`` and ``attn_mask``; its
        pool type (one of :data:`POOL_TYPES`); its EOS token id, if it has one.

    Raises
    ------
    ModelError
        If the model has no open_clip token-embedding text tower, the tower has
        a class token or padding mask, or its pooling is not supported.
    """
    if isinstance(getattr(model, "token_embedding", None), nn.Embedding):
        tower, pool_type, eos_id = model, str(model.text_pool_type), getattr(model, "text_eos_id", None)
    else:
        tower = getattr(model, "text", None)
        if tower is None or not isinstance(getattr(tower, "token_embedding", None), nn.Embedding):
            raise ModelError(
                f"{type(model).__name__} has no open_clip token-embedding text tower "
                "(e.g. a Hugging Face text encoder); prompt learning needs one"
            )
        # The CoCa class token and bidirectional pad masks change which positions see which;
        # reproducing them on free-form embeddings is not supported.
        if getattr(tower, "cls_emb", None) is not None or getattr(tower, "use_pad_mask", False):
            raise ModelError("text towers with a class token or padding mask are not supported for prompt learning")
        pool_type, eos_id = str(tower.pool_type), getattr(tower, "eos_id", None)
    if pool_type not in POOL_TYPES:
        raise ModelError(f"text pool type {pool_type!r} is not supported; expected one of {POOL_TYPES}")
    if pool_type == "eos" and eos_id is None:
        raise ModelError("text pool type 'eos' needs the model's EOS token id, which it does not define")
    return tower, pool_type, eos_id
