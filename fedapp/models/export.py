"""Exported models: named tensors in safetensors files, with what is needed to rebuild them.

A run with ``export-models = true`` leaves, in ``<run folder>/models/``:

* ``global.safetensors``: the server's global arrays under the names of the module
  they come from (and the method's server-side state, e.g. FedD2P's prompt
  generator), rewritten after every round with the checkpoint;
* ``client-<partition id>.safetensors``: the module each client's reported accuracy is
  measured on, without the frozen backbone's tensors, rewritten at every evaluation.

Every file's safetensors metadata (strings) says what it is: ``format``, ``kind``
(``global`` or ``client``), ``method``, ``round``, ``class_names`` (JSON, in label
order), ``num_classes`` and ``config`` (the run configuration as JSON); client files
add ``partition_id`` and ``architecture``, the global file ``arrays`` (the global
arrays' names, in order) and ``server_state``. :func:`fedapp.inference.load_model`
reads them back. Writes are atomic (a temporary file, then a rename). Nothing here
imports Flower.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from fedapp.errors import ModelError


class ExportSettings(Protocol):
    """The run settings export reads (a :class:`fedapp.config.RunConfig` has them)."""

    export_models: bool
    results_dir: str
    state_dir: str

    @property
    def resolved_run_name(self) -> str: ...

    @property
    def values(self) -> dict[str, Any]: ...


log = logging.getLogger("flwr.fedapp")

FORMAT = "fedapp-model/1"
"""The ``format`` metadata of every file this module writes."""
MODELS_DIR = "models"
"""The folder of a run (or of a node's run state) that holds the exported models."""
GLOBAL_FILE = "global.safetensors"
"""The server's global arrays and state."""


def client_file(partition_id: int) -> str:
    """File name of client ``partition_id``'s exported model."""
    return f"client-{int(partition_id)}.safetensors"


@dataclass(frozen=True)
class ModelFile:
    """One exported file, read back: its tensors by name and its metadata."""

    path: Path
    tensors: dict[str, Tensor]
    metadata: dict[str, str]

    def field(self, key: str) -> str:
        """A metadata value; a ModelError names the file when it lacks ``key``."""
        if key not in self.metadata:
            raise ModelError(f"{self.path} has no {key!r} in its metadata; it was not written by fedapp's export")
        return self.metadata[key]

    def json_field(self, key: str) -> Any:
        """A metadata value stored as JSON (class names, array names, the run config)."""
        try:
            return json.loads(self.field(key))
        except json.JSONDecodeError as err:
            raise ModelError(f"{self.path}: metadata {key!r} is not valid JSON ({err})") from err


def model_metadata(
    kind: str, config_values: Mapping[str, Any], server_round: int, class_names: Sequence[str], **fields: Any
) -> dict[str, str]:
    """The metadata of an exported file: what every file says, plus ``fields``
    (strings kept as they are, anything else as JSON)."""
    metadata = {
        "format": FORMAT,
        "kind": kind,
        "method": str(config_values["method"]),
        "round": str(int(server_round)),
        "class_names": json.dumps(list(class_names)),
        "num_classes": str(len(class_names)),
        "config": json.dumps(dict(config_values), sort_keys=True),
    }
    metadata.update({key: value if isinstance(value, str) else json.dumps(value) for key, value in fields.items()})
    return metadata


def write_model_file(path: Path, tensors: Mapping[str, Tensor], metadata: Mapping[str, str]) -> Path:
    """Write ``tensors`` with ``metadata`` to ``path`` atomically; returns ``path``.

    Raises
    ------
    ModelError
        If the folder cannot be created or the file cannot be written (the message names the path).
    """
    path = Path(path)
    # Own CPU copies: safetensors refuses tensors that share memory, and CUDA tensors.
    owned = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in tensors.items()}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        save_file(owned, tmp, metadata=dict(metadata))
        os.replace(tmp, path)
    except (OSError, SafetensorError) as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise ModelError(f"cannot write exported model {path} ({getattr(err, 'strerror', None) or err})") from err
    return path


