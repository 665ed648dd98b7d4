"""The methods this project ships, one :class:`~fedapp.catalog.MethodSpec` each.

They reach the catalog as every method does, through the ``fedapp.methods`` entry points that
``pyproject.toml`` declares (``fedavg = "fedapp.builtin_methods:FEDAVG"`` ...), so a package of
your own adds a method the same way (docs/extending.md). Plain data: no Flower, no torch.

Why this module is long: it is a table, one entry per method, each with the facts the
config rules, the registry and the docs read.
"""

from __future__ import annotations

from dataclasses import replace

from fedapp.catalog import MethodSpec
from fedapp.methods.distillation_options import FDOptions, FedProtoOptions, FMLOptions, MutualOptions
from fedapp.methods.fedd2p_options import FedD2PClientOptions, FedD2POptions
from fedapp.methods.pfedlora_options import PFedLoRAOptions
from fedapp.methods.sdfed_options import SDFedOptions
from fedapp.methods.text_prompt_options import TextPromptOptions
from fedapp.methods.visual_prompt_options import PEPFedPTOptions, VisualPromptOptions

_PER_CLASS = "with integer class counts, which the server merges class by class instead of averaging"
_LOCAL_MODEL = "clients are scored on their own local model, which a new client has not trained"
_ALONE = "each client trains its own model alone, so a client that never trained has none"
_PER_CLASS_ONLY = "clients share per-class knowledge, not a model; a new client's model is untrained"


FEDAVG = MethodSpec(
    "fedavg",
    "fedapp.strategies.fedavg:FedAvgStrategy",
    "fedapp.clients.fedavg:FedAvgClient",
    "one shared model, example-weighted averaging (McMahan et al., 2017)",
    "cnn",
    "parameters",
    title="FedAvg",
    page="methods/fedavg.md",
)


STANDALONE = MethodSpec(
    "standalone",
    "fedapp.strategies.standalone:StandaloneStrategy",
    "fedapp.clients.standalone:StandaloneClient",
    "each client trains its own model alone; nothing is shared",
    "cnn",
    "nothing",
    "uploads nothing (each client trains alone)",
    mixed_models=True,
    new_client_note=_ALONE,
    personal_state=True,
    title="Standalone",
    page="methods/standalone.md",
    borrowed_presets=("claims-family-b", "claims-family-c"),
)


PFEDLORA = MethodSpec(
    "pfedlora",
    "fedapp.strategies.pfedlora:PFedLoRAStrategy",
    "fedapp.clients.pfedlora:PFedLoRAClient",
    "heterogeneous CNNs share a low-rank adapter, trained iteratively with the local model (Yi et al., 2024)",
    "cnn",
    "parameters",
    mixed_models=True,
    new_client_note="only the low-rank adapter is shared; a new client's own CNN is untrained",
    personal_state=True,
    options=PFedLoRAOptions,
    title="pFedLoRA",
    page="methods/pfedlora.md",
)


LG_FEDAVG = MethodSpec(
    "lg-fedavg",
    "fedapp.strategies.lg_fedavg:LGFedAvgStrategy",
    "fedapp.clients.lg_fedavg:LGFedAvgClient",
    "local representations, one shared classifier head (Liang et al., 2020)",
    "cnn",
    "parameters",
    mixed_models=True,
    new_client_note="only the classifier head is shared; a new client's representation layers are untrained",
    personal_state=True,
    title="LG-FedAvg",
    page="methods/lg-fedavg.md",
    borrowed_presets=("pfedlora-digits", "claims-family-b"),
)


FEDPROTO = MethodSpec(
    "fedproto",
    "fedapp.strategies.fedproto:FedProtoStrategy",
    "fedapp.clients.fedproto:FedProtoClient",
    "per-class prototypes and a prototype regulariser (Tan et al., 2022)",
    "cnn",
    "per-class",
    f"uploads per-class prototypes {_PER_CLASS}",
    mixed_models=True,
    new_client_note=_PER_CLASS_ONLY,
    personal_state=True,
    options=FedProtoOptions,
    title="FedProto",
    page="methods/fedproto.md",
    borrowed_presets=("pfedlora-digits", "claims-family-b"),
)


