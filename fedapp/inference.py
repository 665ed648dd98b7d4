"""Load a finished run's exported models for inference: :func:`load_model` (also
``fedapp.load_model``) and :func:`prepare_images`.

A run with ``export-models = true`` leaves ``models/global.safetensors`` and
``models/client-<id>.safetensors`` in its folder (:mod:`fedapp.models.export`).
Loading rebuilds the module a client tests, with the client's own class and no
data: the method's client builds it from the global arrays (their shapes from the
method's strategy) and its personal state, and the exported tensors are loaded into
it, strictly. The frozen CLIP backbone is rebuilt from the run's ``clip-model`` and
``pretrained`` (random-init backbones are drawn from a seed of their name, so they
come back identical; a checkpoint or pretrained tag must still be reachable).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import yaml
from torch import nn

from fedapp.clientdata import ClientData, LabelledImages
from fedapp.config import RunConfig, validate, with_defaults
from fedapp.config.key_groups import NOT_SETTINGS, STORAGE_KEYS
from fedapp.errors import ModelError
from fedapp.models.export import (
    GLOBAL_FILE,
    MODELS_DIR,
    ModelFile,
    client_file,
    exported_files_note,
    load_module_tensors,
    read_model_file,
)
from fedapp.registry import client_class, method_spec, strategy_class
from fedapp.state import MemoryStateStore

if TYPE_CHECKING:
    from fedapp.clients.base import FedAppClient

__all__ = ["load_model", "prepare_images", "run_config"]


def load_model(run_dir: str | Path, client: int | None = None, *, device: str = "cpu") -> nn.Module:
    """The trained model of a run, ready for inference (``eval()`` mode, on ``device``).

    Parameters
    ----------
    run_dir
        The run folder (``<results-dir>/<run-name>``), or a SuperNode's
        ``<state-dir>/<run-name>`` (its client files carry the run configuration).
    client
        A partition id: that client's model, the one its reported ``accuracy`` was
        measured on (its personal model, prompt or adapter with what it received).
        None: the global model, for methods whose global state alone serves a client
        (fedavg, promptfl, head-fedavg, fedvpt, fedvpt-d, pep-fedpt).
    device
        Where the model (and a CLIP backbone) is placed.

    Returns
    -------
    nn.Module
        Takes :func:`prepare_images` of uint8 images, returns logits over the run's classes
        (the ``class_names`` of the file's metadata, in label order). Zoo CNNs take
        normalised images; text-prompt models take images for the frozen CLIP and hold
        the prompt classifier as ``.classifier`` (which takes image features);
        visual-prompt models are the prompted ViT.

    Raises
    ------
    ModelError
        If the file is missing (the message lists those there are), does not fit the
        model the run configuration builds, or the method has no global model
        (then it says to pass ``client=``).
    """
    run = Path(run_dir).expanduser()
    cuda = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    # Building draws (and then overwrites) initial weights: the caller's random streams stay as they were.
    with torch.random.fork_rng(devices=cuda):
        return _load(run, _checked_client(client), torch.device(device))


def prepare_images(run_dir: str | Path, images: np.ndarray, client: int | None = None) -> torch.Tensor:
    """``(N, H, W, 3)`` uint8 RGB images as the input of :func:`load_model`'s model of
    ``client`` (None: the global model), on the CPU.

    Zoo CNNs: ``(x / 255 - 0.5) / 0.5`` at the run's ``image-size`` (resized bilinearly
    if the images have another size). CLIP models: normalised with the backbone's mean
    and standard deviation; text-prompt models at the backbone's input size,
    visual-prompt models at the images' own size (the prompted ViT resizes them).
    """
    run = Path(run_dir).expanduser()
    client = _checked_client(client)
    path = _model_path(run, client)
    config = _run_config(run, path)
    class_names = tuple(read_model_file(path).json_field("class_names"))
    with torch.random.fork_rng(devices=[]):
        return _client(config, client or 0, class_names, torch.device("cpu")).input_batch(np.asarray(images))


def _checked_client(client: int | None) -> int | None:
    if client is None:
        return None
    if isinstance(client, bool) or not isinstance(client, int | np.integer) or client < 0:
        raise ModelError(f"client must be a partition id (an integer >= 0) or None, not {client!r}")
    return int(client)


def _model_path(run: Path, client: int | None) -> Path:
    return run / MODELS_DIR / (GLOBAL_FILE if client is None else client_file(client))


def _load(run: Path, client: int | None, device: torch.device) -> nn.Module:
    path = _model_path(run, client)
    config = _run_config(run, path)
    note = method_spec(config.method).new_client_note
    if client is None and note:
        raise ModelError(
            f"{config.method} has no global model that predicts on its own ({note}): pass client=<partition id> "
            f"to load a client's model; {exported_files_note(run / MODELS_DIR)}"
        )
    model_file = read_model_file(path)
    _check_file(model_file, config, client)
    class_names = tuple(model_file.json_field("class_names"))
    builder = _client(config, client or 0, class_names, device)
    arrays = _global_arrays(config, class_names, model_file if client is None else None)
    module = builder.inference_module(arrays)
    if client is not None:
        load_module_tensors(module, model_file, builder.frozen_backbone())
    return module.to(device).eval()


def run_config(run_dir: str | Path) -> RunConfig:
    """The configuration a run folder's ``config.yaml`` holds (e.g. to load a client's
    data with :func:`fedapp.clientdata.load_client_data`).

    Raises
    ------
    ModelError
        If the folder has no ``config.yaml``.
    """
    config_file = Path(run_dir).expanduser() / "config.yaml"
    if not config_file.is_file():
        raise ModelError(f"{config_file.parent} is not a run folder: it has no config.yaml")
    # Not resolve_run_config: the values are already resolved, and re-applying their preset
    # would undo an explicit override back to a default.
    return validate(with_defaults(yaml.safe_load(config_file.read_text()) or {}))


def _run_config(run: Path, path: Path) -> RunConfig:
    """The run folder's ``config.yaml``, else the configuration the exported file carries
    (a SuperNode's folder has no ``config.yaml``)."""
    if (run / "config.yaml").is_file():
        return run_config(run)
    if not path.is_file():
        raise ModelError(f"{run} has no config.yaml and no {path.name}: {exported_files_note(path.parent)}")
    return validate(with_defaults(read_model_file(path).json_field("config")))


def _check_file(model_file: ModelFile, config: RunConfig, client: int | None) -> None:
    kind, method = model_file.field("kind"), model_file.field("method")
    if method != config.method:
        raise ModelError(f"{model_file.path} holds a {method} model, but the run's method is {config.method}")
    expected = "global" if client is None else "client"
    if kind != expected:
        raise ModelError(f"{model_file.path} holds a {kind} model, not a {expected} one")
    if client is not None and model_file.field("partition_id") != str(client):
        raise ModelError(f"{model_file.path} holds client {model_file.field('partition_id')}'s model, not {client}'s")
    written = validate(with_defaults(model_file.json_field("config"))).values
    for key in sorted(set(written) | set(config.values)):
        if key not in WHERE_NOT_WHAT and written.get(key) != config.values.get(key):
            raise ModelError(
                f"{model_file.path} was written by another run (its {key} is {written.get(key)!r}, this run's "
                f"{config.values.get(key)!r}): it does not fit the run, so it is not loaded"
            )


#: Keys that say where or how a run was kept, not what it computed: a model file and its run may differ in them
#: (the seed and the run's name they may not: another seed's file is another run's).
WHERE_NOT_WHAT = (NOT_SETTINGS | STORAGE_KEYS) - {"seed", "run-name"}


def _client(config: RunConfig, partition_id: int, class_names: tuple[str, ...], device: torch.device) -> FedAppClient:
    """The method's client for ``partition_id``, with no data and an empty in-memory store."""
    size = config.image_size
    empty = LabelledImages(images=np.zeros((0, size, size, 3), np.uint8), labels=np.zeros(0, np.int64))
    splits = {split: empty for split in ("train", "val", "test")}
    data = ClientData(partition_id=partition_id, splits=splits, class_names=class_names)
    return client_class(config.method)(config, data, MemoryStateStore({}), device)


def _global_arrays(config: RunConfig, class_names: tuple[str, ...], global_file: ModelFile | None) -> list[np.ndarray]:
    """The global arrays the client builds its module from: the exported ones (``global_file``),
    or, where the client's own file replaces every tensor, the strategy's initial ones (shapes only)."""
    strategy = strategy_class(config.method)(config, len(class_names), None, class_names)
    initial = strategy.initial_arrays()
    strategy.global_arrays = initial
    if global_file is None:
        return initial
    names = strategy.global_array_names()
    stored = global_file.json_field("arrays")
    if stored != names or any(name not in global_file.tensors for name in names):
        raise ModelError(f"{global_file.path} holds global arrays {stored}, but {config.method} builds {names}")
    arrays = [global_file.tensors[name].numpy() for name in names]
    shapes = [(name, a.shape, b.shape) for name, a, b in zip(names, arrays, initial, strict=True) if a.shape != b.shape]
    if shapes:
        raise ModelError(f"{global_file.path}: global arrays of other shapes than the run builds: {shapes[:3]}")
    return arrays
