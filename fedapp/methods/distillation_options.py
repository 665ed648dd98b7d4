"""The configuration keys of the distillation baselines: FedProto, FD, FML and FedKD.

Their math is :mod:`fedapp.methods.fedproto`, :mod:`~fedapp.methods.fd`, :mod:`~fedapp.methods.fml`,
:mod:`~fedapp.methods.fedkd` and :mod:`~fedapp.methods.mutual`. Plain data, read by the
configuration in every process: no torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedapp.errors import ConfigError
from fedapp.options import MethodOptions, did_you_mean, setting


@dataclass(frozen=True)
class FedProtoOptions(MethodOptions):
    """The prototype regulariser's weight."""

    title: ClassVar[str] = "FedProto"
    about: ClassVar[str] = "See [FedProto](methods/fedproto.md)."

    proto_weight: float = setting(1.0, "FedProto weight of the prototype regulariser", low=0.0)


@dataclass(frozen=True)
class DistillationOptions(MethodOptions):
    """The temperature every distillation term of FD, FML and FedKD divides its logits by."""

    kd_temperature: float = setting(1.0, "softmax temperature of distillation terms", low=0.0, low_open=True)


@dataclass(frozen=True)
class FDOptions(DistillationOptions):
    """FD's distillation term."""

    title: ClassVar[str] = "FD"
    about: ClassVar[str] = "See [FD](methods/fd.md)."

    kd_weight: float = setting(1.0, "FD weight of the distillation term", low=0.0)


@dataclass(frozen=True)
class MutualOptions(DistillationOptions):
    """The small model FML and FedKD share, which each client learns mutually with its own."""

    title: ClassVar[str] = "FedKD"
    about: ClassVar[str] = "See [FedKD](methods/fedkd.md); `shared-model` is a model of the zoo, as `model` is."

    shared_model: str = setting("cnn-5", "the small shared model of FML and FedKD", names="zoo-model")

    def check(self, values: Mapping[str, Any]) -> None:
        from fedapp.models import MODEL_NAMES  # noqa: PLC0415 - keeps the configuration's import light

        if self.shared_model not in MODEL_NAMES:
            raise ConfigError(
                f"config key 'shared-model' = {self.shared_model!r} is not one of: {', '.join(MODEL_NAMES)}"
                f"{did_you_mean(self.shared_model, MODEL_NAMES)}"
            )


@dataclass(frozen=True)
class FMLOptions(MutualOptions):
    """FML's weights of each model's own cross-entropy against its distillation term."""

    title: ClassVar[str] = "FML"
    about: ClassVar[str] = "See [FML](methods/fml.md)."

    fml_alpha: float = setting(0.5, "FML weight of the local model's own CE (1 - alpha on KL)", low=0.0, high=1.0)
    fml_beta: float = setting(0.5, "FML weight of the shared model's own CE (1 - beta on KL)", low=0.0, high=1.0)
