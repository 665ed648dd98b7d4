"""Run configuration: the schema, YAML presets and validation.

Every key a run accepts is declared once in :data:`SCHEMA` with its type, default
and allowed range. Flower hands both apps the merged ``[tool.flwr.app.config]``
table plus ``--run-config`` overrides; :func:`resolve_run_config` layers the
selected YAML preset under the explicit overrides and validates the result
before any data is touched or any model is built.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedapp.aggregation import AGGREGATION_RULES, min_updates
from fedapp.catalog import CATALOG, METHODS, methods_where
from fedapp.errors import ConfigError

Scalar = bool | int | float | str

ADAPTER_KINDS = ("matrix", "direct")
DATASETS = ("digits", "imagefolder", "domains", "cifar10", "cifar100", "hf")
PARTITIONS = ("iid", "dirichlet", "pathological", "shard", "domain")
# len(fedapp.data.domains.SYNTHETIC_DOMAINS); a test keeps them equal.
MAX_SYNTHETIC_DOMAINS = 6
STATE_BACKENDS = ("memory", "disk")
DEVICES = ("auto", "cpu", "cuda")
DATASET_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100}
# Where the app's own files live; presets given as relative paths are also
# looked up here, so they resolve the same inside a Flower app bundle.
APP_ROOT = Path(__file__).resolve().parent.parent


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

    def check(self, name: str, value: Any) -> Scalar:
        """Return ``value`` coerced to this key's type, or raise ConfigError."""
        value = _coerce(name, value, self.type)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"config key '{name}' = {value!r} is not one of: {', '.join(self.choices)}")
        if self.type in (int, float):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"config key '{name}' = {value!r} must be a finite number")
            if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
                bound = f"> {self.low}" if self.low_open else f">= {self.low}"
                raise ConfigError(f"config key '{name}' = {value!r} must be {bound}")
            if self.high is not None and value > self.high:
                raise ConfigError(f"config key '{name}' = {value!r} must be <= {self.high}")
        return value


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
) -> Any:
    """One run-config key as a :class:`Settings` field: its default, help and allowed range."""
    return field(
        default=default, metadata={"help": help, "choices": choices, "low": low, "high": high, "low_open": low_open}
    )


