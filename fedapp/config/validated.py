"""The validated configuration's type: :class:`RunConfig`, and the digest that names a setting.

Apart from :mod:`fedapp.config.run_config` (which makes one: presets, overrides,
validation) so that the derived values and the cross-key rules, which that module
runs, can name the type without importing it back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedapp.config.key_groups import NOT_SETTINGS
from fedapp.config.schema import SCHEMA, Scalar, Settings


@dataclass(frozen=True)
class RunConfig(Settings):
    """A validated run configuration: every key a typed attribute (``config.num_rounds``).

    ``config["num-rounds"]`` still reads a key by its config name, for code that
    holds key names as data (reports, sweeps, user plug-ins).
    """

    @classmethod
    def from_values(cls, values: Mapping[str, Scalar]) -> RunConfig:
        """The configuration of already-checked ``values`` (every schema key, by config name)."""
        return cls(**{name.replace("-", "_"): value for name, value in values.items()})

    @property
    def values(self) -> dict[str, Scalar]:
        """Every key by its config name (``num-rounds``), in schema order."""
        return {name: getattr(self, name.replace("-", "_")) for name in SCHEMA}

    def __getitem__(self, key: str) -> Scalar:
        if key not in SCHEMA:
            raise KeyError(key)
        return getattr(self, key.replace("-", "_"))

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