FD = MethodSpec(
    "fd",
    "fedapp.strategies.fd:FDStrategy",
    "fedapp.clients.fd:FDClient",
    "per-class mean logits and distillation (Jeong et al., 2018)",
    "cnn",
    "per-class",
    f"uploads per-class mean logits {_PER_CLASS}",
    mixed_models=True,
    new_client_note=_PER_CLASS_ONLY,
    personal_state=True,
    options=FDOptions,
    title="FD",
    page="methods/fd.md",
    borrowed_presets=("pfedlora-digits", "claims-family-b"),
)


FML = MethodSpec(
    "fml",
    "fedapp.strategies.fml:FMLStrategy",
    "fedapp.clients.fml:FMLClient",
    "mutual learning with a shared small model (Shen et al., 2020)",
    "cnn",
    "parameters",
    mixed_models=True,
    new_client_note=_LOCAL_MODEL,
    personal_state=True,
    options=FMLOptions,
    title="FML",
    page="methods/fml.md",
    borrowed_presets=("pfedlora-digits", "claims-family-b"),
)


FEDKD = MethodSpec(
    "fedkd",
    "fedapp.strategies.fedkd:FedKDStrategy",
    "fedapp.clients.fedkd:FedKDClient",
    "adaptive mutual distillation with a shared small model (Wu et al., 2022)",
    "cnn",
    "parameters",
    mixed_models=True,
    new_client_note=_LOCAL_MODEL,
    personal_state=True,
    options=MutualOptions,
    title="FedKD",
    page="methods/fedkd.md",
    borrowed_presets=("pfedlora-digits", "claims-family-b"),
)


COOP_LOCAL = MethodSpec(
    "coop-local",
    "fedapp.strategies.standalone:StandaloneStrategy",
    "fedapp.clients.coop_local:CoOpLocalClient",
    "CoOp on each client alone: a learned text context over a frozen CLIP (Zhou et al., 2022)",
    "clip-text",
    "nothing",
    "uploads nothing (each client trains alone)",
    new_client_note=_ALONE,
    personal_state=True,
    title="CoOp-local",
    page="methods/coop-local.md",
    borrowed_presets=("claims-family-a",),
    options=TextPromptOptions,
)


PROMPTFL = MethodSpec(
    "promptfl",
    "fedapp.strategies.promptfl:PromptFLStrategy",
    "fedapp.clients.promptfl:PromptFLClient",
    "one shared text context averaged across clients (Guo et al., 2023)",
    "clip-text",
    "parameters",
    title="PromptFL",
    page="methods/promptfl.md",
    borrowed_presets=("claims-family-a",),
    options=TextPromptOptions,
)


SDFED = MethodSpec(
    "sdfed",
    "fedapp.strategies.sdfed:SDFedStrategy",
    "fedapp.clients.sdfed:SDFedClient",
    "shared global prompt + private variable-length local prompt, subspace refinement, divergence control",
    "clip-text",
    "parameters",
    new_client_note="half of its classifier is the private local prompt, which a new client has not trained",
    personal_state=True,
    options=SDFedOptions,
    title="SDFed",
    page="methods/sdfed.md",
)


HEAD_FEDAVG = MethodSpec(
    "head-fedavg",
    "fedapp.strategies.fedvpt:FedVPTStrategy",
    "fedapp.clients.head_fedavg:HeadFedAvgClient",
    "a linear head on a frozen ViT, averaged across clients",
    "clip-vision",
    "parameters",
    options=VisualPromptOptions,
    title="head-only FedAvg",
    page="methods/head-fedavg.md",
    borrowed_presets=("pep-fedpt-digits", "claims-family-d", "pep-fedpt-vitb16"),
)


