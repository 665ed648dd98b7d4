"""Exported models (fedapp.models.export, fedapp.inference): safetensors files with names and
metadata, strict loading, where clients and the server write them, and what load_model refuses."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file
from torch import nn

import fedapp
from fedapp.clientdata import load_client_data
from fedapp.clients.fedavg import FedAvgClient
from fedapp.clients.pep_fedpt import PEPFedPTClient, PriorMixer
from fedapp.clients.standalone import StandaloneClient
from fedapp.config import resolve_run_config
from fedapp.errors import ModelError
from fedapp.inference import load_model, prepare_images, run_config
from fedapp.methods.pep_fedpt import ccmp_mixer, class_prior
from fedapp.models import TINY_VIT, build_model, load_open_clip
from fedapp.models.export import (
    FORMAT,
    GLOBAL_FILE,
    MODELS_DIR,
    client_file,
    client_model_path,
    export_global_model,
    global_model_tensors,
    load_module_tensors,
    model_metadata,
    module_tensors,
    read_model_file,
    write_model_file,
)
from fedapp.models.vpt import PromptedViT
from fedapp.params import get_arrays
from fedapp.state import MemoryStateStore
from fedapp.strategies.fedavg import FedAvgStrategy
from fedapp.strategies.fedproto import FedProtoStrategy
from fedapp.strategies.pep_fedpt import PEPFedPTStrategy
from fedapp.strategies.pfedlora import PFedLoRAStrategy
from fedapp.strategies.standalone import StandaloneStrategy

CLASS_NAMES = tuple(str(i) for i in range(10))


def small_config(tmp_path, **extra):
    return resolve_run_config(
        {
            "model": "cnn-5",
            "num-partitions": 3,
            "partition": "iid",
            "shots-per-class": 2,
            "results-dir": str(tmp_path / "results"),
            "run-name": "run",
            **extra,
        }
    )


# ----- files: names, metadata, refusals --------------------------------------------


def test_a_file_round_trips_its_named_tensors_and_metadata(tmp_path):
    tensors = {
        "head.weight": torch.randn(3, 4),
        "scale": torch.tensor(2.5),
        "counts": torch.arange(3),
        "empty": torch.zeros(0, 2, 4),
        "half": torch.randn(2, dtype=torch.bfloat16),
    }
    metadata = model_metadata("client", {"method": "fedavg", "lr": 0.1}, 7, ["cat", "dog"], partition_id=3)
    path = write_model_file(tmp_path / "models" / "client-3.safetensors", tensors, metadata)
    read = read_model_file(path)
    assert set(read.tensors) == set(tensors)
    for name, tensor in tensors.items():
        assert read.tensors[name].dtype == tensor.dtype and torch.equal(read.tensors[name], tensor)
    assert read.metadata["format"] == FORMAT and read.field("kind") == "client" and read.field("round") == "7"
    assert read.json_field("class_names") == ["cat", "dog"] and read.field("num_classes") == "2"
    assert read.json_field("config") == {"method": "fedavg", "lr": 0.1} and read.field("partition_id") == "3"
    assert [p.name for p in path.parent.iterdir()] == ["client-3.safetensors"]  # no temporary file left


def test_reading_names_what_is_missing_and_what_is_there(tmp_path):
    with pytest.raises(ModelError, match=r"there is no folder .*models"):
        read_model_file(tmp_path / "models" / "client-0.safetensors")
    write_model_file(
        tmp_path / "models" / "client-1.safetensors",
        {"w": torch.ones(1)},
        model_metadata("client", {"method": "fedavg"}, 1, ["a"]),
    )
    with pytest.raises(ModelError, match=r"no exported model .*client-0\.safetensors: .*holds client-1\.safetensors"):
        read_model_file(tmp_path / "models" / "client-0.safetensors")


def test_files_that_are_not_fedapp_exports_are_refused(tmp_path):
    other = tmp_path / "other.safetensors"
    save_file({"w": torch.ones(1)}, str(other), metadata={"format": "pt"})
    with pytest.raises(ModelError, match="not a fedapp model export"):
        read_model_file(other)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(ModelError, match="not a readable safetensors file"):
        read_model_file(garbage)


def test_a_write_error_names_the_path(tmp_path):
    (tmp_path / "models").write_text("a file where the folder should be")
    with pytest.raises(ModelError, match=r"cannot write exported model .*models/client-0\.safetensors"):
        write_model_file(tmp_path / "models" / "client-0.safetensors", {"w": torch.ones(1)}, {"format": FORMAT})


class Backboned(nn.Module):
    """A trainable head over a frozen backbone it shares (as the CLIP prompt models do)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(4, 2)
        self.norm = nn.BatchNorm1d(2)


