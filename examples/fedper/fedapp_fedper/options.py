"""FedPer's own configuration key: how many of the model's last layers each client keeps.

Declared as fedapp declares its methods' keys (:class:`fedapp.options.MethodOptions`), and named
by :data:`fedapp_fedper.FEDPER`; installed beside fedapp, ``fedper-personal-layers`` is a run-config
key like any of fedapp's (``--run-config 'fedper-personal-layers=2'``, a preset, the sweep).
Plain data: the check builds the model shape-only, importing torch only when it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedapp.errors import ConfigError
from fedapp.options import MethodOptions, setting


@dataclass(frozen=True)
class FedPerOptions(MethodOptions):
    """The personalisation layers (the paper's K_P)."""

    title: ClassVar[str] = "FedPer"
    about: ClassVar[str] = "See `examples/fedper/README.md` (a method in a package of its own)."

    fedper_personal_layers: int = setting(
        1, "FedPer: the model's last layers with weights that each client keeps personal (K_P; 1 = the head)", low=1
    )

    def check(self, values: Mapping[str, Any]) -> None:
        """Some layers must stay shared: fewer personal layers than the model has layers with weights."""
        from fedapp.models import seeded_model  # noqa: PLC0415 - torch only when a run is checked
        from fedapp_fedper.base_layers import layers_with_weights  # noqa: PLC0415

        layers = layers_with_weights(seeded_model(values["model"], 10, seed=0, materialise=False))
        if self.fedper_personal_layers >= len(layers):
            raise ConfigError(
                f"config key 'fedper-personal-layers' = {self.fedper_personal_layers} leaves no layer of "
                f"{values['model']!r} to share: it has {len(layers)} layers with weights ({', '.join(layers)})"
            )
