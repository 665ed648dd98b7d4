"""pFedLoRA's own configuration keys (:mod:`fedapp.methods.pfedlora` is its math).

Plain data, read by the configuration in every process: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from fedapp.options import MethodOptions, setting


@dataclass(frozen=True)
class PFedLoRAOptions(MethodOptions):
    """The shared low-rank adapter and how each client's prediction is read."""

    title: ClassVar[str] = "pFedLoRA"
    about: ClassVar[str] = "See [pFedLoRA](methods/pfedlora.md)."

    adapter_kind: Literal["matrix", "direct"] = setting(
        "matrix", "pFedLoRA adapter: matrix decomposition or direct reduction"
    )
    adapter_hidden: int = setting(40, "pFedLoRA adapter hidden width", low=1)
    adapter_init: Literal["default", "lora"] = setting(
        "default", "pFedLoRA adapter start: torch's default, or lora (Gaussian down, zero up)"
    )
    pfedlora_inference: Literal["head", "adapter", "combined"] = setting(
        "head", "pFedLoRA prediction (the paper is silent): the model's head, the adapter, or both combined"
    )
    mu: float = setting(0.5, "pFedLoRA weight of the adapter branch in step 1", low=0.0, high=1.0)
