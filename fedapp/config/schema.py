"""The run-configuration schema: every key a run accepts, its type, default and allowed range.

:class:`Settings` declares each key once, as a typed dataclass field built with
:func:`setting`; :data:`SCHEMA` (what :func:`fedapp.config.validate` checks), the
defaults ``pyproject.toml`` declares (:func:`defaults`) and the configuration
reference in the docs (:mod:`fedapp.config.reference`) are all derived from it.
The value sets the keys draw from (datasets, partitions, devices ...) live here too.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedapp.aggregation import AGGREGATION_RULES
from fedapp.catalog import CATALOG_PROBLEMS, METHODS
from fedapp.errors import ConfigError

Scalar = bool | int | float | str

ADAPTER_KINDS = ("matrix", "direct")
DATASETS = ("digits", "imagefolder", "domains", "cifar10", "cifar100", "hf")
PARTITIONS = ("iid", "dirichlet", "pathological", "shard", "domain")
# fedapp.data.partitioners.CLASS_ASSIGNMENTS (the config must not import numpy); a test keeps them equal.
CLASS_ASSIGNMENTS = ("first-deterministic", "random", "deterministic")
# len(fedapp.data.domains.SYNTHETIC_DOMAINS); a test keeps them equal.
MAX_SYNTHETIC_DOMAINS = 6
STATE_BACKENDS = ("memory", "disk")
DEVICES = ("auto", "cpu", "cuda")
TRACKERS = ("none", "mlflow", "tensorboard")
FLOWER_APIS = ("legacy", "message")
DATASET_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100}
RESERVE_BACKBONE = "reserve"
"""The ``pretrained`` value asking for a backbone pretrained on the run's reserve (:mod:`fedapp.backbones`)."""
# Where the app's own files live; presets given as relative paths are also
# looked up here, so they resolve the same inside a Flower app bundle (this file is
# fedapp/config/schema.py: three levels below the app root).
APP_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Key:
    """One run-config key: its type, default, and what values it accepts."""

    type: type
    default: Scalar
    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    unavailable: Mapping[str, str] | None = None  # value -> why it is not a choice (a broken plug-in)

    def check(self, name: str, value: Any) -> Scalar:
        """Return ``value`` coerced to this key's type, or raise ConfigError."""
        value = _coerce(name, value, self.type)
        if self.unavailable and value in self.unavailable:
            raise ConfigError(f"config key '{name}' = {value!r} cannot run: {self.unavailable[value]}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"config key '{name}' = {value!r} is not one of: {', '.join(self.choices)}"
                f"{did_you_mean(str(value), self.choices)}"
            )
        if self.type in (int, float):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"config key '{name}' = {value!r} must be a finite number")
            if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
                bound = f"> {self.low}" if self.low_open else f">= {self.low}"
                raise ConfigError(f"config key '{name}' = {value!r} must be {bound}")
            if self.high is not None and value > self.high:
                raise ConfigError(f"config key '{name}' = {value!r} must be <= {self.high}")
        return value