@dataclass(frozen=True)
class Settings:
    """Every run-config key as a typed attribute: the single source of the schema.

    A key ``num-rounds`` is the attribute ``num_rounds``. :data:`SCHEMA` (validation),
    the defaults ``pyproject.toml`` declares and the configuration reference in the
    docs are all derived from these fields (tests keep them in step).
    """

    preset: str = setting("", "YAML file of key: value pairs layered under explicit overrides")
    method: str = setting("fedavg", "federated method", choices=METHODS)
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
    mu: float = setting(0.5, "pFedLoRA weight of the adapter branch in step 1", low=0.0, high=1.0)
    proto_weight: float = setting(1.0, "FedProto weight of the prototype regulariser", low=0.0)
    kd_weight: float = setting(1.0, "FD weight of the distillation term", low=0.0)
    kd_temperature: float = setting(1.0, "softmax temperature of distillation terms", low=0.0, low_open=True)
    fml_alpha: float = setting(0.5, "FML weight of the local model's own CE (1 - alpha on KL)", low=0.0, high=1.0)
    fml_beta: float = setting(0.5, "FML weight of the shared model's own CE (1 - beta on KL)", low=0.0, high=1.0)
    pretrained: str = setting("", "open_clip pretrained tag or local checkpoint path")
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
        "rank", "SDFed projector: rank of G_s (ours) or the literal dim", choices=("rank", "dim")
    )
    class_prompt_layers: str = setting("5,6,7", "PEP-FedPT layers (from 1) with class-specific prompts, e.g. 5,6,7")
    class_prompt_length: int = setting(4, "PEP-FedPT tokens per class-specific prompt", low=1)
    ccmp_temperature: float = setting(0.1, "PEP-FedPT temperature tau of the prompt mixing", low=0.0, low_open=True)
    prototype_momentum: float = setting(
        0.5, "PEP-FedPT momentum beta of the server's class prototypes", low=0.0, high=1.0
    )
    warmup_epochs: int = setting(
        0, "FedD2P S0: CE-only local epochs of a client's first round (0 = local-epochs)", low=0
    )
    d2p_tau1: float = setting(10.0, "FedD2P temperature of the clients' soft labels", low=0.0, low_open=True)
    d2p_tau2: float = setting(0.1, "FedD2P temperature of the server's class distributions", low=0.0, low_open=True)
    d2p_steps: int = setting(100, "FedD2P generator training steps per round", low=1)
    d2p_lr: float = setting(0.001, "FedD2P generator learning rate (Adam)", low=0.0, low_open=True)
    d2p_prompt_tokens: int = setting(4, "FedD2P visual prompt tokens per class", low=1)
    d2p_template: str = setting("", "FedD2P class description: photo, digit, texture, satellite or text with {c}")
    d2p_generator: str = setting("attention", "FedD2P prompt generator", choices=("attention", "mlp"))
    held_out_fraction: float = setting(
        0.0, "share of clients that never train, evaluated with the global state only", low=0.0, high=0.9
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
    device: str = setting("auto", "torch device for local training", choices=DEVICES)
    target_accuracy: float = setting(0.8, "accuracy for the rounds/MB-to-target summary", low=0.0, high=1.0)
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


@dataclass(frozen=True)
class RunConfig(Settings):
    """A validated run configuration: every key a typed attribute (``config.num_rounds``).

    ``config.num_rounds`` still reads a key by its config name, for code that
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


NOT_SETTINGS = frozenset({"seed", "run-name", "results-dir", "resume", "preset", "cache-dir", "traceback"})
"""Keys that do not change what a run computes beyond its seed: runs differing only in them are
repetitions of one setting (the report's seed groups, the sweep's and the derived run names)."""


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


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every schema key it lacks at its default: a run made before a key existed
    ran as that default (report seed groups and sweeps compare runs this way)."""
    return {**defaults(), **config}


def same_setting_key(config: Mapping[str, Any]) -> str:
    """A text equal for two configs exactly when they differ only in :data:`NOT_SETTINGS` (seed aside)."""
    settings = {key: value for key, value in with_defaults(config).items() if key not in NOT_SETTINGS}
    return json.dumps(settings, sort_keys=True, default=str)


def defaults() -> dict[str, Scalar]:
    """Return the default value of every key (what pyproject.toml declares)."""
    return {name: key.default for name, key in SCHEMA.items()}


def find_preset(path: str) -> Path:
    """Locate a preset file given as absolute, relative to the CWD, or to the app."""
    candidates = [Path(path).expanduser()]
    if not candidates[0].is_absolute():
        candidates.append(APP_ROOT / path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"config key 'preset' = {path!r}: file not found (looked in {candidates})")


def load_preset(path: str) -> dict[str, Any]:
    """Read a YAML preset: a flat mapping of config keys to scalar values."""
    file = find_preset(path)
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config key 'preset' = {path!r}: not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config key 'preset' = {path!r}: expected a mapping of keys to values")
    if "preset" in data:
        raise ConfigError(f"config key 'preset' = {path!r}: a preset may not name another preset")
    return data


def resolve_run_config(run_config: Mapping[str, Any], *, ignore_unknown: bool = False) -> RunConfig:
    """Merge defaults, the selected preset and explicit overrides, then validate.

    Flower passes the app's defaults already merged with ``--run-config``, so an
    override is recognised as a value that differs from the default; those win
    over the preset, every other key takes the preset's value. Unknown keys are
    an error (they are usually typos) unless ``ignore_unknown``: a project that
    embeds our strategies or ClientApp may carry keys of its own in the same
    run config, and those are then left out.
    """
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown and ignore_unknown:
        run_config = {name: value for name, value in run_config.items() if name in SCHEMA}
    elif unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)}; valid keys: {', '.join(SCHEMA)}")
    base = defaults()
    preset_name = SCHEMA["preset"].check("preset", run_config.get("preset", ""))
    merged: dict[str, Any] = dict(base)
    if preset_name:
        preset = load_preset(str(preset_name))
        bad = sorted(set(preset) - set(SCHEMA))
        if bad:
            raise ConfigError(f"unknown config key(s) in preset {preset_name!r}: {', '.join(bad)}")
        merged.update(preset)
    for name, value in run_config.items():
        if name not in base or value != base[name]:
            merged[name] = value
    return validate(merged)


def validate(values: Mapping[str, Any]) -> RunConfig:
    """Check every key, then the rules that tie keys together."""
    unknown = sorted(set(values) - set(SCHEMA))
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)}")
    config = RunConfig.from_values(
        {name: key.check(name, values.get(name, key.default)) for name, key in SCHEMA.items()}
    )
    for rule in _CROSS_RULES:
        rule(config)
    return config


