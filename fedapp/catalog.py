"""Every method's facts, declared once: the method catalog.

A :class:`MethodSpec` says where a method's two halves live (import paths, so a
client process imports only its own client module), what its clients run and
upload, whether client-level DP and SecAgg+ can protect it, whether it can serve
a client that never trained, and which protocols it supports. The config
validation, the registry, the privacy checks, the report and the docs read these
facts; nothing else keeps lists of method names.

This module is plain data: it imports neither Flower nor torch. A method's own option
checks are named by import path, as its strategy and client are, and imported when run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Backbone = Literal["cnn", "clip-text", "clip-vision", "cnn+server-clip"]
Uploads = Literal["parameters", "per-class", "nothing"]

_PER_CLASS = "with integer class counts, which the server merges class by class instead of averaging"


@dataclass(frozen=True)
class MethodSpec:
    """One method's facts.

    Attributes
    ----------
    name
        The run-config value of ``method``.
    strategy, client
        ``"module:Class"`` of the server strategy and the edge client.
    summary
        One line: what is shared and how (with the paper's authors and year).
    backbone
        What a client runs: a zoo CNN (``cnn``), a frozen open_clip text tower with
        learned text prompts (``clip-text``), a frozen open_clip ViT image tower
        (``clip-vision``), or a zoo CNN whose server holds CLIP (``cnn+server-clip``).
    uploads
        ``parameters`` (one shared module's float arrays, averaged by examples),
        ``per-class`` (per-class statistics with class counts) or ``nothing``.
    uploads_note
        For methods that do not upload parameters: what they upload instead.
    mixed_models
        Whether clients may run different zoo architectures (nothing model-shaped is averaged).
    new_client_note
        Why the method cannot serve a client that never trained (empty: it can, from
        the server's state alone), shown where held-out accuracy would be.
    variant_of
        The method whose strategy and client this one reuses with other settings
        (empty for a method of its own).
    options_check
        ``"module:function"`` that checks the method's own keys (their parsers live with
        the method): it takes the run configuration's values by config name and raises a
        ConfigError naming the key; empty when the method has no keys of its own to check.
    text_prompt_lengths
        ``"module:function"`` giving, from the same values, the text prompts a client of a
        ``clip-text`` method reads besides ``prompt-length``'s, as ``(what, length per
        client)`` pairs, so that one rule checks every prompt against the text context.
    personal_state
        Whether a client keeps state of its own between rounds (its model, prompt or
        statistics) in its state store, which a resumed run finds again only on disk.
    keys
        The configuration keys of the method's own mechanism, which it reads and the methods
        that do not declare them leave alone (a key declared by none is every method's).
    """

    name: str
    strategy: str
    client: str
    summary: str
    backbone: Backbone
    uploads: Uploads
    uploads_note: str = ""
    mixed_models: bool = False
    new_client_note: str = ""
    variant_of: str = ""
    options_check: str = ""
    text_prompt_lengths: str = ""
    personal_state: bool = False
    keys: tuple[str, ...] = ()

    @property
    def averages_parameters(self) -> bool:
        """Uploads one shared module's float arrays that the server averages by examples:
        what client-level DP, SecAgg+ and robust aggregation rules apply to."""
        return self.uploads == "parameters"

    @property
    def names_unseen_classes(self) -> bool:
        """Classifies by class-name prompts, so it can name classes it never trained on
        (the base-to-novel protocol)."""
        return self.backbone == "clip-text"

    @property
    def module(self) -> str:
        """The Python module name of the method's own files (``pep-fedpt`` -> ``pep_fedpt``)."""
        return self.name.replace("-", "_")


_LOCAL_MODEL = "clients are scored on their own local model, which a new client has not trained"
_ALONE = "each client trains its own model alone, so a client that never trained has none"
_PER_CLASS_ONLY = "clients share per-class knowledge, not a model; a new client's model is untrained"
_SDFED_KEYS = (
    "local-prompt-lengths",
    "sdfed-lambda",
    "sdfed-gamma",
    "sdfed-alpha",
    "sdfed-beta",
    "projector-mode",
    "sdfed-combination",
    "sdfed-separation-moves-global",
)
_PEP_FEDPT_KEYS = (
    "prompt-lr-scale",
    "class-prompt-layers",
    "class-prompt-length",
    "ccmp-temperature",
    "pep-mixer",
    "prototype-momentum",
)
# The clients' keys; the baseline B2 (fedd2p-agg) has no prompt generator, so reads these alone.
_FEDD2P_CLIENT_KEYS = ("kd-weight", "warmup-epochs", "d2p-tau1", "d2p-distil-temperature")
_FEDD2P_KEYS = (
    *_FEDD2P_CLIENT_KEYS,
    "d2p-tau2",
    "d2p-steps",
    "d2p-lr",
    "d2p-prompt-tokens",
    "d2p-template",
    "d2p-generator",
)

CATALOG: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec(
            "fedavg",
            "strategies.fedavg:FedAvgStrategy",
            "clients.fedavg:FedAvgClient",
            "one shared model, example-weighted averaging (McMahan et al., 2017)",
            "cnn",
            "parameters",
        ),
        MethodSpec(
            "standalone",
            "strategies.standalone:StandaloneStrategy",
            "clients.standalone:StandaloneClient",
            "each client trains its own model alone; nothing is shared",
            "cnn",
            "nothing",
            "uploads nothing (each client trains alone)",
            mixed_models=True,
            new_client_note=_ALONE,
            personal_state=True,
        ),
        MethodSpec(
            "pfedlora",
            "strategies.pfedlora:PFedLoRAStrategy",
            "clients.pfedlora:PFedLoRAClient",
            "heterogeneous CNNs share a low-rank adapter, trained iteratively with the local model (Yi et al., 2024)",
            "cnn",
            "parameters",
            mixed_models=True,
            new_client_note="only the low-rank adapter is shared; a new client's own CNN is untrained",
            personal_state=True,
            keys=("adapter-kind", "adapter-hidden", "adapter-init", "pfedlora-inference", "mu"),
        ),
        MethodSpec(
            "lg-fedavg",
            "strategies.lg_fedavg:LGFedAvgStrategy",
            "clients.lg_fedavg:LGFedAvgClient",
            "local representations, one shared classifier head (Liang et al., 2020)",
            "cnn",
            "parameters",
            mixed_models=True,
            new_client_note="only the classifier head is shared; a new client's representation layers are untrained",
            personal_state=True,
        ),
        MethodSpec(
            "fedper",
            "strategies.fedper:FedPerStrategy",
            "clients.fedper:FedPerClient",
            "shared base layers, a personal classifier head per client (Arivazhagan et al., 2019)",
            "cnn",
            "parameters",
            new_client_note="only the base layers are shared; a new client's head is untrained",
            personal_state=True,
        ),
        MethodSpec(
            "fedproto",
            "strategies.fedproto:FedProtoStrategy",
            "clients.fedproto:FedProtoClient",
            "per-class prototypes and a prototype regulariser (Tan et al., 2022)",
            "cnn",
            "per-class",
            f"uploads per-class prototypes {_PER_CLASS}",
            mixed_models=True,
            new_client_note=_PER_CLASS_ONLY,
            personal_state=True,
            keys=("proto-weight",),
        ),
        MethodSpec(
            "fd",
            "strategies.fd:FDStrategy",
            "clients.fd:FDClient",
            "per-class mean logits and distillation (Jeong et al., 2018)",
            "cnn",
            "per-class",
            f"uploads per-class mean logits {_PER_CLASS}",
            mixed_models=True,
            new_client_note=_PER_CLASS_ONLY,
            personal_state=True,
            keys=("kd-weight", "kd-temperature"),
        ),
        MethodSpec(
            "fml",
            "strategies.fml:FMLStrategy",
            "clients.fml:FMLClient",
            "mutual learning with a shared small model (Shen et al., 2020)",
            "cnn",
            "parameters",
            mixed_models=True,
            new_client_note=_LOCAL_MODEL,
            personal_state=True,
            keys=("shared-model", "kd-temperature", "fml-alpha", "fml-beta"),
        ),
        MethodSpec(
            "fedkd",
            "strategies.fedkd:FedKDStrategy",
            "clients.fedkd:FedKDClient",
            "adaptive mutual distillation with a shared small model (Wu et al., 2022)",
            "cnn",
            "parameters",
            mixed_models=True,
            new_client_note=_LOCAL_MODEL,
            personal_state=True,
            keys=("shared-model", "kd-temperature"),
        ),
        MethodSpec(
            "coop-local",
            "strategies.standalone:StandaloneStrategy",
            "clients.coop_local:CoOpLocalClient",
            "CoOp on each client alone: a learned text context over a frozen CLIP (Zhou et al., 2022)",
            "clip-text",
            "nothing",
            "uploads nothing (each client trains alone)",
            new_client_note=_ALONE,
            personal_state=True,
        ),
        MethodSpec(
            "promptfl",
            "strategies.promptfl:PromptFLStrategy",
            "clients.promptfl:PromptFLClient",
            "one shared text context averaged across clients (Guo et al., 2023)",
            "clip-text",
            "parameters",
        ),
        MethodSpec(
            "sdfed",
            "strategies.sdfed:SDFedStrategy",
            "clients.sdfed:SDFedClient",
            "shared global prompt + private variable-length local prompt, subspace refinement, divergence control",
            "clip-text",
            "parameters",
            new_client_note="half of its classifier is the private local prompt, which a new client has not trained",
            personal_state=True,
            text_prompt_lengths="fedapp.methods.local_prompt_lengths:sdfed_text_prompt_lengths",
            keys=_SDFED_KEYS,
        ),
        MethodSpec(
            "head-fedavg",
            "strategies.fedvpt:FedVPTStrategy",
            "clients.head_fedavg:HeadFedAvgClient",
            "a linear head on a frozen ViT, averaged across clients",
            "clip-vision",
            "parameters",
            keys=("prompt-lr-scale",),
        ),
        MethodSpec(
            "local-vpt",
            "strategies.standalone:StandaloneStrategy",
            "clients.local_vpt:LocalVPTClient",
            "visual prompt tuning on each client alone (Jia et al., 2022)",
            "clip-vision",
            "nothing",
            "uploads nothing (each client trains alone)",
            new_client_note=_ALONE,
            personal_state=True,
            keys=("prompt-lr-scale",),
        ),
        MethodSpec(
            "fedvpt",
            "strategies.fedvpt:FedVPTStrategy",
            "clients.fedvpt:FedVPTClient",
            "shallow visual prompts and head averaged across clients",
            "clip-vision",
            "parameters",
            keys=("prompt-lr-scale",),
        ),
        MethodSpec(
            "fedvpt-d",
            "strategies.fedvpt:FedVPTStrategy",
            "clients.fedvpt:FedVPTClient",
            "deep visual prompts (every layer) and head averaged across clients",
            "clip-vision",
            "parameters",
            variant_of="fedvpt",
            keys=("prompt-lr-scale",),
        ),
        MethodSpec(
            "pep-fedpt",
            "strategies.pep_fedpt:PEPFedPTStrategy",
            "clients.pep_fedpt:PEPFedPTClient",
            "shared + class-specific visual prompts mixed per sample from global prototypes and class priors",
            "clip-vision",
            "per-class",
            f"uploads per-class CLS-token means besides its prompts, {_PER_CLASS}",
            options_check="fedapp.methods.visual_prompts:check_pep_fedpt_options",
            keys=_PEP_FEDPT_KEYS,
        ),
        MethodSpec(
            "fedd2p",
            "strategies.fedd2p:FedD2PStrategy",
            "clients.fedd2p:FedD2PClient",
            "CNN clients' per-class soft labels distilled into a server-held CLIP's prompt generator, and back",
            "cnn+server-clip",
            "per-class",
            f"uploads per-class soft labels {_PER_CLASS}",
            mixed_models=True,
            new_client_note=_PER_CLASS_ONLY,
            personal_state=True,
            options_check="fedapp.methods.fedd2p:check_fedd2p_options",
            keys=_FEDD2P_KEYS,
        ),
        MethodSpec(
            "fedd2p-agg",
            "strategies.fedd2p:FedD2PStrategy",
            "clients.fedd2p:FedD2PClient",
            "FedD2P baseline B2: the count-weighted soft labels go back, no foundation model",
            "cnn",
            "per-class",
            f"uploads per-class soft labels {_PER_CLASS}",
            mixed_models=True,
            new_client_note=_PER_CLASS_ONLY,
            personal_state=True,
            variant_of="fedd2p",
            keys=_FEDD2P_CLIENT_KEYS,
        ),
        MethodSpec(
            "fedd2p-gt",
            "strategies.fedd2p:FedD2PStrategy",
            "clients.fedd2p:FedD2PClient",
            "FedD2P baseline B3: the generator learns from ground truth only, no distillation",
            "cnn+server-clip",
            "per-class",
            f"uploads per-class soft labels {_PER_CLASS}",
            mixed_models=True,
            new_client_note=_PER_CLASS_ONLY,
            personal_state=True,
            variant_of="fedd2p",
            options_check="fedapp.methods.fedd2p:check_fedd2p_options",
            keys=_FEDD2P_KEYS,
        ),
    )
}

METHODS: tuple[str, ...] = tuple(CATALOG)


def _hook(path: str) -> Callable[..., Any]:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def check_method_options(method: str, values: Mapping[str, Any]) -> None:
    """Run ``method``'s own option checks (:attr:`MethodSpec.options_check`) on the run
    configuration's ``values``; its module is imported only then (FedD2P's needs torch)."""
    check = CATALOG[method].options_check
    if check:
        _hook(check)(values)


def text_prompt_lengths(method: str, values: Mapping[str, Any]) -> list[tuple[str, list[int]]]:
    """The text prompts a ``method`` client reads besides ``prompt-length``'s, as ``(what, length
    per client)`` (:attr:`MethodSpec.text_prompt_lengths`; none for most methods)."""
    hook = CATALOG[method].text_prompt_lengths
    return _hook(hook)(values) if hook else []


def methods_where(**facts: object) -> tuple[str, ...]:
    """The methods whose spec has every given attribute value, in catalog order:
    ``methods_where(backbone="clip-text")``, ``methods_where(averages_parameters=True)``."""
    return tuple(name for name, spec in CATALOG.items() if all(getattr(spec, k) == v for k, v in facts.items()))