def read_model_file(path: Path) -> ModelFile:
    """Read one exported file.

    Raises
    ------
    ModelError
        If the file is missing (the message lists the exported files beside it),
        unreadable, or not one this module wrote.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"no exported model {path}: {exported_files_note(path.parent)}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 - not a dict
    except (OSError, SafetensorError) as err:
        raise ModelError(f"{path} is not a readable safetensors file ({err})") from err
    found = metadata.get("format")
    if found != FORMAT:
        raise ModelError(f"{path} is not a fedapp model export (format {found!r}, expected {FORMAT!r})")
    return ModelFile(path=path, tensors=tensors, metadata=metadata)


def exported_files_note(folder: Path) -> str:
    """What ``folder`` holds, for an error about a file that is not there."""
    if not folder.is_dir():
        return (
            f"there is no folder {folder} (a run exports its models there when export-models = true "
            "and its run folder is written)"
        )
    names = sorted(p.name for p in folder.iterdir() if p.suffix == ".safetensors")
    return f"{folder} holds {', '.join(names)}" if names else f"{folder} holds no exported model"


def _storages(module: nn.Module | None) -> set[int]:
    if module is None:
        return set()
    state = module.state_dict(keep_vars=True)
    return {tensor.untyped_storage().data_ptr() for tensor in state.values()}


def module_tensors(module: nn.Module, frozen: nn.Module | None = None) -> dict[str, Tensor]:
    """``module``'s named parameters and buffers (its ``state_dict``), leaving out every
    tensor that shares memory with ``frozen``'s (a frozen backbone rebuilt from the run
    configuration: an export would only copy it)."""
    shared = _storages(frozen)
    return {
        name: tensor
        for name, tensor in module.state_dict().items()
        if tensor.untyped_storage().data_ptr() not in shared or tensor.numel() == 0
    }


def load_module_tensors(module: nn.Module, model_file: ModelFile, frozen: nn.Module | None = None) -> None:
    """Load ``model_file``'s tensors into ``module``, strictly: the file must hold exactly the
    tensors :func:`module_tensors` gives for ``module`` (``frozen`` left out), each of the same shape.

    Raises
    ------
    ModelError
        Naming the file and the tensors that are missing, unexpected or of another shape.
    """
    expected = module_tensors(module, frozen)
    held = model_file.tensors
    missing, unexpected = sorted(set(expected) - set(held)), sorted(set(held) - set(expected))
    shapes = [
        f"{name} {tuple(held[name].shape)} (the model's is {tuple(tensor.shape)})"
        for name, tensor in expected.items()
        if name in held and tuple(held[name].shape) != tuple(tensor.shape)
    ]
    problems = [
        *([f"missing {missing[:5]}"] if missing else []),
        *([f"not the model's {unexpected[:5]}"] if unexpected else []),
        *([f"other shapes: {', '.join(shapes[:5])}"] if shapes else []),
    ]
    if problems:
        raise ModelError(
            f"{model_file.path} does not fit the {type(module).__name__} its run configuration builds: "
            + "; ".join(problems)
        )
    with torch.no_grad():
        for name, tensor in expected.items():
            tensor.copy_(held[name].to(dtype=tensor.dtype))


def global_model_tensors(
    names: Sequence[str], arrays: Sequence[np.ndarray], state: Mapping[str, np.ndarray]
) -> dict[str, Tensor]:
    """The global arrays under ``names`` and the server's ``state`` arrays, as one mapping.

    Raises
    ------
    ModelError
        If there are not as many names as arrays, or a name is given twice.
    """
    if len(names) != len(arrays):
        raise ModelError(f"{len(names)} names for {len(arrays)} global arrays")
    clash = sorted(set(names) & set(state))
    if clash or len(set(names)) != len(names):
        raise ModelError(f"global array names are not unique: {clash or sorted(names)}")
    pairs = [*zip(names, arrays, strict=True), *state.items()]
    return {name: torch.from_numpy(np.array(array)) for name, array in pairs}


class GlobalModelSource(Protocol):
    """What :func:`export_global_model` reads from a server strategy."""

    config: ExportSettings
    class_names: tuple[str, ...]

    @property
    def global_arrays(self) -> list[np.ndarray]: ...

    def global_array_names(self) -> list[str]: ...


def export_global_model(
    source: GlobalModelSource, run_dir: Path, server_round: int, state: Mapping[str, np.ndarray]
) -> Path | None:
    """Write ``run_dir/models/global.safetensors``: the global arrays of ``source`` under
    its :meth:`~GlobalModelSource.global_array_names`, in order (the ``arrays``
    metadata), and the server's ``state`` (``server_state``).

    Nothing is written with ``export-models = false``, or when the method keeps
    neither (it shares nothing). A write error is logged as a warning and not raised:
    the run and its checkpoint go on.

    Returns
    -------
    Path or None
        The file written, or None.
    """
    arrays = source.global_arrays
    if not source.config.export_models or (not arrays and not state):
        return None
    names = source.global_array_names()
    path = Path(run_dir) / MODELS_DIR / GLOBAL_FILE
    values, classes = source.config.values, source.class_names
    metadata = model_metadata("global", values, server_round, classes, arrays=list(names), server_state=sorted(state))
    try:
        return write_model_file(path, global_model_tensors(names, arrays, state), metadata)
    except ModelError as err:
        log.warning("round %d: the global model was not exported: %s", server_round, err)
        return None


def client_model_path(config: ExportSettings, partition_id: int, *, supernode: bool) -> Path | None:
    """Where a client writes its exported model, or None where it writes none.

    In a simulation (or a script that builds clients itself) the client writes into the
    server's run folder, ``<results-dir>/<run-name>/models/``, when that folder exists
    (a run that records nothing has none, and then nothing is exported). On a
    SuperNode (``supernode``) it writes under the node's own ``<state-dir>/<run-name>/models/``,
    never where a submitted run config says. Nothing with ``export-models = false``.
    """
    if not config.export_models:
        return None
    if supernode:
        root = Path(config.state_dir).expanduser() / config.resolved_run_name
    else:
        root = Path(config.results_dir).expanduser() / config.resolved_run_name
        if not root.is_dir():
            return None
    return root / MODELS_DIR / client_file(partition_id)
