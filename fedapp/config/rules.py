"""Cross-key rules: the checks that tie several keys of a run configuration together.

Each rule takes a :class:`~fedapp.config.run_config.RunConfig` whose keys have
each been checked alone and raises a ConfigError naming the keys and values that
contradict each other. :data:`CROSS_RULES` runs them in a fixed order (so a
configuration with several faults always reports the same one), the rules on how
uploads are combined (:mod:`fedapp.config.aggregation_rules`) last. A rule that
needs a model's shape imports the model code only then, so importing the
configuration stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fedapp.catalog import CATALOG, methods_where
from fedapp.config.aggregation_rules import UPLOAD_RULES
from fedapp.config.derived import client_clip_model_names, client_model_names, held_out_partitions, parse_local_split
from fedapp.config.schema import DATASET_CLASSES, RESERVE_BACKBONE
from fedapp.errors import ConfigError
from fedapp.extras import clip_client_requirements, require_all
from fedapp.options import did_you_mean

if TYPE_CHECKING:
    from fedapp.config.validated import RunConfig


def _check_classes_per_client(config: RunConfig) -> None:
    total = DATASET_CLASSES.get(config.dataset)
    if config.partition == "pathological" and total is not None and config.classes_per_client > total:
        raise ConfigError(
            f"config key 'classes-per-client' = {config.classes_per_client} is more than the "
            f"{total} classes of dataset '{config.dataset}'"
        )


def _check_domains(config: RunConfig) -> None:
    synthetic = config.synthetic_domains
    per_domain = config.clients_per_domain
    if synthetic == 1:
        raise ConfigError("config key 'synthetic-domains' = 1: use 0 (off) or at least 2 domains")
    if synthetic and config.dataset == "domains":
        raise ConfigError(
            "config key 'synthetic-domains' is set, but dataset 'domains' already has domains (its subfolders)"
        )
    if config.test_data_dir and (synthetic or config.partition == "domain"):
        raise ConfigError(
            "config key 'test-data-dir' is set, but with domains each client tests on its own domain's data"
        )
    if config.partition != "domain":
        for key, value, unset in (
            ("clients-per-domain", config.clients_per_domain, 1),
            ("held-out-domain", config.held_out_domain, -1),
        ):
            if value != unset:
                raise ConfigError(f"config key '{key}' = {value} applies only to partition = domain")
        return
    if not synthetic and config.dataset != "domains":
        raise ConfigError(
            f"config key 'partition' = 'domain' needs domains: dataset 'domains' (a folder per domain) or "
            f"'synthetic-domains' >= 2 on dataset {config.dataset!r}"
        )
    if synthetic and config.num_partitions != synthetic * per_domain:
        raise ConfigError(
            f"config key 'num-partitions' = {config.num_partitions}: partition = domain gives each of the "
            f"{synthetic} synthetic domains {per_domain} client(s), so num-partitions must be {synthetic * per_domain}"
        )
    if synthetic and config.held_out_domain >= synthetic:
        raise ConfigError(
            f"config key 'held-out-domain' = {config.held_out_domain} is not a domain index (0..{synthetic - 1})"
        )


def _check_base_to_novel(config: RunConfig) -> None:
    if config.base_to_novel and not CATALOG[config.method].names_unseen_classes:
        raise ConfigError(
            f"config key 'base-to-novel' = true, but method {config.method!r} classifies with a head learned over its "
            f"training classes and cannot name classes it never saw; base-to-novel runs "
            f"{', '.join(methods_where(names_unseen_classes=True))}"
        )


def _check_vision_tower(config: RunConfig) -> None:
    # (a cnn+server-clip backbone is the server's alone: checked there, so edge clients never import open_clip)
    if CATALOG[config.method].backbone != "clip-vision":
        return
    if config.client_clip_models.strip():
        raise ConfigError(
            f"config key 'client-clip-models' = {config.client_clip_models!r}: method '{config.method}' averages "
            "runs one backbone; set 'clip-model' only"
        )
    require_all(clip_client_requirements(config.method))  # the check below imports open_clip
    from fedapp.errors import ModelError  # noqa: PLC0415
    from fedapp.models.vpt import vision_tower_shape  # noqa: PLC0415 - open_clip only when needed

    try:
        vision_tower_shape(config.clip_model)
    except ModelError as err:
        raise ConfigError(f"config key 'clip-model' = {config.clip_model!r}: {err}") from err


def _check_method_options(config: RunConfig) -> None:
    """The method's own keys, by the checks declared with them (:meth:`fedapp.options.MethodOptions.check`)."""
    config.options.check(config.values)


