"""Install profiles: which optional package each part of a run needs, and a one-line
refusal naming the extra to install when it is missing.

The base install (``pip install fedapp``) is what a SuperNode needs to run our ClientApp
for the CNN families and FedD2P's edge clients on its own ``data-dir``: flwr, torch,
torchvision, numpy, pyyaml, pillow, safetensors. Everything else is an extra
(``pyproject.toml``): ``[clip]`` the CLIP/ViT client families, ``[data]`` the shared
sources and partitioners, ``[server]`` the ServerApp (data, plots, FedD2P's server
CLIP), ``[simulation]`` Ray and the launcher, ``[tracking]`` MLflow/TensorBoard,
``[all]`` all of them. Each check runs before any work (data loading, model building)
and looks a package up without importing it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Protocol

from fedapp.catalog import CATALOG
from fedapp.errors import ConfigError


class RunSettings(Protocol):
    """The run settings the requirements depend on (a :class:`fedapp.config.RunConfig` has them;
    the config rules import this module, so it names the values, not that type)."""

    method: str
    dataset: str
    partition: str
    clients_per_domain: int
    tracker: str


@dataclass(frozen=True)
class Requirement:
    """One optional package: the module a run imports, its distribution and the extra that installs it."""

    module: str
    distribution: str
    extra: str


OPEN_CLIP = Requirement("open_clip", "open_clip_torch", "clip")
SCIKIT_LEARN = Requirement("sklearn", "scikit-learn", "data")
FLWR_DATASETS = Requirement("flwr_datasets", "flwr-datasets", "data")
HF_DATASETS = Requirement("datasets", "datasets", "data")
MATPLOTLIB = Requirement("matplotlib", "matplotlib", "server")
RAY = Requirement("ray", "ray", "simulation")
MLFLOW = Requirement("mlflow", "mlflow", "tracking")
TENSORBOARD = Requirement("tensorboard", "tensorboard", "tracking")

TRACKERS = {"mlflow": MLFLOW, "tensorboard": TENSORBOARD}
"""The package each ``tracker`` value needs."""


class MissingExtraError(ConfigError):
    """A run needs an optional package that this install lacks."""


def installed(requirement: Requirement) -> bool:
    """Whether ``requirement``'s module can be imported here (looked up, not imported)."""
    return importlib.util.find_spec(requirement.module) is not None


def require(requirement: Requirement, needed_by: str) -> None:
    """Refuse, in one line naming the extra, when ``requirement`` is not installed.

    Parameters
    ----------
    requirement
        The optional package.
    needed_by
        What needs it, as the start of the message (``"method 'sdfed' (a CLIP text-prompt client)"``).

    Raises
    ------
    MissingExtraError
        If the package is missing.
    """
    if not installed(requirement):
        raise MissingExtraError(
            f"{needed_by} needs {requirement.distribution}, which this install lacks: "
            f"pip install 'fedapp[{requirement.extra}]' (or -e '.[{requirement.extra}]' in a checkout)"
        )


def source_requirements(config: RunSettings, partitioned: bool = True) -> list[tuple[Requirement, str]]:
    """What loading the configured source needs and, when ``partitioned``, splitting it among
    the clients (a node on its own ``data-dir`` uses all of it: an ImageFolder needs only pillow)."""
    needs: list[tuple[Requirement, str]] = []
    if config.dataset == "digits":
        needs.append((SCIKIT_LEARN, "dataset 'digits'"))
    if config.dataset == "hf":
        needs += [(HF_DATASETS, "dataset 'hf'"), (FLWR_DATASETS, "dataset 'hf'")]
    elif partitioned and (config.partition != "domain" or config.clients_per_domain > 1):
        needs.append((FLWR_DATASETS, f"partition {config.partition!r}"))
    return needs


def client_requirements(config: RunSettings, own_data_dir: bool) -> list[tuple[Requirement, str]]:
    """What a client of ``config.method`` needs beyond the base install.

    ``own_data_dir``: the node reads its own files (node config ``data-dir``) rather than
    its partition of the configured source.
    """
    return clip_client_requirements(config.method) + source_requirements(config, partitioned=not own_data_dir)


def clip_client_requirements(method: str) -> list[tuple[Requirement, str]]:
    """open_clip, for a method whose clients run a CLIP text or ViT backbone (none else)."""
    backbone = CATALOG[method].backbone
    if backbone not in ("clip-text", "clip-vision"):
        return []
    kind = "CLIP text-prompt" if backbone == "clip-text" else "ViT visual-prompt"
    return [(OPEN_CLIP, f"method {method!r} (a {kind} client)")]


def server_requirements(config: RunSettings) -> list[tuple[Requirement, str]]:
    """What the ServerApp of ``config`` needs: the source (it checks and partitions the data
    before round 1), plots, a server-side CLIP and the tracker."""
    needs = [*source_requirements(config), (MATPLOTLIB, "the run's plots")]
    backbone = CATALOG[config.method].backbone
    if backbone != "cnn":
        needs.append((OPEN_CLIP, f"the server of method {config.method!r} (it builds CLIP)"))
    if config.tracker in TRACKERS:
        needs.append((TRACKERS[config.tracker], f"config key 'tracker' = {config.tracker!r}"))
    return needs


def require_all(needs: list[tuple[Requirement, str]]) -> None:
    """:func:`require` each of ``needs``, the first missing one refused."""
    for requirement, needed_by in needs:
        require(requirement, needed_by)


def check_server_extras(config: RunSettings) -> None:
    """Refuse a ServerApp start that would fail later for want of an extra (:func:`server_requirements`)."""
    require_all(server_requirements(config))


def check_client_extras(config: RunSettings, own_data_dir: bool) -> None:
    """Refuse to build a client that would fail for want of an extra (:func:`client_requirements`)."""
    require_all(client_requirements(config, own_data_dir))
