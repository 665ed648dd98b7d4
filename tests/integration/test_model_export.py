"""Exported models reproduce the run: after an in-process run, ``fedapp.load_model`` of a
client predicts its test split with the accuracy the run reported for it (``client_acc`` of
the last line of metrics.jsonl), for every family of method; the global model of a method that
has one predicts as every client did; and the example of docs/results.md runs as shown."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import fedapp
from fedapp.clientdata import load_client_data
from fedapp.config import resolve_run_config
from fedapp.inference import prepare_images
from fedapp.inprocess import run_in_process
from fedapp.metrics import read_metrics
from fedapp.models.export import read_model_file
from tests.paths import ROOT

PARTITIONS = 3
SMALL = {
    "num-rounds": 2,
    "num-partitions": PARTITIONS,
    "partition": "iid",
    "shots-per-class": 4,
    "batch-size": 16,
}
# One method per family: a personal CNN with a shared adapter, one global CNN, a text prompt
# (shared and private) and a global one over a frozen CLIP, visual prompts mixed with a
# client's prior, and CNN clients of a server-held CLIP.
METHODS = {
    "pfedlora": {"client-models": "cnn-4,cnn-5"},
    "fedavg": {"model": "cnn-5"},
    "sdfed": {"prompt-length": 2, "local-prompt-lengths": "2,3,4"},
    "promptfl": {"prompt-length": 2},
    "pep-fedpt": {"clip-model": "fedapp-tiny-vit", "prompt-length": 2, "class-prompt-length": 2},
    "fedd2p": {"client-models": "vgg-2,vgg-3", "d2p-steps": 3},
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """``finished_run(method)``: the run folder and configuration of a small in-process run (run once per method)."""
    runs: dict[str, tuple[Path, object]] = {}
    results = tmp_path_factory.mktemp("export")

    def run(method: str):
        if method not in runs:
            overrides = {"method": method, **SMALL, **METHODS[method], "results-dir": str(results), "run-name": method}
            run_in_process(overrides, record=True)
            runs[method] = results / method, resolve_run_config(overrides)
        return runs[method]

    return run


def accuracy(model: torch.nn.Module, x: torch.Tensor, labels: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(x).argmax(dim=1).numpy() == labels).mean())


@pytest.mark.parametrize("method", METHODS)
def test_an_exported_client_model_reproduces_its_clients_final_accuracy(finished_run, method):
    run_dir, config = finished_run(method)
    final = read_metrics(run_dir / "metrics.jsonl")[-1]
    assert sorted(final["client_acc"]) == [str(k) for k in range(PARTITIONS)]
    for k in range(PARTITIONS):
        exported = read_model_file(run_dir / "models" / f"client-{k}.safetensors")
        assert exported.field("round") == "2" and exported.field("partition_id") == str(k)
        model = fedapp.load_model(run_dir, client=k)
        test = load_client_data(config, k, PARTITIONS).splits["test"]
        x = prepare_images(run_dir, test.images, client=k)
        assert accuracy(model, x, test.labels) == final["client_acc"][str(k)]


def test_the_global_cnn_predicts_as_every_client_did_and_pools_to_the_global_accuracy(finished_run):
    run_dir, config = finished_run("fedavg")
    final = read_metrics(run_dir / "metrics.jsonl")[-1]
    model = fedapp.load_model(run_dir)
    correct = total = 0
    for k in range(PARTITIONS):
        test = load_client_data(config, k, PARTITIONS).splits["test"]
        acc = accuracy(model, prepare_images(run_dir, test.images), test.labels)
        assert acc == final["client_acc"][str(k)]
        correct, total = correct + round(acc * len(test)), total + len(test)
    assert correct / total == pytest.approx(final["global_acc"])
    assert read_model_file(run_dir / "models" / "global.safetensors").field("round") == "2"


@pytest.mark.parametrize("method", ["promptfl", "pep-fedpt"])
def test_a_global_prompt_loads_with_its_frozen_backbone(finished_run, method):
    run_dir, config = finished_run(method)
    final = read_metrics(run_dir / "metrics.jsonl")[-1]
    model = fedapp.load_model(run_dir)
    test = load_client_data(config, 0, PARTITIONS).splits["test"]
    x = prepare_images(run_dir, test.images)
    assert model(x).shape == (len(test), 10)
    if method == "promptfl":  # every client evaluates the global prompt itself
        assert accuracy(model, x, test.labels) == final["client_acc"]["0"]
    else:  # the global prompts and prototypes, mixed without any client's prior
        assert torch.allclose(model.mixer.prior, torch.full((10,), 0.1))


def test_a_method_without_a_global_model_says_to_pass_a_client(finished_run):
    run_dir, _ = finished_run("sdfed")
    with pytest.raises(ValueError, match=r"sdfed has no global model .*pass client=<partition id>"):
        fedapp.load_model(run_dir)


def test_the_example_of_the_results_page_runs_as_shown(finished_run, tmp_path, monkeypatch):
    page = (ROOT / "docs" / "results.md").read_text()
    section = page.split("## Exported models", 1)[1]
    (example,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    run_dir, _ = finished_run("pfedlora")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "my-run").symlink_to(run_dir)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "docs/results.md", "exec"), namespace)  # the page's own example
    assert namespace["accuracy"] == namespace["last"]["client_acc"]["0"]
    assert namespace["last"]["round"] == 2


def test_a_pfedlora_client_exported_under_the_combined_reading_reproduces_its_accuracy(tmp_path):
    """pfedlora-inference = "combined" predicts with the local head and the adapter mixed: the
    exported module holds both, and predicts as the run scored it."""
    overrides = {"method": "pfedlora", **SMALL, **METHODS["pfedlora"], "pfedlora-inference": "combined"}
    overrides.update({"results-dir": str(tmp_path), "run-name": "combined"})
    run_in_process(overrides, record=True)
    run_dir, config = tmp_path / "combined", resolve_run_config(overrides)
    final = read_metrics(run_dir / "metrics.jsonl")[-1]
    assert {"eval_head_accuracy", "eval_adapter_accuracy", "eval_combined_accuracy"} <= set(final)
    for k in range(PARTITIONS):
        test = load_client_data(config, k, PARTITIONS).splits["test"]
        model = fedapp.load_model(run_dir, client=k)
        assert (
            accuracy(model, prepare_images(run_dir, test.images, client=k), test.labels) == final["client_acc"][str(k)]
        )
