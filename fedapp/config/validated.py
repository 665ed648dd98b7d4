"""The validated configuration's type: :class:`RunConfig`, and the digest that names a setting.

Apart from :mod:`fedapp.config.run_config` (which makes one: presets, overrides,
validation) so that the derived values and the cross-key rules, which that module
runs, can name the type without importing it back.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedapp.catalog import CATALOG
from fedapp.config.key_groups import NOT_SETTINGS
from fedapp.config.schema import COMMON_KEYS, METHOD_KEYS, SCHEMA, Scalar, Settings
from fedapp.options import MethodOptions


@dataclass(frozen=True)
class RunConfig(Settings):
    """A validated run configuration: every common key a typed attribute (``config.num_rounds``), the
    configured method's own keys as :attr:`options` (``config.options.sdfed_lambda``).

    ``config["num-rounds"]`` reads any key by its config name, a method's too, for code that
    holds key names as data (reports, sweeps, user plug-ins).
    """

    method_values: tuple[tuple[str, Scalar], ...] = field(default=(), repr=False)
    """Every method's own keys (:data:`~fedapp.config.schema.METHOD_KEYS`) as ``(config name, value)``."""

    @classmethod
    def from_values(cls, values: Mapping[str, Scalar]) -> RunConfig:
        """The configuration of already-checked ``values`` (by config name; a key left out takes its default)."""
        common = {name.replace("-", "_"): value for name, value in values.items() if name in COMMON_KEYS}
        own = tuple((name, values.get(name, key.default)) for name, key in METHOD_KEYS.items())
        return cls(**common, method_values=own)

    @property
    def values(self) -> dict[str, Scalar]:
        """Every key by its config name (``num-rounds``), in schema order."""
        return {name: self[name] for name in SCHEMA}

    @functools.cached_property
    def options(self) -> MethodOptions:
        """The configured method's own keys (:attr:`fedapp.catalog.MethodSpec.options`), typed; made
        once (a simulated client is built for every message)."""
        return CATALOG[self.method].options.from_values(self.values)

    @functools.cached_property
    def _method_values(self) -> dict[str, Scalar]:
        return dict(self.method_values)

    def __getitem__(self, key: str) -> Scalar:
        if key in COMMON_KEYS:
            return getattr(self, key.replace("-", "_"))
        if key in METHOD_KEYS:
            return self._method_values.get(key, METHOD_KEYS[key].default)
        raise KeyError(key)

    def get(self, key: str, default: Scalar | None = None) -> Scalar | None:
        return self[key] if key in SCHEMA else default

    def as_dict(self) -> dict[str, Scalar]:
        return self.values

    @property
    def resolved_run_name(self) -> str:
        """``run-name``, or one derived from the method, data, a digest of every other setting and
        the seed, so that runs with different settings never share a folder."""
        if self.run_name:
            return self.run_name
        return f"{self.method}-{self.dataset}-{self.partition}-{settings_digest(self.values)}-s{self.seed}"


def settings_digest(values: Mapping[str, Any]) -> str:
    """Six hex digits of SHA-256 over the settings that differ from their defaults (but :data:`NOT_SETTINGS`).

    Only non-default values count, so a key added to the schema later (at a default that keeps
    the old behaviour) leaves every existing name as it was.
    """
    settings = {
        key: value
        for key, value in values.items()
        if key not in NOT_SETTINGS and (key not in SCHEMA or value != SCHEMA[key].default)
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:6]
