"""What every method's client shares: its data, its personal state, one train loop."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from flwr.client import NumPyClient
from torch import nn

from fedapp.aggregation import Arrays
from fedapp.clientdata import ClientData
from fedapp.config import RunConfig, client_model_names
from fedapp.data.tensors import to_float_tensor
from fedapp.errors import ModelError
from fedapp.models import seeded_model
from fedapp.models.export import client_model_path, model_metadata, module_tensors, write_model_file
from fedapp.options import MethodOptions
from fedapp.params import named_arrays_to_state, state_to_named_arrays
from fedapp.state import StateStore, on_supernode
from fedapp.training import EvalResult, LossFn, TensorData, TrainResult, cross_entropy_loss, evaluate, train

log = logging.getLogger("flwr.fedapp")


def derived_seed(*parts: int) -> int:
    """A 31-bit seed that depends only on ``parts`` (not on Python's hash salt)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class FedAppClient(NumPyClient):
    """Base NumPyClient: holds the client's data, store and device.

    Parameters
    ----------
    config
        The validated run configuration.
    data
        This client's train/val/test tensors.
    store
        Where personal state survives between rounds.
    device
        Torch device for local training.
    """

    options: MethodOptions

    def __init__(self, config: RunConfig, data: ClientData, store: StateStore, device: torch.device) -> None:
        self.config = config
        self.options = config.options  # the method's own keys
        self.data = data
        self.store = store
        self.device = device
        self.trained_round: int | None = None  # the round train_model last trained for

    @property
    def partition_id(self) -> int:
        return self.data.partition_id

    def get_properties(self, config: dict) -> dict[str, int]:
        """Tells the server which partition this is (it keeps held-out ones from training)."""
        return {"partition-id": self.partition_id}

    def round_seed(self, server_round: int) -> int:
        """Seed of this client's data order in ``server_round``."""
        return derived_seed(self.config.seed, server_round, self.partition_id)

    @property
    def model_name(self) -> str:
        """This client's architecture: ``client-models`` cycled by partition id, else ``model``."""
        names = client_model_names(self.config)
        return names[self.partition_id % len(names)]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.data.train.x.shape[1:])

    def new_model(self, name: str | None = None, *, materialise: bool = True) -> nn.Module:
        """A freshly initialised zoo model (this client's by default), seeded like the server's
        (on the ``meta`` device, to be assigned stored weights, without ``materialise``)."""
        return seeded_model(
            name or self.model_name,
            self.data.num_classes,
            seed=self.config.seed,
            image_size=self.config.image_size,
            materialise=materialise,
        )

    def train_model(
        self,
        model: nn.Module,
        server_round: int,
        loss_fn: LossFn = cross_entropy_loss,
        params=None,
        data: TensorData | None = None,
        epochs: int | None = None,
        lr_scale: Callable[[nn.Parameter], float] | None = None,
    ) -> TrainResult:
        """Local training with the configured epochs (unless ``epochs`` says otherwise),
        batch size and optimiser (each parameter's ``lr`` scaled by ``lr_scale``), on the
        client's training images unless ``data`` says otherwise."""
        cfg = self.config
        self.trained_round = server_round  # echoed in fit_metrics, so the server can refuse stale replies
        return train(
            model,
            self.data.train if data is None else data,
            epochs=cfg.local_epochs if epochs is None else epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            seed=self.round_seed(server_round),
            loss_fn=loss_fn,
            params=params,
            device=self.device,
            lr_scale=lr_scale,
        )

    def test_model(
        self,
        model: nn.Module,
        data: TensorData | None = None,
        forward: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> EvalResult:
        """Accuracy on this client's own test split (or on ``data``), of ``forward(model, x, y)``
        where given (:func:`fedapp.training.evaluate`)."""
        return evaluate(model, self.data.test if data is None else data, device=self.device, forward=forward)

    # ----- the model this client is scored on, and its export ------------------

    def inference_module(self, parameters: Arrays) -> nn.Module:
        """The module whose test accuracy this client reports, built from the global
        ``parameters`` and its personal state: what :meth:`evaluate` tests and exports,
        and what :func:`fedapp.inference.load_model` rebuilds. Its forward takes
        :meth:`input_batch` of images and returns logits over the client's classes."""
        raise NotImplementedError

    def score(self, module: nn.Module, parameters: Arrays, split: str = "test") -> tuple[EvalResult, dict[str, float]]:
        """Test ``module`` (:meth:`inference_module`'s) on this client's ``split`` (``test``, or
        ``val``: the share of its own data it holds back from training); the method's further
        metrics beside ``accuracy`` (default none)."""
        return self.test_model(module, self.data.splits[split].tensors), {}

    def evaluate(self, parameters: Arrays, config: dict) -> tuple[float, int, dict]:
        module = self.inference_module(parameters)
        result, extra = self.score(module, parameters, "test")
        validation = self.validation_metrics(module, parameters)
        exported = self.export_model(module, int(config.get("server-round", 0)))
        return result.loss, result.num_examples, {**self.eval_metrics(result), **extra, **validation, **exported}

    def validation_metrics(self, module: nn.Module, parameters: Arrays) -> dict[str, float]:
        """The same model scored on the client's validation split, as ``val_accuracy`` (and
        ``val_<reading>_accuracy`` for a method that reports several readings): what a sweep
        selects on, so that no choice is made on the test data. Empty when the client holds
        no validation data (``local-split`` with a zero validation share)."""
        if not len(self.data.splits["val"]):
            return {}
        result, extra = self.score(module, parameters, "val")
        readings = {f"val_{key}": value for key, value in extra.items() if key.endswith("_accuracy")}
        return {"val_accuracy": result.accuracy, **readings}

    def input_batch(self, images_uint8: np.ndarray) -> torch.Tensor:
        """``(N, H, W, 3)`` uint8 images as :meth:`inference_module`'s input: normalised
        ``(N, 3, S, S)`` float tensors at the run's ``image-size`` (as the client's own splits)."""
        x = to_float_tensor(images_uint8)
        size = self.config.image_size
        if tuple(x.shape[-2:]) != (size, size) and len(x):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        return x

    @property
    def architecture(self) -> str:
        """What the exported model is built on: the zoo model's name (CLIP clients: the backbone's)."""
        return self.model_name

    def frozen_backbone(self) -> nn.Module | None:
        """A frozen module whose tensors :meth:`inference_module` shares, left out of the
        export and rebuilt from the run configuration on loading (default: none)."""
        return None

    def export_model(self, module: nn.Module, server_round: int) -> dict[str, int]:
        """With ``export-models``, write ``module`` as this client's exported model
        (:func:`fedapp.models.export.client_model_path` says where). A failed write is a
        warning and the metric ``export_failed`` = 1, not a failed evaluation: the
        accuracy stands and the run goes on."""
        path = client_model_path(self.config, self.partition_id, supernode=on_supernode())
        if path is None:
            return {}
        metadata = model_metadata(
            "client",
            self.config.values,
            server_round,
            self.data.class_names,
            partition_id=self.partition_id,
            architecture=self.architecture,
        )
        try:
            write_model_file(path, module_tensors(module, self.frozen_backbone()), metadata)
        except ModelError as err:
            log.warning("client %d, round %d: model not exported: %s", self.partition_id, server_round, err)
            return {"export_failed": 1}
        return {}

    def load_personal_model(self, name: str = "model", architecture: str | None = None) -> nn.Module:
        """The client's own model from its store, or a fresh one on first use."""
        saved = self.store.load(name)
        if saved is None:
            return self.new_model(architecture)
        # Built without weights and given the stored ones: nothing is copied then overwritten.
        model = self.new_model(architecture, materialise=False)
        named_arrays_to_state(model, saved, assign=True)
        return model

    def save_personal_model(self, model: nn.Module, name: str = "model") -> int:
        """Store the client's model; returns how many rounds it has now been trained."""
        rounds = self.personal_rounds(name) + 1
        self.store.save(name, state_to_named_arrays(model))
        self.store.save(f"{name}.meta", {"rounds": np.array([rounds], dtype=np.int64)})
        return rounds

    def personal_rounds(self, name: str = "model") -> int:
        """Rounds the stored model has been trained (0 before the first)."""
        meta = self.store.load(f"{name}.meta")
        return 0 if meta is None else int(meta["rounds"][0])

    def fit_metrics(self, result: TrainResult, extra_flops: int = 0) -> dict[str, float | int]:
        """Loss, identity and the round's training FLOPs: ``result``'s (every step of the shared
        loop, counted by :mod:`fedapp.flops`) plus ``extra_flops`` (other training work of the round)."""
        return {
            "train_loss": result.loss,
            "partition_id": self.partition_id,
            # Echoed so the server can refuse a reply meant for another round.
            **({} if self.trained_round is None else {"server_round": self.trained_round}),
            "train_flops": result.flops + extra_flops,
        }

    def eval_metrics(self, result: EvalResult) -> dict[str, float | int]:
        """Test accuracy, and the partition it was measured on: the server keeps each
        client's accuracy per round under its partition id (``client_acc`` in metrics.jsonl)."""
        return {"accuracy": result.accuracy, "partition_id": self.partition_id}