LOCAL_VPT = MethodSpec(
    "local-vpt",
    "fedapp.strategies.standalone:StandaloneStrategy",
    "fedapp.clients.local_vpt:LocalVPTClient",
    "visual prompt tuning on each client alone (Jia et al., 2022)",
    "clip-vision",
    "nothing",
    "uploads nothing (each client trains alone)",
    new_client_note=_ALONE,
    personal_state=True,
    options=VisualPromptOptions,
    title="local VPT",
    page="methods/local-vpt.md",
    borrowed_presets=("pep-fedpt-digits", "claims-family-d", "pep-fedpt-vitb16"),
)


FEDVPT = MethodSpec(
    "fedvpt",
    "fedapp.strategies.fedvpt:FedVPTStrategy",
    "fedapp.clients.fedvpt:FedVPTClient",
    "shallow visual prompts and head averaged across clients",
    "clip-vision",
    "parameters",
    options=VisualPromptOptions,
    title="FedVPT",
    page="methods/fedvpt.md",
    borrowed_presets=("pep-fedpt-digits", "claims-family-d", "pep-fedpt-vitb16"),
)


FEDVPT_D = replace(
    FEDVPT,
    name="fedvpt-d",
    summary="deep visual prompts (every layer) and head averaged across clients",
    title="FedVPT-D",
    variant_of="fedvpt",
)


PEP_FEDPT = MethodSpec(
    "pep-fedpt",
    "fedapp.strategies.pep_fedpt:PEPFedPTStrategy",
    "fedapp.clients.pep_fedpt:PEPFedPTClient",
    "shared + class-specific visual prompts mixed per sample from global prototypes and class priors",
    "clip-vision",
    "per-class",
    f"uploads per-class CLS-token means besides its prompts, {_PER_CLASS}",
    options=PEPFedPTOptions,
    title="PEP-FedPT",
    page="methods/pep-fedpt.md",
)


FEDD2P = MethodSpec(
    "fedd2p",
    "fedapp.strategies.fedd2p:FedD2PStrategy",
    "fedapp.clients.fedd2p:FedD2PClient",
    "CNN clients' per-class soft labels distilled into a server-held CLIP's prompt generator, and back",
    "cnn+server-clip",
    "per-class",
    f"uploads per-class soft labels {_PER_CLASS}",
    mixed_models=True,
    new_client_note=_PER_CLASS_ONLY,
    personal_state=True,
    options=FedD2POptions,
    title="FedD2P",
    page="methods/fedd2p.md",
)


# What FedD2P's baselines share: its halves, documented in a section of its page, run on its presets.
_FEDD2P_BASELINE = replace(
    FEDD2P,
    variant_of="fedd2p",
    page="methods/fedd2p.md#baselines-b1-b3-and-the-mlp-ablation",
    borrowed_presets=("fedd2p-digits", "claims-family-c", "fedd2p-cifar10"),
)


FEDD2P_AGG = replace(
    _FEDD2P_BASELINE,
    name="fedd2p-agg",
    title="FedD2P-agg",
    summary="FedD2P baseline B2: the count-weighted soft labels go back, no foundation model",
    backbone="cnn",
    options=FedD2PClientOptions,
)


FEDD2P_GT = replace(
    _FEDD2P_BASELINE,
    name="fedd2p-gt",
    title="FedD2P-gt",
    summary="FedD2P baseline B3: the generator learns from ground truth only, no distillation",
)

BUILTIN: tuple[MethodSpec, ...] = (
    SDFED,
    PFEDLORA,
    FEDD2P,
    FEDD2P_AGG,
    FEDD2P_GT,
    PEP_FEDPT,
    FEDAVG,
    STANDALONE,
    LG_FEDAVG,
    FEDPROTO,
    FD,
    FML,
    FEDKD,
    COOP_LOCAL,
    PROMPTFL,
    HEAD_FEDAVG,
    LOCAL_VPT,
    FEDVPT,
    FEDVPT_D,
)
"""In the order the docs, their method x preset index and the config reference list them: the four
published methods first (each followed by its own baselines' variants), then the baselines."""