def _check_held_out(config: RunConfig) -> None:
    held = len(held_out_partitions(config))
    training = config.num_partitions - held
    if held and training < config.min_clients:
        raise ConfigError(
            f"config key 'held-out-fraction' = {config.held_out_fraction} holds out {held} of "
            f"{config.num_partitions} clients, leaving {training} to train, fewer than "
            f"min-clients = {config.min_clients}"
        )


def _check_model(config: RunConfig) -> None:
    from fedapp.models import MODEL_NAMES  # noqa: PLC0415 - keeps config import light

    if config.model not in MODEL_NAMES:
        raise ConfigError(
            f"config key 'model' = {config.model!r} is not one of: {', '.join(MODEL_NAMES)}"
            f"{did_you_mean(config.model, MODEL_NAMES)}"
        )
    for name in client_model_names(config):
        if name not in MODEL_NAMES:
            raise ConfigError(
                f"config key 'client-models' = {config.client_models!r} names {name!r}, not one of: "
                f"{', '.join(MODEL_NAMES)}{did_you_mean(name, MODEL_NAMES)}"
            )
    mixed = len(set(client_model_names(config))) > 1
    spec = CATALOG[config.method]
    if mixed and not spec.mixed_models and spec.backbone != "clip-text":
        raise ConfigError(
            f"config key 'client-models' = {config.client_models!r} mixes architectures, but method "
            f"'{config.method}' averages whole models; use one of: {', '.join(methods_where(mixed_models=True))}"
        )


def _check_data_paths(config: RunConfig) -> None:
    dataset = config.dataset
    if dataset == "imagefolder" and not config.data_dir:
        raise ConfigError("config key 'data-dir' is empty; dataset 'imagefolder' needs a folder or .tar.gz")
    if dataset == "hf" and not config.hf_name:
        raise ConfigError("config key 'hf-name' is empty; dataset 'hf' needs a Hugging Face dataset name")
    if config.test_data_dir and dataset == "digits":
        raise ConfigError("config key 'test-data-dir' is set, but dataset 'digits' has no separate test split")
    for key, path in (("data-dir", config.data_dir), ("test-data-dir", config.test_data_dir)):
        if path and dataset != "hf" and not Path(path).expanduser().exists():
            if key == "data-dir" and dataset in ("cifar10", "cifar100") and config.download:
                continue  # torchvision will create and fill it
            raise ConfigError(f"config key '{key}' = {path!r}: path does not exist")


def _check_reserve(config: RunConfig) -> None:
    parse_local_split(config.local_split)
    pretrain, test = config.reserve_pretrain, config.reserve_test
    for key, share in (("reserve-pretrain", pretrain), ("reserve-test", test)):
        if share >= 1.0:
            raise ConfigError(f"config key '{key}' = {share!r} must be < 1")
    if pretrain + test >= 1.0:
        raise ConfigError(
            f"config keys 'reserve-pretrain' + 'reserve-test' = {pretrain + test:g} leave no data for the clients"
        )
    if test and config.test_data_dir:
        raise ConfigError(
            "config keys 'reserve-test' and 'test-data-dir' both name the clients' test pool; set one of them"
        )
    if (pretrain or test) and (config.dataset == "domains" or config.synthetic_domains):
        raise ConfigError("config keys 'reserve-pretrain'/'reserve-test' apply to single-domain sources only")
    if config.pretrained.strip().lower() == RESERVE_BACKBONE and not (pretrain and test):
        raise ConfigError(
            "config key 'pretrained' = 'reserve' pretrains the backbone on the reserve-pretrain share of the data "
            "and scores it on the reserve-test share: set both (e.g. reserve-pretrain=0.3 reserve-test=0.1)"
        )