def close_match(word: str, candidates: Iterable[str]) -> str | None:
    """The one of ``candidates`` that ``word`` most likely misspells, or None.

    Case is ignored (``FedAvg`` finds ``fedavg``). The similarity cutoff is 0.75, above difflib's
    0.6: a distinct name that merely shares letters (``fedsgd`` and ``fedkd``) is no typo.
    """
    by_folded = {candidate.casefold(): candidate for candidate in candidates}
    found = difflib.get_close_matches(word.casefold(), by_folded, n=1, cutoff=0.75)
    return by_folded[found[0]] if found else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``": did you mean 'x'?"`` to end an error about ``word`` when ``x`` is a close match, else ``""``."""
    match = close_match(word, candidates)
    return f": did you mean '{match}'?" if match is not None else ""


def _coerce(name: str, value: Any, kind: type) -> Scalar:
    # bool is a subclass of int: refuse it for numeric keys explicitly.
    is_bool = isinstance(value, bool)
    if kind is bool and is_bool:
        return value
    if kind is int and isinstance(value, int) and not is_bool:
        return value
    if kind is float and isinstance(value, int | float) and not is_bool:
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    raise ConfigError(f"config key '{name}' = {value!r} has type {type(value).__name__}, expected {kind.__name__}")


_TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}


def setting(
    default: Scalar,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    unavailable: Mapping[str, str] | None = None,
) -> Any:
    """One run-config key as a :class:`Settings` field: its default, help and allowed range."""
    metadata = {"help": help, "choices": choices, "low": low, "high": high, "low_open": low_open}
    return field(default=default, metadata={**metadata, "unavailable": unavailable})


@dataclass(frozen=True)
class Settings:
    """Every run-config key as a typed attribute: the single source of the schema.

    A key ``num-rounds`` is the attribute ``num_rounds``. :data:`SCHEMA` (validation),
    the defaults ``pyproject.toml`` declares and the configuration reference in the
    docs are all derived from these fields (tests keep them in step).
    """

    preset: str = setting("", "YAML file of key: value pairs layered under explicit overrides")
    method: str = setting("fedavg", "federated method", choices=METHODS, unavailable=CATALOG_PROBLEMS)
    dataset: str = setting("digits", "data source", choices=DATASETS)
    data_dir: str = setting("", "folder or .tar.gz (imagefolder) or download root (cifar)")
    test_data_dir: str = setting("", "external test split; each client draws its test set from it")
    local_split: str = setting(
        "0.8,0.1,0.1", "each client's train,val,test shares (with a shared test pool its test share trains)"
    )
    reserve_pretrain: float = setting(
        0.0, "share of every class set aside for pretraining a backbone; the run never loads it", low=0.0
    )
    reserve_test: float = setting(
        0.0, "share of every class set aside as the clients' test pool (seen by no training)", low=0.0
    )
    reserve_seed: int = setting(0, "seed of the reserve carve (shared by every run and the pretraining)", low=0)
    hf_name: str = setting("", "Hugging Face dataset name when dataset = hf")
    hf_image_column: str = setting("", "dataset = hf: the image column (default: the split's only Image column)")
    hf_label_column: str = setting("", "dataset = hf: the label column (default: the split's only ClassLabel column)")
    download: bool = setting(False, "allow torchvision to download cifar10/cifar100")
    image_size: int = setting(32, "side length images are resized to", low=8, high=1024)
    cache_dir: str = setting("", "where decoded image arrays and partitions are cached (default ~/.cache/fedapp)")
    partition: str = setting(
        "dirichlet", "label partition scheme, or domain (one domain per client)", choices=PARTITIONS
    )
    clients_per_domain: int = setting(
        1, "partition = domain: clients per domain, splitting it by Dirichlet with alpha", low=1
    )
    synthetic_domains: int = setting(
        0,
        "turn the dataset into k synthetic domains (grayscale, blur, colour-shift, rotation, noise, inverted)",
        low=0,
        high=MAX_SYNTHETIC_DOMAINS,
    )
    alpha: float = setting(0.3, "Dirichlet concentration", low=0.0, low_open=True)
    classes_per_client: int = setting(2, "classes per client (pathological)", low=1)
    class_assignment: str = setting(
        "first-deterministic",
        "pathological: how client class sets are chosen (first-deterministic: client i gets class i mod C "
        "and the seed draws the rest; random: the seed draws all; deterministic: i, i+1, ... under every seed)",
        choices=CLASS_ASSIGNMENTS,
    )
    shards_per_client: int = setting(2, "shards per client (shard)", low=1)
    num_partitions: int = setting(10, "clients when the node config does not say", low=1)
    num_rounds: int = setting(15, "server rounds", low=1)
    fraction_fit: float = setting(1.0, "share of clients trained per round", low=0.0, low_open=True, high=1.0)
    fraction_evaluate: float = setting(1.0, "share of clients evaluated per round", low=0.0, low_open=True, high=1.0)
    min_clients: int = setting(2, "fewest clients a round may run with", low=1)
    round_timeout: float = setting(
        0.0, "seconds the server waits for each client's reply in a round (0 = no limit)", low=0.0
    )
    local_epochs: int = setting(1, "local epochs per round", low=1)
    batch_size: int = setting(32, "local mini-batch size", low=1)
    lr: float = setting(0.05, "SGD learning rate", low=0.0, low_open=True)
    momentum: float = setting(0.9, "SGD momentum", low=0.0, high=1.0)
    weight_decay: float = setting(0.0, "SGD weight decay", low=0.0)
    seed: int = setting(0, "seed of partitioning, sampling, initialisation and data order", low=0)
    model: str = setting("cnn-1", "model name from the zoo")
    client_models: str = setting("", "comma list of zoo models cycled over clients (client k: entry k mod len)")
    shared_model: str = setting("cnn-5", "the small shared model of FML and FedKD")
    adapter_kind: str = setting(
        "matrix", "pFedLoRA adapter: matrix decomposition or direct reduction", choices=ADAPTER_KINDS
    )
    adapter_hidden: int = setting(40, "pFedLoRA adapter hidden width", low=1)
    adapter_init: str = setting(
        "default",
        "pFedLoRA adapter start: torch's default, or lora (Gaussian down, zero up)",
        choices=("default", "lora"),
    )
    pfedlora_inference: str = setting(
        "head",
        "pFedLoRA prediction (the paper is silent): the model's head, the adapter, or both combined",
        choices=("head", "adapter", "combined"),
    )
    mu: float = setting(0.5, "pFedLoRA weight of the adapter branch in step 1", low=0.0, high=1.0)
    proto_weight: float = setting(1.0, "FedProto weight of the prototype regulariser", low=0.0)
    kd_weight: float = setting(1.0, "FD weight of the distillation term", low=0.0)
    kd_temperature: float = setting(1.0, "softmax temperature of distillation terms", low=0.0, low_open=True)
    fml_alpha: float = setting(0.5, "FML weight of the local model's own CE (1 - alpha on KL)", low=0.0, high=1.0)
    fml_beta: float = setting(0.5, "FML weight of the shared model's own CE (1 - beta on KL)", low=0.0, high=1.0)
    pretrained: str = setting(
        "", 'open_clip pretrained tag, local checkpoint path, or "reserve" (made from reserve-pretrain on first use)'
    )
    clip_model: str = setting("fedapp-tiny-clip", "open_clip model of the CLIP methods")
    client_clip_models: str = setting("", "comma list of open_clip models cycled over clients (model heterogeneity)")
    precision: str = setting("fp32", "precision of the frozen encoders", choices=("fp32", "fp16", "bf16"))
    shots_per_class: int = setting(0, "training samples per class on each client (0 = all)", low=0)
    prompt_length: int = setting(8, "length of the shared (global) text prompt", low=1)
    local_prompt_lengths: str = setting("random:4-16", "SDFed local prompt lengths: 16, a list 4,8,16, or random:4-64")
    sdfed_lambda: float = setting(0.6, "SDFed share of the global prompt's directions removed", low=0.0, high=1.0)
    sdfed_gamma: float = setting(0.8, "SDFed divergence margin", low=0.0)
    sdfed_alpha: float = setting(1.0, "SDFed weight of information retention L_str", low=0.0)
    sdfed_beta: float = setting(1.0, "SDFed weight of divergence control L_sep", low=0.0)
    projector_mode: str = setting(
        "dim",
        "SDFed projector: the paper's floor(lambda * token width) directions (dim) or floor(lambda * rank(G_s)) (rank)",
        choices=("dim", "rank"),
    )
    sdfed_combination: str = setting(
        "sequence",
        "SDFed: average the cosines of [G_s][class] and [refined G_c][class] (average) or encode one "
        "sequence [G_s][refined G_c][class] (sequence)",
        choices=("average", "sequence"),
    )
    sdfed_separation_moves_global: bool = setting(
        True, "SDFed: L_sep's gradient reaches the global prompt too (true, the loss as written) or only G_c"
    )
    prompt_lr_scale: float = setting(
        1.0,
        "visual-prompt methods: the prompts' learning rate is lr times this (the head's is lr)",
        low=0.0,
        low_open=True,
    )
    class_prompt_layers: str = setting("5,6,7", "PEP-FedPT layers (from 1) with class-specific prompts, e.g. 5,6,7")
    class_prompt_length: int = setting(4, "PEP-FedPT tokens per class-specific prompt", low=1)
    ccmp_temperature: float = setting(0.1, "PEP-FedPT temperature tau of the prompt mixing", low=0.0, low_open=True)
    pep_mixer: str = setting(
        "ccmp",
        "PEP-FedPT mixing: the paper's per-sample mix (ccmp) or each sample's own label's prompt (oracle, an "
        "ablation that reads the labels in training and evaluation)",
        choices=("ccmp", "oracle"),
    )
    prototype_momentum: float = setting(
        0.5, "PEP-FedPT momentum beta of the server's class prototypes", low=0.0, high=1.0
    )
    warmup_epochs: int = setting(
        0, "FedD2P S0: CE-only local epochs of a client's first round (0 = local-epochs)", low=0
    )
    d2p_tau1: float = setting(10.0, "FedD2P temperature of the clients' soft labels", low=0.0, low_open=True)
    d2p_distil_temperature: float = setting(
        0.0, "FedD2P S3: temperature of the clients' distillation term (0 = d2p-tau1, the paper's Eq. 3)", low=0.0
    )
    d2p_tau2: float = setting(0.1, "FedD2P temperature of the server's class distributions", low=0.0, low_open=True)
    d2p_steps: int = setting(100, "FedD2P generator training steps per round", low=1)
    d2p_lr: float = setting(0.001, "FedD2P generator learning rate (Adam)", low=0.0, low_open=True)
    d2p_prompt_tokens: int = setting(4, "FedD2P visual prompt tokens per class", low=1)
    d2p_template: str = setting("", "FedD2P class description: photo, digit, texture, satellite or text with {c}")
    d2p_generator: str = setting("attention", "FedD2P prompt generator", choices=("attention", "mlp"))
    held_out_fraction: float = setting(
        0.0, "share of clients that never train, evaluated with the global state only", low=0.0, high=0.9
    )
    held_out_draw: str = setting(
        "covered",
        "held-out-fraction: draw only clients whose every class keeps a training client (covered) or any (any)",
        choices=("covered", "any"),
    )
    held_out_domain: int = setting(
        -1, "partition = domain: index of the domain whose clients never train (-1 = none)", low=-1
    )
    base_to_novel: bool = setting(
        False, "train on the first half of the classes (base), report base, novel and harmonic mean"
    )
    results_dir: str = setting("results", "where run folders are written")
    run_name: str = setting("", "run folder name (default: method-dataset-partition-<settings digest>-s<seed>)")
    resume: bool = setting(False, "continue the run from results-dir/run-name/checkpoint.npz")
    traceback: bool = setting(False, "log ServerApp and client errors with their tracebacks (default: one line each)")
    state: str = setting("memory", "where personal client state lives", choices=STATE_BACKENDS)
    state_dir: str = setting("state", "root of on-disk client state (state = disk)")
    personal_state_from: str = setting(
        "",
        "state = disk: a new run's clients start from the personal state this earlier run (its run-name) "
        "left on each node, copied; default: only their own run's",
    )
    device: str = setting("auto", "torch device for local training", choices=DEVICES)
    target_accuracy: float = setting(0.8, "accuracy for the rounds/MB-to-target summary", low=0.0, high=1.0)
    tracker: str = setting(
        "none", "experiment tracker the run also logs to (needs the [tracking] extra)", choices=TRACKERS
    )
    tracking_uri: str = setting("", "tracker = mlflow: tracking URI (default: sqlite:///<results-dir>/mlflow.db)")
    export_models: bool = setting(True, "write the global and personal models as safetensors under models/")
    api: str = setting(
        "legacy",
        "Flower API our ServerApp drives the strategy on: legacy (Strategy + NumPyClient) or message "
        "(flwr.serverapp Strategy + ClientApp handlers)",
        choices=FLOWER_APIS,
    )
    dp: str = setting(
        "off",
        "client-level differential privacy: off, server (server clips) or client (clients clip)",
        choices=("off", "server", "client"),
    )
    dp_noise_multiplier: float = setting(1.0, "DP Gaussian noise std per unit of clipping norm (sigma)", low=0.0)
    dp_clipping_norm: float = setting(1.0, "DP bound C on the L2 norm of each client's update", low=0.0, low_open=True)
    dp_delta: float = setting(1e-5, "DP delta of the reported epsilon (0 < delta < 1)", low=0.0, low_open=True)
    aggregation: str = setting(
        "mean",
        "how shared arrays are combined: mean (FedAvg) or one of Flower's robust rules",
        choices=AGGREGATION_RULES,
    )
    trim_fraction: float = setting(0.2, "share cut from each end per coordinate (aggregation = trimmed-mean)", low=0.0)
    byzantine_clients: int = setting(0, "malicious updates a round tolerates (krum, multi-krum, bulyan)", low=0)
    update_norm_bound: float = setting(
        0.0, "leave out updates whose L2 distance from the global arrays exceeds this (0 = off)", low=0.0
    )
    secagg: bool = setting(False, "secure aggregation (SecAgg+): the server sees only the average of the uploads")
    secagg_num_shares: float = setting(
        1.0, "SecAgg+ shares per secret: <= 1 a share of a round's clients, else a count", low=0.0, low_open=True
    )
    secagg_reconstruction_threshold: float = setting(
        0.67, "SecAgg+ shares that rebuild a secret: <= 1 a share of them, else a count", low=0.0, low_open=True
    )
    secagg_clipping_range: float = setting(
        8.0, "SecAgg+ clips every uploaded value to [-range, range] before quantizing", low=0.0, low_open=True
    )
    secagg_quantization_range: int = setting(
        4194304, "SecAgg+ integer levels over the clipping range (default 2**22)", low=2, high=2**31
    )
    secagg_max_weight: float = setting(
        1000.0, "SecAgg+ largest example count a client is expected to report", low=0.0, low_open=True
    )


SCHEMA: dict[str, Key] = {
    spec.name.replace("_", "-"): Key(_TYPES[str(spec.type)], spec.default, **spec.metadata) for spec in fields(Settings)
}
"""Every key a run accepts, by its config name (``num-rounds``), derived from :class:`Settings`."""


def defaults() -> dict[str, Scalar]:
    """Return the default value of every key (what pyproject.toml declares)."""
    return {name: key.default for name, key in SCHEMA.items()}