def test_module_tensors_leave_out_the_frozen_backbone_and_keep_buffers():
    backbone = nn.Linear(4, 4)
    model = Backboned(backbone)
    names = set(module_tensors(model, frozen=backbone))
    assert names == {
        "head.weight",
        "head.bias",
        "norm.weight",
        "norm.bias",
        "norm.running_mean",
        "norm.running_var",
        "norm.num_batches_tracked",
    }
    assert {"backbone.weight", "backbone.bias"} <= set(module_tensors(model))


def test_loading_is_strict_and_names_every_mismatch(tmp_path):
    source = build_model("cnn-5", 10)
    meta = model_metadata("client", {"method": "standalone"}, 1, CLASS_NAMES)
    path = write_model_file(tmp_path / "m.safetensors", module_tensors(source), meta)
    target = build_model("cnn-5", 10)
    load_module_tensors(target, read_model_file(path))
    assert all(np.array_equal(a, b) for a, b in zip(get_arrays(target), get_arrays(source), strict=True))

    tensors = module_tensors(source)
    tensors.pop("head.bias")
    tensors["extra"] = torch.ones(1)
    tensors["head.weight"] = torch.ones(3, 3)
    bad = write_model_file(tmp_path / "bad.safetensors", tensors, meta)
    with pytest.raises(ModelError) as info:
        load_module_tensors(build_model("cnn-5", 10), read_model_file(bad))
    message = str(info.value)
    assert "bad.safetensors" in message and "missing ['head.bias']" in message
    assert "not the model's ['extra']" in message and "head.weight (3, 3)" in message


def test_global_tensors_need_one_unique_name_per_array():
    arrays = [np.ones(2, np.float32), np.zeros(3, np.float32)]
    assert set(global_model_tensors(["a", "b"], arrays, {"generator.w": np.ones(1)})) == {"a", "b", "generator.w"}
    with pytest.raises(ModelError, match="1 names for 2 global arrays"):
        global_model_tensors(["a"], arrays, {})
    with pytest.raises(ModelError, match="not unique"):
        global_model_tensors(["a", "a"], arrays, {})
    with pytest.raises(ModelError, match="not unique"):
        global_model_tensors(["a", "b"], arrays, {"b": np.ones(1)})


# ----- where they go ----------------------------------------------------------------


def test_a_simulated_client_writes_into_the_run_folder_only_when_the_server_writes_one(tmp_path):
    config = small_config(tmp_path)
    assert client_model_path(config, 2, supernode=False) is None  # a run that records nothing
    (tmp_path / "results" / "run").mkdir(parents=True)
    assert client_model_path(config, 2, supernode=False) == tmp_path / "results" / "run" / MODELS_DIR / client_file(2)
    # On a SuperNode: under the node's own state-dir, never the submitted results-dir.
    node = small_config(tmp_path, **{"state-dir": str(tmp_path / "node")})
    assert client_model_path(node, 2, supernode=True) == tmp_path / "node" / "run" / "models" / "client-2.safetensors"
    off = small_config(tmp_path, **{"export-models": False})
    assert client_model_path(off, 2, supernode=False) is None and client_model_path(off, 2, supernode=True) is None


def test_a_failed_export_is_a_warning_and_a_metric_not_a_failed_evaluation(tmp_path, caplog):
    config = small_config(tmp_path)
    (tmp_path / "results" / "run").mkdir(parents=True)
    (tmp_path / "results" / "run" / "models").write_text("not a folder")
    client = FedAvgClient(config, load_client_data(config, 0, 3), MemoryStateStore({}), torch.device("cpu"))
    with caplog.at_level(logging.WARNING, logger="flwr.fedapp"):
        _, n, metrics = client.evaluate(get_arrays(client.new_model()), {"server-round": 2})
    assert n == len(client.data.test) and 0.0 <= metrics["accuracy"] <= 1.0
    assert metrics["export_failed"] == 1
    assert "client 0, round 2: model not exported: cannot write exported model" in caplog.text


