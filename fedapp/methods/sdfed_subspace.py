"""SDFed's subspace refinement: the projector that removes the global prompt's dominant
directions from the local prompt (``G̃_c = G_c R``), and how much of it that removes.

Our reading of the paper is on the docs' SDFed page; :mod:`fedapp.methods.sdfed` holds the
rest of the client's objective and re-exports these. Nothing here imports Flower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fedapp.errors import ConfigError, ModelError

__all__ = [
    "PROJECTOR_MODES",
    "Projector",
    "build_projector",
    "check_prompt",
    "refine",
    "removed_energy",
    "subspace_projector",
    "top_right_singular_vectors",
]

PROJECTOR_MODES: tuple[str, ...] = ("dim", "rank")
"""``dim``: the paper's ⌊λm⌋ over the token width m (default; beyond rank(G_s) it also drops
an arbitrary basis of G_s's null space); ``rank``: ⌊λ·rank(G_s)⌋ directions, the dominant ones only."""

# floor(λ·r) on floats: 0.29 * 100 is 28.999999999999996, which should count as 29.
_FLOOR_EPS = 1e-9


@dataclass(frozen=True)
class Projector:
    """The refinement projector and what it removes.

    Attributes
    ----------
    matrix : Tensor
        ``R = I − X_top X_topᵀ``, ``(d, d)``, symmetric and idempotent; no grad.
    removed_directions : Tensor
        ``X_topᵀ``: the ``k`` removed right-singular vectors as rows, ``(k, d)``.
    rank : int
        Numerical rank of the global prompt.
    """

    matrix: Tensor
    removed_directions: Tensor
    rank: int

    @property
    def k(self) -> int:
        """Number of removed directions."""
        return int(self.removed_directions.shape[0])


def check_prompt(prompt: Tensor, name: str, *, values: bool = True) -> None:
    if prompt.ndim != 2:
        raise ModelError(f"{name} must be 2-D (length, width); got shape {tuple(prompt.shape)}")
    # Reading values waits for the device: done once a round, not in every training step.
    if values and not bool(torch.isfinite(prompt).all()):
        raise ModelError(f"{name} contains NaN or infinite values")


def top_right_singular_vectors(matrix: Tensor, k: int) -> Tensor:
    """The top-``k`` right-singular vectors of ``matrix`` as rows.

    Parameters
    ----------
    matrix : Tensor
        ``(m, d)``.
    k : int
        ``0 <= k <= d``; beyond ``min(m, d)`` the extra vectors span (an
        arbitrary basis of) the null space.

    Returns
    -------
    Tensor
        ``(k, d)`` orthonormal rows, in ``matrix``'s dtype, detached.
    """
    width = matrix.shape[1]
    if not 0 <= k <= width:
        raise ConfigError(f"cannot take {k} right-singular vectors of a matrix of width {width}")
    # float64 keeps the basis orthonormal to ~1e-15; the prompt is tiny, so it is cheap.
    work = matrix.detach().to(torch.float64)
    _, _, vh = torch.linalg.svd(work, full_matrices=k > min(work.shape))
    return vh[:k].to(matrix.dtype)


def _numerical_rank(singular_values: Tensor, shape: tuple[int, int], dtype: torch.dtype, rank_tol: float | None) -> int:
    if singular_values.numel() == 0:
        return 0
    if rank_tol is None:
        # numpy.linalg.matrix_rank's default, with the eps of the prompt's own dtype
        # (its rounding, not that of our float64 SVD, sets the noise floor).
        rank_tol = float(singular_values.max()) * max(shape) * float(torch.finfo(dtype).eps)
    return int((singular_values > rank_tol).sum())


def build_projector(
    global_prompt: Tensor,
    lam: float = 0.6,
    mode: str = "dim",
    rank_tol: float | None = None,
) -> Projector:
    """SDFed's subspace-refinement projector from the received global prompt.

    With ``G_s = U Σ Xᵀ``, removes the top ``k = ⌊λ r⌋`` right-singular
    directions: ``R = I − X_top X_topᵀ``. ``r`` is the numerical rank of
    ``G_s`` (mode ``"rank"``) or its width ``d_tok`` (mode ``"dim"``, the
    paper's ``⌊λ m⌋`` with ``X = [x_1, ..., x_m]``, which also drops arbitrary null directions).

    Parameters
    ----------
    global_prompt : Tensor
        ``G_s``, ``(8, d_tok)``.
    lam : float, default 0.6
        Fraction λ in ``[0, 1]``.
    mode : {"dim", "rank"}, default "dim"
        What λ is a fraction of.
    rank_tol : float, optional
        Singular values at or below it count as zero; default as
        ``numpy.linalg.matrix_rank``.

    Returns
    -------
    Projector
        The matrix (a constant, no grad) and the removed directions.

    Raises
    ------
    ConfigError
        Unknown ``mode`` or ``lam`` outside ``[0, 1]``.
    ModelError
        ``global_prompt`` not 2-D or not finite.
    """
    if mode not in PROJECTOR_MODES:
        raise ConfigError(f"unknown SDFed projector mode {mode!r}; valid: {', '.join(PROJECTOR_MODES)}")
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"SDFed lambda must lie in [0, 1]; got {lam}")
    check_prompt(global_prompt, "global prompt")
    work = global_prompt.detach().to(torch.float64)
    rank = _numerical_rank(torch.linalg.svdvals(work), tuple(work.shape), global_prompt.dtype, rank_tol)
    span = rank if mode == "rank" else work.shape[1]
    k = math.floor(lam * span + _FLOOR_EPS)
    removed = top_right_singular_vectors(work, k)
    eye = torch.eye(work.shape[1], dtype=torch.float64, device=work.device)
    matrix = eye - removed.T @ removed
    return Projector(
        matrix=matrix.to(global_prompt.dtype),
        removed_directions=removed.to(global_prompt.dtype),
        rank=rank,
    )


def subspace_projector(
    global_prompt: Tensor,
    lam: float = 0.6,
    mode: str = "dim",
    rank_tol: float | None = None,
) -> Tensor:
    """``R`` of :func:`build_projector` alone (``(d, d)``, no grad)."""
    return build_projector(global_prompt, lam=lam, mode=mode, rank_tol=rank_tol).matrix


def refine(local_prompt: Tensor, projector: Tensor) -> Tensor:
    """``G̃_c = G_c R``; gradients flow to ``local_prompt``.

    Runs in every training step, so it checks shapes only; :func:`round_classifier`
    checks the prompt's values once a round.

    Raises
    ------
    ModelError
        If the prompt is not 2-D or its width does not match the projector's.
    """
    check_prompt(local_prompt, "local prompt", values=False)
    if projector.shape != (local_prompt.shape[1], local_prompt.shape[1]):
        raise ModelError(
            f"local prompt width {local_prompt.shape[1]} does not match the projector's shape {tuple(projector.shape)}"
        )
    return local_prompt @ projector.to(local_prompt.dtype)


def removed_energy(local_prompt: Tensor, projector: Tensor) -> float:
    """Share of the local prompt's energy (squared Frobenius norm) that refinement removes:
    ``1 - ||G_c R||² / ||G_c||²``; 0 leaves it whole, 1 removes it all."""
    with torch.no_grad():
        total = local_prompt.float().pow(2).sum()
        kept = refine(local_prompt.float(), projector).pow(2).sum()
        return float(1 - kept / total) if float(total) > 0 else 0.0
