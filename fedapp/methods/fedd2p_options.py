"""FedD2P's own configuration keys (:mod:`fedapp.methods.fedd2p` is its math).

Plain data, read by the configuration in every process: no torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fedapp.errors import ConfigError
from fedapp.options import MethodOptions, setting

TEMPLATES = {
    "photo": "a photo of a {c}",
    "digit": "a photo of digit {c}",
    "texture": "{c} texture",
    "satellite": "a centered satellite photo of {c}",
}
"""FedD2P's class-description templates (the paper's four), by name."""


@dataclass(frozen=True)
class FedD2PClientOptions(MethodOptions):
    """What a FedD2P client reads: its warm-up and the temperatures of its soft labels. The
    baseline B2 (``fedd2p-agg``) has no prompt generator, so reads these alone."""

    title: ClassVar[str] = "FedD2P's baseline B2"
    about: ClassVar[str] = (
        "`fedd2p-agg` sends the pooled soft labels back, with no prompt generator: it reads FedD2P's client keys "
        "alone (see [FedD2P](methods/fedd2p.md))."
    )

    kd_weight: float = setting(1.0, "FedD2P weight of the clients' distillation term", low=0.0)
    warmup_epochs: int = setting(
        0, "FedD2P S0: CE-only local epochs of a client's first round (0 = local-epochs)", low=0
    )
    d2p_tau1: float = setting(10.0, "FedD2P temperature of the clients' soft labels", low=0.0, low_open=True)
    d2p_distil_temperature: float = setting(
        0.0, "FedD2P S3: temperature of the clients' distillation term (0 = d2p-tau1, the paper's Eq. 3)", low=0.0
    )


@dataclass(frozen=True)
class FedD2POptions(FedD2PClientOptions):
    """The server's prompt generator, distilled from the clients' soft labels."""

    title: ClassVar[str] = "FedD2P"
    about: ClassVar[str] = "See [FedD2P](methods/fedd2p.md). An empty `d2p-template` takes the dataset's own template."

    d2p_tau2: float = setting(0.1, "FedD2P temperature of the server's class distributions", low=0.0, low_open=True)
    d2p_steps: int = setting(100, "FedD2P generator training steps per round", low=1)
    d2p_lr: float = setting(0.001, "FedD2P generator learning rate (Adam)", low=0.0, low_open=True)
    d2p_prompt_tokens: int = setting(4, "FedD2P visual prompt tokens per class", low=1)
    d2p_template: str = setting("", "FedD2P class description: photo, digit, texture, satellite or text with {c}")
    d2p_generator: Literal["attention", "mlp"] = setting("attention", "FedD2P prompt generator")

    def check(self, values: Mapping[str, Any]) -> None:
        """``d2p-template`` is one of :data:`TEMPLATES` or a template containing ``{c}``."""
        template = self.d2p_template
        if template and template not in TEMPLATES and "{c}" not in template:
            raise ConfigError(
                f"config key 'd2p-template' = {template!r} is neither one of {', '.join(TEMPLATES)} "
                "nor a template containing {c}"
            )