def _check_classes_per_client(v: RunConfig) -> None:
    total = DATASET_CLASSES.get(v.dataset)
    if v.partition == "pathological" and total is not None and v.classes_per_client > total:
        raise ConfigError(
            f"config key 'classes-per-client' = {v['classes-per-client']} is more than the "
            f"{total} classes of dataset '{v['dataset']}'"
        )


def client_model_names(v: RunConfig) -> tuple[str, ...]:
    """The models cycled over clients: ``client-models`` if set, else ``(model,)``."""
    listed = tuple(name.strip() for name in v.client_models.split(",") if name.strip())
    return listed or (v.model,)


def client_clip_model_names(v: RunConfig) -> tuple[str, ...]:
    """The open_clip backbones cycled over clients: ``client-clip-models`` if set, else ``(clip-model,)``."""
    listed = tuple(name.strip() for name in v.client_clip_models.split(",") if name.strip())
    return listed or (v.clip_model,)


def held_out_partitions(v: RunConfig) -> frozenset[int]:
    """Partitions that never train: ``round(held-out-fraction * num-partitions)`` of
    them, drawn from the seed alone so server and clients agree without talking,
    and every client of ``held-out-domain`` (leave-one-domain-out)."""
    total = v.num_partitions
    held: set[int] = set()
    count = round(v.held_out_fraction * total)
    if count:
        rng = np.random.default_rng([v.seed, 0x4E1D])
        held.update(int(i) for i in rng.choice(total, size=count, replace=False))
    domain = v.held_out_domain
    if domain >= 0:
        held.update(p for p in range(total) if domain_of_partition(v, p) == domain)
    return frozenset(held)


def domain_of_partition(v: RunConfig, partition: int) -> int | None:
    """The domain whose data partition ``partition`` holds (``partition = domain``), else None."""
    if v.partition != "domain":
        return None
    return partition // v.clients_per_domain


def _check_domains(v: RunConfig) -> None:
    synthetic = v.synthetic_domains
    per_domain = v.clients_per_domain
    if synthetic == 1:
        raise ConfigError("config key 'synthetic-domains' = 1: use 0 (off) or at least 2 domains")
    if synthetic and v.dataset == "domains":
        raise ConfigError(
            "config key 'synthetic-domains' is set, but dataset 'domains' already has domains (its subfolders)"
        )
    if v.test_data_dir and (synthetic or v.partition == "domain"):
        raise ConfigError(
            "config key 'test-data-dir' is set, but with domains each client tests on its own domain's data"
        )
    if v.partition != "domain":
        for key, unset in (("clients-per-domain", 1), ("held-out-domain", -1)):
            if v[key] != unset:
                raise ConfigError(f"config key '{key}' = {v[key]} applies only to partition = domain")
        return
    if not synthetic and v.dataset != "domains":
        raise ConfigError(
            f"config key 'partition' = 'domain' needs domains: dataset 'domains' (a folder per domain) or "
            f"'synthetic-domains' >= 2 on dataset {v['dataset']!r}"
        )
    if synthetic and v.num_partitions != synthetic * per_domain:
        raise ConfigError(
            f"config key 'num-partitions' = {v['num-partitions']}: partition = domain gives each of the "
            f"{synthetic} synthetic domains {per_domain} client(s), so num-partitions must be {synthetic * per_domain}"
        )
    if synthetic and v.held_out_domain >= synthetic:
        raise ConfigError(
            f"config key 'held-out-domain' = {v['held-out-domain']} is not a domain index (0..{synthetic - 1})"
        )


def _check_base_to_novel(v: RunConfig) -> None:
    if v.base_to_novel and not CATALOG[v.method].names_unseen_classes:
        raise ConfigError(
            f"config key 'base-to-novel' = true, but method {v['method']!r} classifies with a head learned over its "
            f"training classes and cannot name classes it never saw; base-to-novel runs "
            f"{', '.join(methods_where(names_unseen_classes=True))}"
        )


