"""The run-configuration schema: every key a run accepts, its type, default and allowed range.

:class:`Settings` declares the keys every run reads, each once, as a typed dataclass field
built with :func:`~fedapp.options.setting`; each method declares the keys of its own mechanism
beside its math (:attr:`fedapp.catalog.MethodSpec.options`). :data:`SCHEMA` (what
:func:`fedapp.config.validate` checks), the defaults ``pyproject.toml`` declares
(:func:`defaults`) and the configuration reference in the docs (:mod:`fedapp.config.reference`)
are all derived from the two. The value sets the keys draw from (datasets, partitions,
devices ...) live here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedapp.aggregation import AGGREGATION_RULES
from fedapp.catalog import CATALOG, CATALOG_PROBLEMS, METHODS
from fedapp.options import Key, Scalar, declared_keys, setting

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


# Why a method cannot run, by its name: the catalog's problems, and a method whose own keys
# would take the name of a key every run reads (filled in below, once Settings is made).
METHOD_PROBLEMS: dict[str, str] = dict(CATALOG_PROBLEMS)


@dataclass(frozen=True)
class Settings:
    """Every key every run reads, as a typed attribute (a method's own keys are its options').

    A key ``num-rounds`` is the attribute ``num_rounds``. :data:`SCHEMA` (validation),
    the defaults ``pyproject.toml`` declares and the configuration reference in the
    docs are derived from these fields and the methods' options (tests keep them in step).
    """

    preset: str = setting("", "YAML file of key: value pairs layered under explicit overrides")
    method: str = setting("fedavg", "federated method", choices=METHODS, unavailable=METHOD_PROBLEMS)
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
    model: str = setting("cnn-1", "model name from the zoo", names="zoo-model")
    client_models: str = setting(
        "", "comma list of zoo models cycled over clients (client k: entry k mod len)", names="zoo-models"
    )
    pretrained: str = setting(
        "", 'open_clip pretrained tag, local checkpoint path, or "reserve" (made from reserve-pretrain on first use)'
    )
    clip_model: str = setting("fedapp-tiny-clip", "open_clip model of the CLIP methods")
    client_clip_models: str = setting("", "comma list of open_clip models cycled over clients (model heterogeneity)")
    precision: str = setting("fp32", "precision of the frozen encoders", choices=("fp32", "fp16", "bf16"))
    shots_per_class: int = setting(0, "training samples per class on each client (0 = all)", low=0)
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


COMMON_KEYS: dict[str, Key] = declared_keys(Settings)
"""The keys every run reads, by config name (``num-rounds``), in :class:`Settings`' order."""


def _method_keys() -> dict[str, Key]:
    """Every method's own keys, in catalog order, each as its first method declares it (the catalog
    has checked that every other declaration agrees on its type, default and range)."""
    keys: dict[str, Key] = {}
    for name, spec in CATALOG.items():
        declared = spec.options.config_keys()
        taken = [key for key in declared if key in COMMON_KEYS]
        if taken:
            METHOD_PROBLEMS[name] = f"method {name!r} declares key {taken[0]!r}, which every run reads already"
            continue
        for key, declaration in declared.items():
            keys.setdefault(key, declaration)
    return keys


METHOD_KEYS: dict[str, Key] = _method_keys()
"""The keys of the methods' own mechanisms (:attr:`fedapp.catalog.MethodSpec.options`), by config name."""

SCHEMA: dict[str, Key] = {**COMMON_KEYS, **METHOD_KEYS}
"""Every key a run accepts, by its config name (``num-rounds``): the common keys, then the methods'."""


def defaults() -> dict[str, Scalar]:
    """Return the default value of every key (what pyproject.toml declares)."""
    return {name: key.default for name, key in SCHEMA.items()}