def _check_clients(config: RunConfig) -> None:
    if config.min_clients > config.num_partitions:
        raise ConfigError(
            f"config key 'min-clients' = {config.min_clients} is more than 'num-partitions' = {config.num_partitions}"
        )


def _check_local_prompt_lengths(config: RunConfig) -> None:
    """Text prompts must fit the text tower: start token, prompt, at least one
    class-name token and the end token within the model's context length."""
    if CATALOG[config.method].backbone != "clip-text":
        return
    require_all(clip_client_requirements(config.method))  # the check below imports open_clip
    from fedapp.errors import ModelError  # noqa: PLC0415
    from fedapp.models.clip import text_context_length  # noqa: PLC0415 - open_clip only for CLIP methods

    # (the keys and their values as set, the prompt length of each client in turn: the method's own)
    lengths = config.options.text_prompt_lengths(config.values)
    models = client_clip_model_names(config)
    try:
        rooms = {model: text_context_length(model) - 3 for model in set(models)}
    except ModelError:
        return  # an unknown model is reported where it is loaded, with its own message
    for client in range(config.num_partitions):
        model = models[client % len(models)]
        room = rooms[model]
        for what, values in lengths:
            length = values[client % len(values)]
            if length > room:
                raise ConfigError(
                    f"{what} gives client {client} a prompt of {length} tokens, but "
                    f"{model!r} reads {room + 3} text tokens (start, prompt, class name, end): use at most {room}, "
                    "or a model with a longer context (ViT-B-16: 77)"
                )


def _check_run_name(config: RunConfig) -> None:
    """A run name is one folder inside ``results-dir`` (and ``state-dir``): no path, so that whoever
    names a run cannot make the server or a node write outside the folders chosen for them (nor
    read another folder's state through ``personal-state-from``)."""
    for key in ("run-name", "personal-state-from"):
        name = config[key]
        bad = [part for part in ("/", "\\", "\0") if part in name]
        if name and (bad or name in (".", "..") or name != name.strip() or Path(name).is_absolute()):
            raise ConfigError(
                f"config key {key!r} = {name!r} must be a single folder name (no '/', '\\', '..' or surrounding "
                "spaces): runs are written to results-dir/<run-name>"
            )
    earlier = config.personal_state_from
    if earlier and config.state != "disk":
        raise ConfigError(
            f"config key 'personal-state-from' = {earlier!r} needs state = \"disk\" (personal state in memory "
            f"ends with its run), got state = {config.state!r}"
        )
    if earlier and earlier == config.resolved_run_name:
        raise ConfigError(
            f"config key 'personal-state-from' = {earlier!r} names this run itself: resume=true continues a run; "
            "personal-state-from starts a new run (another run-name) from an earlier run's personal state"
        )


def resume_loses_personal_state(config: RunConfig) -> bool:
    """Whether resuming ``config``'s run would start its clients without the personal state they
    kept: a method whose clients keep some, in memory, which ends with the run that held it."""
    return CATALOG[config.method].personal_state and config.state == "memory"


def _check_resume(config: RunConfig) -> None:
    if config.resume and resume_loses_personal_state(config):
        raise ConfigError(
            f"config keys 'resume' = true and 'state' = \"memory\": {config.method}'s clients keep personal "
            "state between rounds, and in memory it ended with the stopped run, so a resumed run's clients "
            "would start again from scratch under a server at a later round; resume only a run started "
            'with state = "disk" (the same state-dir), or start this one afresh'
        )


#: The package each experiment tracker imports (all in the ``[tracking]`` extra).
CROSS_RULES: tuple[Callable[[RunConfig], None], ...] = (
    _check_run_name,
    _check_resume,
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
    _check_method_options,
    *UPLOAD_RULES,
)
"""Every cross-key rule, in the order :func:`fedapp.config.validate` runs them."""