def _check_vision_tower(v: RunConfig) -> None:
    if CATALOG[v.method].backbone == "cnn+server-clip":
        template = v.d2p_template
        from fedapp.methods.fedd2p import TEMPLATES  # noqa: PLC0415 - torch only when needed

        if template and template not in TEMPLATES and "{c}" not in template:
            raise ConfigError(
                f"config key 'd2p-template' = {template!r} is neither one of {', '.join(TEMPLATES)} "
                "nor a template containing {c}"
            )
        return  # its backbone is the server's alone: checked there, so edge clients never import open_clip
    if CATALOG[v.method].backbone != "clip-vision":
        return
    if v.client_clip_models.strip():
        raise ConfigError(
            f"config key 'client-clip-models' = {v['client-clip-models']!r}: method '{v['method']}' averages "
            "runs one backbone; set 'clip-model' only"
        )
    from fedapp.errors import ModelError  # noqa: PLC0415
    from fedapp.models.vpt import vision_tower_shape  # noqa: PLC0415 - open_clip only when needed

    try:
        shape = vision_tower_shape(v.clip_model)
    except ModelError as err:
        raise ConfigError(f"config key 'clip-model' = {v['clip-model']!r}: {err}") from err
    if v.method == "pep-fedpt":
        from fedapp.methods.visual_prompts import parse_class_layers  # noqa: PLC0415

        layers = parse_class_layers(v.class_prompt_layers)
        bad = [layer for layer in layers if not 2 <= layer <= shape.layers]
        if bad:
            raise ConfigError(
                f"config key 'class-prompt-layers' = {v['class-prompt-layers']!r}: layers {bad} are outside "
                f"2..{shape.layers} (the blocks of {v['clip-model']}; layer 1 has no image-dependent CLS to mix on)"
            )


def _check_held_out(v: RunConfig) -> None:
    held = len(held_out_partitions(v))
    training = v.num_partitions - held
    if held and training < v.min_clients:
        raise ConfigError(
            f"config key 'held-out-fraction' = {v['held-out-fraction']} holds out {held} of "
            f"{v['num-partitions']} clients, leaving {training} to train, fewer than min-clients = {v['min-clients']}"
        )


def _check_model(v: RunConfig) -> None:
    from fedapp.models import MODEL_NAMES  # noqa: PLC0415 - keeps config import light

    for key in ("model", "shared-model"):
        if v[key] not in MODEL_NAMES:
            raise ConfigError(f"config key '{key}' = {v[key]!r} is not one of: {', '.join(MODEL_NAMES)}")
    for name in client_model_names(v):
        if name not in MODEL_NAMES:
            raise ConfigError(
                f"config key 'client-models' = {v['client-models']!r} names {name!r}, not one of: "
                f"{', '.join(MODEL_NAMES)}"
            )
    mixed = len(set(client_model_names(v))) > 1
    spec = CATALOG[v.method]
    if mixed and not spec.mixed_models and spec.backbone != "clip-text":
        raise ConfigError(
            f"config key 'client-models' = {v['client-models']!r} mixes architectures, but method "
            f"'{v['method']}' averages whole models; use one of: {', '.join(methods_where(mixed_models=True))}"
        )


def _check_data_paths(v: RunConfig) -> None:
    dataset = v.dataset
    if dataset == "imagefolder" and not v.data_dir:
        raise ConfigError("config key 'data-dir' is empty; dataset 'imagefolder' needs a folder or .tar.gz")
    if dataset == "hf" and not v.hf_name:
        raise ConfigError("config key 'hf-name' is empty; dataset 'hf' needs a Hugging Face dataset name")
    if v.test_data_dir and dataset == "digits":
        raise ConfigError("config key 'test-data-dir' is set, but dataset 'digits' has no separate test split")
    for key in ("data-dir", "test-data-dir"):
        path = str(v[key])
        if path and dataset != "hf" and not Path(path).expanduser().exists():
            if key == "data-dir" and dataset in ("cifar10", "cifar100") and v.download:
                continue  # torchvision will create and fill it
            raise ConfigError(f"config key '{key}' = {path!r}: path does not exist")


def parse_local_split(text: str) -> tuple[float, float, float]:
    """``"0.75,0,0.25"`` -> ``(0.75, 0.0, 0.25)``: three shares in [0, 1] summing to 1, train above 0."""
    items = [item.strip() for item in str(text).split(",")]
    try:
        shares = tuple(float(item) for item in items)
    except ValueError:
        shares = ()
    if len(shares) != 3 or not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in shares):
        raise ConfigError(f"config key 'local-split' = {text!r} must be three shares train,val,test (e.g. 0.8,0.1,0.1)")
    if abs(sum(shares) - 1.0) > 1e-6 or shares[0] <= 0.0:
        raise ConfigError(f"config key 'local-split' = {text!r} must sum to 1 with a positive train share")
    return shares  # type: ignore[return-value]


