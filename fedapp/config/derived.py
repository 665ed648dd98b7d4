"""Values derived from a run configuration that clients, data and the rules all need.

The models cycled over clients, the partitions that never train, the domain a
partition holds and each client's train/val/test shares: each is computed here
once, from the configuration alone, so that the server and every client agree
without talking.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedapp.errors import ConfigError

if TYPE_CHECKING:
    from fedapp.config.validated import RunConfig


def client_model_names(config: RunConfig) -> tuple[str, ...]:
    """The models cycled over clients: ``client-models`` if set, else ``(model,)``."""
    listed = tuple(name.strip() for name in config.client_models.split(",") if name.strip())
    return listed or (config.model,)


def client_clip_model_names(config: RunConfig) -> tuple[str, ...]:
    """The open_clip backbones cycled over clients: ``client-clip-models`` if set, else ``(clip-model,)``."""
    listed = tuple(name.strip() for name in config.client_clip_models.split(",") if name.strip())
    return listed or (config.clip_model,)


def held_out_partitions(config: RunConfig, class_sets: Sequence[Collection[int]] | None = None) -> frozenset[int]:
    """Partitions that never train: ``round(held-out-fraction * num-partitions)`` of
    them, drawn from the seed so server and clients agree without talking, and every
    client of ``held-out-domain`` (leave-one-domain-out).

    With ``class_sets`` (the classes each partition holds) and ``held-out-draw =
    "covered"``, the seeded order is walked and a client is held out only if every class
    it holds keeps a training client; a draw that cannot reach the count that way says so.
    """
    total = config.num_partitions
    held: set[int] = set()
    count = round(config.held_out_fraction * total)
    if count:
        rng = np.random.default_rng([config.seed, 0x4E1D])
        drawn = [int(i) for i in rng.choice(total, size=count, replace=False)]
        if class_sets is None or config.held_out_draw == "any":
            held.update(drawn)
        else:
            # The plain draw first, so that where it already covers every class it is kept as it is.
            order = drawn + [int(i) for i in rng.permutation(total) if int(i) not in drawn]
            held.update(_covered_draw(order, count, [set(c) for c in class_sets], config.held_out_fraction))
    domain = config.held_out_domain
    if domain >= 0:
        held.update(p for p in range(total) if domain_of_partition(config, p) == domain)
    return frozenset(held)


def _covered_draw(order: list[int], count: int, class_sets: list[set[int]], fraction: float) -> list[int]:
    # How many training clients hold each class; a candidate may go if it is never the last one.
    holders = Counter(c for classes in class_sets for c in classes)
    held: list[int] = []
    for candidate in order:
        if all(holders[c] > 1 for c in class_sets[candidate]):
            holders.subtract(class_sets[candidate])
            held.append(candidate)
            if len(held) == count:
                return held
    raise ConfigError(
        f"config key 'held-out-fraction' = {fraction} asks for {count} held-out clients, but only {len(held)} "
        "can be held out so that every class they hold keeps a training client: use a smaller share, more "
        "clients, or held-out-draw = 'any'"
    )


def domain_of_partition(config: RunConfig, partition: int) -> int | None:
    """The domain whose data partition ``partition`` holds (``partition = domain``), else None."""
    if config.partition != "domain":
        return None
    return partition // config.clients_per_domain


def parse_local_split(text: str) -> tuple[float, float, float]:
    """``"0.75,0,0.25"`` -> ``(0.75, 0.0, 0.25)``: three shares in [0, 1] summing to 1, train above 0."""
    items = [item.strip() for item in str(text).split(",")]
    try:
        shares = tuple(float(item) for item in items)
    except ValueError:
        shares = ()
    if len(shares) != 3 or not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in shares):
        raise ConfigError(f"config key 'local-split' = {text!r} must be three shares train,val,test (e.g. 0.8,0.1,0.1)")
    if abs(sum(shares) - 1.0) > 1e-6 or shares[0] <= 0.0:
        raise ConfigError(f"config key 'local-split' = {text!r} must sum to 1 with a positive train share")
    return shares  # type: ignore[return-value]
