"""Per-client local prompt lengths (SDFed's client-specific ``S_l``) from the run configuration.

The ``local-prompt-lengths`` value is a single length, a per-client list, or a
seeded uniform draw; every process (server, clients, the config check) derives
the same lengths from it. Needs numpy only, not torch.

Nothing here imports Flower.
"""

from __future__ import annotations

import re

import numpy as np

from fedapp.errors import ConfigError

__all__ = ["parse_local_lengths", "sample_local_lengths"]


def sample_local_lengths(num_clients: int, seed: int, low: int = 4, high: int = 64) -> list[int]:
    """Seeded client-specific local prompt lengths, uniform in ``[low, high]``.

    Parameters
    ----------
    num_clients : int
        How many lengths to draw (one per client index).
    seed : int
        Same seed, same lengths, in every process.
    low, high : int, default 4, 64
        Inclusive bounds (the paper's 4..64).

    Returns
    -------
    list[int]
        ``num_clients`` lengths.

    Raises
    ------
    ConfigError
        Negative ``num_clients``, ``low < 1`` or ``low > high``.
    """
    if num_clients < 0:
        raise ConfigError(f"number of clients must be non-negative; got {num_clients}")
    if low < 1 or low > high:
        raise ConfigError(f"local prompt length bounds must satisfy 1 <= low <= high; got {low}-{high}")
    rng = np.random.default_rng(seed)
    return [int(n) for n in rng.integers(low, high + 1, size=num_clients)]


_RANDOM_SPEC = re.compile(r"random(?::(\d+)-(\d+))?")
_LIST_SPEC = re.compile(r"\d+(?:,\d+)*")


def parse_local_lengths(spec: str | int, num_clients: int, seed: int) -> list[int]:
    """Local prompt lengths per client index from a config string.

    Parameters
    ----------
    spec : str or int
        ``"16"`` (every client), ``"4,8,16,32"`` (client ``i`` gets entry
        ``i mod 4``), ``"random"`` (seeded draw in 4..64) or ``"random:A-B"``
        (seeded draw in A..B). Spaces are ignored.
    num_clients : int
        Number of clients.
    seed : int
        Seed of the random draw.

    Returns
    -------
    list[int]
        ``num_clients`` positive lengths.

    Raises
    ------
    ConfigError
        If ``spec`` matches none of the forms or holds a length below 1.
    """
    if num_clients < 0:
        raise ConfigError(f"number of clients must be non-negative; got {num_clients}")
    text = re.sub(r"\s+", "", str(spec)).lower()
    random_match = _RANDOM_SPEC.fullmatch(text)
    if random_match:
        low, high = random_match.groups()
        if low is None:
            return sample_local_lengths(num_clients, seed)
        if int(low) < 1 or int(low) > int(high):
            raise ConfigError(f"local prompt lengths {spec!r}: need 1 <= A <= B in 'random:A-B'")
        return sample_local_lengths(num_clients, seed, int(low), int(high))
    if not _LIST_SPEC.fullmatch(text):
        raise ConfigError(
            f"local prompt lengths {spec!r} not understood; use a length ('16'), a per-client list "
            "('4,8,16,32'), 'random' or 'random:A-B'"
        )
    lengths = [int(part) for part in text.split(",")]
    if min(lengths) < 1:
        raise ConfigError(f"local prompt lengths {spec!r}: every length must be at least 1")
    return [lengths[i % len(lengths)] for i in range(num_clients)]