def test_a_client_model_loads_back_from_a_node_folder_and_predicts_as_the_client_did(tmp_path):
    # A SuperNode's folder: no config.yaml, the client's file carries the configuration.
    config = small_config(tmp_path, method="standalone", **{"state-dir": str(tmp_path / "node")})
    client = StandaloneClient(config, load_client_data(config, 1, 3), MemoryStateStore({}), torch.device("cpu"))
    client.fit([], {"server-round": 1})
    path = client_model_path(config, 1, supernode=True)
    module = client.inference_module([])
    write_model_file(
        path, module_tensors(module), model_metadata("client", config.values, 1, CLASS_NAMES, partition_id=1)
    )
    _, _, metrics = client.evaluate([], {"server-round": 1})
    run_dir = tmp_path / "node" / "run"
    loaded = load_model(run_dir, client=1)
    assert not loaded.training
    test = client.data.splits["test"]
    with torch.no_grad():
        predicted = loaded(prepare_images(run_dir, test.images, client=1)).argmax(1).numpy()
    assert (predicted == test.labels).mean() == metrics["accuracy"]
    with pytest.raises(ModelError, match="holds client 1's model, not 0's"):
        (run_dir / "models" / "client-1.safetensors").rename(run_dir / "models" / "client-0.safetensors")
        load_model(run_dir, client=0)


# ----- the server's global file -------------------------------------------------------


def test_the_global_file_names_the_arrays_as_the_module_they_come_from(tmp_path):
    config = small_config(tmp_path, method="pfedlora", **{"client-models": "cnn-4,cnn-5"})
    strategy = PFedLoRAStrategy(config, 10, None, CLASS_NAMES)
    strategy.global_arrays = strategy.initial_arrays()
    path = export_global_model(strategy, tmp_path, 3, {})
    written = read_model_file(path)
    assert path == tmp_path / MODELS_DIR / GLOBAL_FILE
    assert written.json_field("arrays") == ["down.weight", "down.bias", "up.weight", "up.bias"]
    assert written.field("kind") == "global" and written.field("round") == "3"
    for name, array in zip(written.json_field("arrays"), strategy.global_arrays, strict=True):
        assert np.array_equal(written.tensors[name].numpy(), array)
    # Nothing with export-models = false, nor for a method that shares nothing.
    off = PFedLoRAStrategy(small_config(tmp_path, method="pfedlora", **{"export-models": False}), 10, None, CLASS_NAMES)
    off.global_arrays = strategy.global_arrays
    assert export_global_model(off, tmp_path / "off", 3, {}) is None and not (tmp_path / "off").exists()
    standalone = StandaloneStrategy(small_config(tmp_path, method="standalone"), 10, None, CLASS_NAMES)
    assert export_global_model(standalone, tmp_path / "other", 1, {}) is None and not (tmp_path / "other").exists()


def test_a_global_export_that_cannot_be_written_is_a_warning(tmp_path, caplog):
    strategy = FedAvgStrategy(small_config(tmp_path), 10, None, CLASS_NAMES)
    strategy.global_arrays = strategy.initial_arrays()
    (tmp_path / "models").write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="flwr.fedapp"):
        assert export_global_model(strategy, tmp_path, 1, {}) is None
    assert "round 1: the global model was not exported" in caplog.text


def test_naming_the_global_arrays_does_not_move_the_random_streams(tmp_path):
    strategies = [
        FedAvgStrategy(small_config(tmp_path), 10, None, CLASS_NAMES),
        PEPFedPTStrategy(small_config(tmp_path, method="pep-fedpt", **{"clip-model": TINY_VIT}), 10, None, CLASS_NAMES),
    ]
    for strategy in strategies:
        arrays = strategy.initial_arrays()
        before = torch.get_rng_state()
        names = strategy.global_array_names()
        assert torch.equal(torch.get_rng_state(), before)
        assert len(names) == len(arrays) == len(set(names))
    assert strategies[0].global_array_names() == list(build_model("cnn-5", 10).state_dict())
    assert strategies[1].global_array_names()[-2:] == ["class_prototypes", "class_present"]
    fedproto = FedProtoStrategy(small_config(tmp_path, method="fedproto"), 10, None, CLASS_NAMES)
    assert fedproto.global_array_names() == ["prototypes", "class_present"]


