"""Groups of configuration keys by what they mean for a run: which are not settings, which decide
the partition, which only say where client state is kept, which the configured method does not read
(the schema itself: :mod:`~fedapp.config.schema`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedapp.catalog import CATALOG
from fedapp.config.schema import SCHEMA

NOT_SETTINGS = frozenset(
    {
        "seed",
        "run-name",
        "results-dir",
        "resume",
        "preset",
        "cache-dir",
        "traceback",
        "tracker",
        "tracking-uri",
        "export-models",
        "api",
    }
)
"""Keys that do not change what a run computes beyond its seed: runs differing only in them are
repetitions of one setting (the report's seed groups, the sweep's and the derived run names)."""

PARTITION_KEYS = (
    "dataset",
    "data-dir",
    "hf-name",
    "hf-label-column",
    "synthetic-domains",
    "reserve-pretrain",
    "reserve-test",
    "reserve-seed",
    "test-data-dir",
    "partition",
    "alpha",
    "classes-per-client",
    "class-assignment",
    "shards-per-client",
    "clients-per-domain",
    "num-partitions",
    "seed",
    "local-split",
    "shots-per-class",
    "base-to-novel",
    "held-out-fraction",
    "held-out-draw",
    "held-out-domain",
)
"""The keys that decide what each client holds: ``partition.json`` records them, and the report
pairs two settings seed by seed only where they agree on every one of them but the seed."""


def partition_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`PARTITION_KEYS` that ``values`` (a run configuration by config name) holds."""
    return {key: values[key] for key in PARTITION_KEYS if key in values}


STORAGE_KEYS = frozenset({"state", "state-dir"})
"""Where the clients keep their personal state: a run computes the same on either backend (the
simulation tests show it), so the report groups runs differing only in these as seeds of one
setting. They stay in the derived run name, so that a run folder never holds both backends: the
sweep resumes a checkpointed run only when its clients kept their state on disk."""


def unread_method_keys(values: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The keys of other methods' mechanisms (:attr:`~fedapp.catalog.MethodSpec.keys`) that ``values``
    (a run configuration by config name) sets away from their defaults and its own method does not
    read, each with the methods that do read it: the run computes exactly as without them."""
    readers: dict[str, list[str]] = {}
    for spec in CATALOG.values():
        for key in spec.keys:
            readers.setdefault(key, []).append(spec.name)
    own = CATALOG[values["method"]].keys if values.get("method") in CATALOG else ()
    return {
        key: tuple(methods)
        for key, methods in readers.items()
        if key not in own and key in values and values[key] != SCHEMA[key].default
    }


def unread_keys_warning(values: Mapping[str, Any]) -> str | None:
    """One line naming the keys :func:`unread_method_keys` finds (None: there are none). A warning,
    not a refusal: a preset or a sweep sets one setting for several methods that are compared on it."""
    unread = unread_method_keys(values)
    if not unread:
        return None
    named = ", ".join(f"{key} (read by {', '.join(methods)})" for key, methods in unread.items())
    return f"warning: {values['method']} does not read {named}: the run computes as without them"