def _check_reserve(v: RunConfig) -> None:
    parse_local_split(v.local_split)
    pretrain, test = v.reserve_pretrain, v.reserve_test
    for key, share in (("reserve-pretrain", pretrain), ("reserve-test", test)):
        if share >= 1.0:
            raise ConfigError(f"config key '{key}' = {share!r} must be < 1")
    if pretrain + test >= 1.0:
        raise ConfigError(
            f"config keys 'reserve-pretrain' + 'reserve-test' = {pretrain + test:g} leave no data for the clients"
        )
    if test and v.test_data_dir:
        raise ConfigError(
            "config keys 'reserve-test' and 'test-data-dir' both name the clients' test pool; set one of them"
        )
    if (pretrain or test) and (v.dataset == "domains" or v.synthetic_domains):
        raise ConfigError("config keys 'reserve-pretrain'/'reserve-test' apply to single-domain sources only")


def _check_clients(v: RunConfig) -> None:
    if v.min_clients > v.num_partitions:
        raise ConfigError(
            f"config key 'min-clients' = {v['min-clients']} is more than 'num-partitions' = {v['num-partitions']}"
        )


def _check_aggregation(v: RunConfig) -> None:
    rule = v.aggregation
    if v.trim_fraction >= 0.5:
        raise ConfigError(
            f"config key 'trim-fraction' = {v['trim-fraction']!r} must be < 0.5 (it is cut from each end)"
        )
    if rule == "mean":
        return
    spec = CATALOG[v.method]
    if not spec.averages_parameters:
        raise ConfigError(
            f"config key 'aggregation' = {rule!r} applies to methods that average a shared model "
            f"({', '.join(methods_where(averages_parameters=True))}); {v['method']!r} {spec.uploads_note}"
        )
    if v.secagg:
        raise ConfigError(
            f"config key 'aggregation' = {rule!r} needs each client's update, but secagg = true shows the server "
            "only their sum: use one of them"
        )
    sampled = max(v.min_clients, math.floor(v.fraction_fit * v.num_partitions))
    needed = min_updates(rule, v.byzantine_clients)
    if sampled < needed:
        raise ConfigError(
            f"config key 'aggregation' = {rule!r} with byzantine-clients = {v['byzantine-clients']} needs at least "
            f"{needed} updates a round, but a round samples about {sampled} clients (num-partitions x fraction-fit)"
        )


def _check_secagg(v: RunConfig) -> None:
    if v.secagg:
        check_secagg_config(v)


def _check_dp(v: RunConfig) -> None:
    if v.dp_delta >= 1:
        raise ConfigError(f"config key 'dp-delta' = {v['dp-delta']!r} must be < 1")
    if v.dp != "off":
        check_dp_config(v)


def _check_local_prompt_lengths(v: RunConfig) -> None:
    """Text prompts must fit the text tower: start token, prompt, at least one
    class-name token and the end token within the model's context length."""
    if CATALOG[v.method].backbone != "clip-text":
        return
    from fedapp.errors import ModelError  # noqa: PLC0415
    from fedapp.models.clip import text_context_length  # noqa: PLC0415 - open_clip only for CLIP methods

    lengths = {"prompt-length": [v.prompt_length]}
    if v.method == "sdfed":
        from fedapp.methods.sdfed import parse_local_lengths  # noqa: PLC0415 - torch only when needed

        drawn = parse_local_lengths(v.local_prompt_lengths, v.num_partitions, v.seed)
        lengths["local-prompt-lengths"] = drawn
    models = client_clip_model_names(v)
    try:
        rooms = {model: text_context_length(model) - 3 for model in set(models)}
    except ModelError:
        return  # an unknown model is reported where it is loaded, with its own message
    for client in range(v.num_partitions):
        model = models[client % len(models)]
        room = rooms[model]
        for key, values in lengths.items():
            length = values[client % len(values)]
            if length > room:
                raise ConfigError(
                    f"config key '{key}' = {v[key]!r} gives client {client} a prompt of {length} tokens, but "
                    f"{model!r} reads {room + 3} text tokens (start, prompt, class name, end): use at most {room}, "
                    "or a model with a longer context (ViT-B-16: 77)"
                )