# ----- PEP-FedPT's mixer as a module ----------------------------------------------------


def test_pep_fedpt_mixer_module_computes_what_the_closure_did_and_exports_the_prior():
    config = resolve_run_config(
        {"method": "pep-fedpt", "clip-model": TINY_VIT, "num-partitions": 4, "prompt-length": 2}
    )
    client = PEPFedPTClient(config, load_client_data(config, 1, 4), MemoryStateStore({}), torch.device("cpu"))
    arrays = PEPFedPTStrategy(config, 10).initial_arrays()
    arrays[-2] = np.random.default_rng(0).normal(size=arrays[-2].shape).astype(np.float32)
    arrays[-1] = np.ones_like(arrays[-1])
    model = client.inference_module(arrays)
    assert isinstance(model.mixer, PriorMixer)
    prior = class_prior(client.data.label_counts())
    assert torch.equal(model.state_dict()["mixer.prior"], prior)
    closure = PromptedViT(
        load_open_clip(TINY_VIT),
        model.prompts,
        ccmp_mixer(arrays[-2], arrays[-1], prior, config.options.ccmp_temperature, 3),
    )
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(images), closure(images))
    assert {"mixer.prototypes", "mixer.present", "mixer.prior"} <= set(module_tensors(model, client.frozen_backbone()))


# ----- load_model's arguments -------------------------------------------------------


def test_load_model_is_fedapp_load_model_loaded_lazily():
    assert fedapp.load_model is load_model
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fedapp.nothing  # noqa: B018


def test_load_model_refuses_bad_clients_and_a_global_model_the_method_lacks(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "models").mkdir(parents=True)
    config = small_config(tmp_path, method="pfedlora", **{"client-models": "cnn-4,cnn-5"})
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.as_dict()))
    assert run_config(run_dir) == config
    for bad in (-1, True, "0", 1.5):
        with pytest.raises(ModelError, match="client must be a partition id"):
            load_model(run_dir, client=bad)
    with pytest.raises(ModelError, match=r"pfedlora has no global model .*pass client=<partition id>"):
        load_model(run_dir)
    with pytest.raises(ModelError, match=r"no exported model .*client-4\.safetensors: .*holds no exported model"):
        load_model(run_dir, client=4)
    with pytest.raises(ModelError, match="not a run folder"):
        run_config(tmp_path)
    meta = model_metadata("client", {**config.as_dict(), "method": "fedavg"}, 1, CLASS_NAMES, partition_id=0)
    write_model_file(run_dir / "models" / "client-0.safetensors", {"w": torch.ones(1)}, meta)
    with pytest.raises(ModelError, match="holds a fedavg model, but the run's method is pfedlora"):
        load_model(run_dir, client=0)
    assert json.loads(meta["class_names"]) == list(CLASS_NAMES)


def test_a_model_file_of_another_run_is_refused_before_it_loads(tmp_path):
    """Issue 63: a run's models/ holding another run's file (another dataset, class count, rate or
    seed) loaded and predicted over the other run's classes; the file's run configuration must be
    the folder's, but for where the run was kept."""
    from fedapp.inprocess import run_in_process  # noqa: PLC0415

    base = {"num-rounds": 1, "num-partitions": 2, "model": "cnn-5", "results-dir": str(tmp_path)}
    run_in_process({**base, "run-name": "ten"}, record=True)
    run_in_process({**base, "run-name": "other", "lr": 0.1}, record=True)
    assert load_model(tmp_path / "ten") is not None  # its own file loads
    shutil.copy(tmp_path / "other" / "models" / "global.safetensors", tmp_path / "ten" / "models")
    expected = r"global\.safetensors was written by another run \(its lr is 0\.1, this run's 0\.05\)"
    with pytest.raises(ModelError, match=expected):
        load_model(tmp_path / "ten")
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "other", moved)  # a run folder moved keeps its models
    assert load_model(moved) is not None
