"""Method name → (server strategy, edge client), resolved lazily.

Entries are import paths, so a client process imports only its own client
module (a FedD2P edge device never pulls in the server's foundation model).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from fedapp.config import METHODS
from fedapp.errors import ConfigError


@dataclass(frozen=True)
class MethodSpec:
    """Where a method's two halves live, and what it shares."""

    strategy: str
    client: str
    summary: str


REGISTRY: dict[str, MethodSpec] = {
    "fedavg": MethodSpec(
        "strategies.fedavg:FedAvgStrategy",
        "clients.fedavg:FedAvgClient",
        "one shared model, example-weighted averaging (McMahan et al., 2017)",
    ),
    "standalone": MethodSpec(
        "strategies.standalone:StandaloneStrategy",
        "clients.standalone:StandaloneClient",
        "each client trains its own model alone; nothing is shared",
    ),
    "pfedlora": MethodSpec(
        "strategies.pfedlora:PFedLoRAStrategy",
        "clients.pfedlora:PFedLoRAClient",
        "heterogeneous CNNs share a low-rank adapter, trained iteratively with the local model (Yi et al.)",
    ),
    "lg-fedavg": MethodSpec(
        "strategies.lg_fedavg:LGFedAvgStrategy",
        "clients.lg_fedavg:LGFedAvgClient",
        "local representations, one shared classifier head (Liang et al., 2020)",
    ),
    "fedproto": MethodSpec(
        "strategies.fedproto:FedProtoStrategy",
        "clients.per_class:FedProtoClient",
        "per-class prototypes and a prototype regulariser (Tan et al., 2022)",
    ),
    "fd": MethodSpec(
        "strategies.fd:FDStrategy",
        "clients.per_class:FDClient",
        "per-class mean logits and distillation (Jeong et al., 2018)",
    ),
    "fml": MethodSpec(
        "strategies.fml:FMLStrategy",
        "clients.mutual:FMLClient",
        "mutual learning with a shared small model (Shen et al., 2020)",
    ),
    "fedkd": MethodSpec(
        "strategies.fedkd:FedKDStrategy",
        "clients.mutual:FedKDClient",
        "adaptive mutual distillation with a shared small model (Wu et al., 2022)",
    ),
    "coop-local": MethodSpec(
        "strategies.standalone:StandaloneStrategy",
        "clients.prompt:CoOpLocalClient",
        "CoOp on each client alone: a learned text context over a frozen CLIP (Zhou et al., 2022)",
    ),
    "promptfl": MethodSpec(
        "strategies.promptfl:PromptFLStrategy",
        "clients.prompt:PromptFLClient",
        "one shared text context averaged across clients (Guo et al., 2023)",
    ),
    "sdfed": MethodSpec(
        "strategies.sdfed:SDFedStrategy",
        "clients.prompt:SDFedClient",
        "shared global prompt + private variable-length local prompt, subspace refinement, divergence control",
    ),
    "head-fedavg": MethodSpec(
        "strategies.fedvpt:FedVPTStrategy",
        "clients.vpt:HeadFedAvgClient",
        "a linear head on a frozen ViT, averaged across clients",
    ),
    "local-vpt": MethodSpec(
        "strategies.standalone:StandaloneStrategy",
        "clients.vpt:LocalVPTClient",
        "visual prompt tuning on each client alone (Jia et al., 2022)",
    ),
    "fedvpt": MethodSpec(
        "strategies.fedvpt:FedVPTStrategy",
        "clients.vpt:FedVPTClient",
        "shallow visual prompts and head averaged across clients",
    ),
    "fedvpt-d": MethodSpec(
        "strategies.fedvpt:FedVPTStrategy",
        "clients.vpt:FedVPTClient",
        "deep visual prompts (every layer) and head averaged across clients",
    ),
    "pep-fedpt": MethodSpec(
        "strategies.pep_fedpt:PEPFedPTStrategy",
        "clients.vpt:PEPFedPTClient",
        "shared + class-specific visual prompts mixed per sample from global prototypes and class priors",
    ),
    "fedd2p": MethodSpec(
        "strategies.fedd2p:FedD2PStrategy",
        "clients.fedd2p:FedD2PClient",
        "CNN clients' per-class soft labels distilled into a server-held CLIP's prompt generator, and back",
    ),
    "fedd2p-agg": MethodSpec(
        "strategies.fedd2p:FedD2PStrategy",
        "clients.fedd2p:FedD2PClient",
        "FedD2P baseline B2: the count-weighted soft labels go back, no foundation model",
    ),
    "fedd2p-gt": MethodSpec(
        "strategies.fedd2p:FedD2PStrategy",
        "clients.fedd2p:FedD2PClient",
        "FedD2P baseline B3: the generator learns from ground truth only, no distillation",
    ),
}
assert set(REGISTRY) == set(METHODS), "fedapp.config.METHODS and REGISTRY must name the same methods"


def _resolve(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def method_spec(method: str) -> MethodSpec:
    try:
        return REGISTRY[method]
    except KeyError:
        raise ConfigError(f"config key 'method' = {method!r} is not one of: {', '.join(REGISTRY)}") from None


def strategy_class(method: str) -> type:
    """The Strategy subclass that runs ``method`` on the server."""
    return _resolve(method_spec(method).strategy)


def client_class(method: str) -> type:
    """The NumPyClient subclass that runs ``method`` on an edge device."""
    return _resolve(method_spec(method).client)