def _check_run_name(v: RunConfig) -> None:
    """A run name is one folder inside ``results-dir`` (and ``state-dir``): no path, so that whoever
    names a run cannot make the server or a node write outside the folders chosen for them."""
    name = v.run_name
    if not name:
        return
    bad = [part for part in ("/", "\\", "\0") if part in name]
    if bad or name in (".", "..") or name != name.strip() or Path(name).is_absolute():
        raise ConfigError(
            f"config key 'run-name' = {name!r} must be a single folder name (no '/', '\\', '..' or surrounding "
            "spaces): runs are written to results-dir/<run-name>"
        )


# The masks of SecAgg+ are drawn from [0, MODULUS_RANGE); Flower's largest (and default) choice.
MODULUS_RANGE = 2**32


def check_dp_config(v: RunConfig) -> None:
    """Refuse DP for a method whose uploads are not parameters the server averages."""
    method = v.method
    spec = CATALOG[method]
    if not spec.averages_parameters:
        raise ConfigError(
            f"config key 'dp' = {v['dp']!r}: method {method!r} {spec.uploads_note}. Client-level DP here covers the "
            f"methods whose server averages parameters: {', '.join(methods_where(averages_parameters=True))}"
        )
    if v.secagg:
        raise ConfigError(
            f"config keys 'dp' = {v['dp']!r} and 'secagg' = true cannot be combined yet: SecAgg+ averages the "
            "uploads weighted by example counts on the clients, while the DP noise is calibrated to a uniform "
            "average of clipped updates (each client moving it by at most C / clients)"
        )


def check_secagg_config(v: RunConfig) -> None:
    """The rules of a run with ``secagg = true`` (a ConfigError names the broken one)."""
    method = v.method
    spec = CATALOG[method]
    if not spec.averages_parameters:
        raise ConfigError(
            f"config key 'secagg' = true: method '{method}' cannot use secure aggregation, because it "
            f"{spec.uploads_note}; methods that can: {', '.join(methods_where(averages_parameters=True))}"
        )
    if v.resume:
        raise ConfigError(
            "config keys 'secagg' = true and 'resume' = true: resuming a run under secure aggregation is not "
            "supported; start the run afresh (or resume with secagg = false)"
        )
    min_clients = v.min_clients
    if min_clients < 2:
        raise ConfigError(
            f"config key 'min-clients' = {min_clients}: secure aggregation needs at least 2 clients per round "
            "(one client's 'sum' would be its own upload); set min-clients >= 2"
        )
    shares = v.secagg_num_shares
    if shares > 1 and (shares != int(shares) or shares < 3):
        raise ConfigError(
            f"config key 'secagg-num-shares' = {v['secagg-num-shares']}: a value > 1 is a number of shares and "
            "must be a whole number >= 3 (a value <= 1 is a share of the round's clients; 1.0 = all of them)"
        )
    threshold = v.secagg_reconstruction_threshold
    if threshold > 1:
        if threshold != int(threshold):
            raise ConfigError(
                f"config key 'secagg-reconstruction-threshold' = {v['secagg-reconstruction-threshold']}: a value "
                "> 1 is a number of shares and must be a whole number (a value <= 1 is a fraction of the shares)"
            )
        if shares > 1 and threshold >= shares:
            raise ConfigError(
                f"config key 'secagg-reconstruction-threshold' = {int(threshold)} must be less than "
                f"'secagg-num-shares' = {int(shares)}"
            )
        if threshold > min_clients:
            raise ConfigError(
                f"config key 'secagg-reconstruction-threshold' = {int(threshold)} is more than 'min-clients' = "
                f"{min_clients}: a round with min-clients participants could never unmask its sum"
            )
    levels = v.secagg_quantization_range
    clients = v.num_partitions
    if levels * clients >= MODULUS_RANGE:
        raise ConfigError(
            f"config key 'secagg-quantization-range' = {levels}: times 'num-partitions' = {clients} it reaches "
            f"the modulus 2**32, so the masked sum could overflow; lower it below {MODULUS_RANGE // clients}"
        )


_CROSS_RULES: tuple[Callable[[RunConfig], None], ...] = (
    _check_run_name,
    _check_local_prompt_lengths,
    _check_classes_per_client,
    _check_model,
    _check_data_paths,
    _check_reserve,
    _check_clients,
    _check_domains,
    _check_held_out,
    _check_base_to_novel,
    _check_vision_tower,
    _check_dp,
    _check_secagg,
    _check_aggregation,
)
