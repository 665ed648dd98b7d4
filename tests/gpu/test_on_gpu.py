"""The GPU tier: every catalogued method, the launcher, pretraining and the exported models, on a
real CUDA device.

CI has no GPU: there, ``tests/integration/test_device_placement.py`` runs every method on a
stand-in GPU that refuses mixed devices. This tier runs what only a GPU shows: Ray handing each
simulated client its share of the GPU (``--gpus-per-client``), every family in the precisions it
supports, the launcher's GPU checks against a real device count, pretraining under bf16
autocast, and models trained on the GPU loaded back on the CPU with the accuracy they reported.

Run it on a GPU machine with ``python -m pytest -q tests/gpu`` (``tests/gpu/run_on_device.sh``
also runs the unit tier and the launch benchmark there). Without a visible CUDA device the
whole module is one skipped line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

NO_CUDA = "no CUDA device visible: the GPU tier runs on a GPU machine (tests/gpu/run_on_device.sh)"
if not torch.cuda.is_available():
    pytest.skip(NO_CUDA, allow_module_level=True)

import fedapp  # noqa: E402 - after the skip: nothing below is needed without a GPU
from fedapp.catalog import CATALOG  # noqa: E402
from fedapp.client_app import make_client_app  # noqa: E402
from fedapp.clientdata import load_client_data  # noqa: E402
from fedapp.config import resolve_run_config  # noqa: E402
from fedapp.inference import prepare_images  # noqa: E402
from fedapp.inprocess import run_in_process  # noqa: E402
from fedapp.metrics import read_metrics  # noqa: E402
from fedapp.models import TINY_CLIP, load_open_clip  # noqa: E402
from fedapp.models.clip import clear_clip_cache  # noqa: E402
from fedapp.server_app import make_server_app  # noqa: E402
from tests import simulation  # noqa: E402
from tests.paths import ROOT, load_script  # noqa: E402

GPU_SHARE = 0.25
CLIENTS = 4
BACKEND = {
    "client_resources": {"num_cpus": 1, "num_gpus": GPU_SHARE},
    "init_args": {"num_cpus": min(8, os.cpu_count() or 1), "num_gpus": torch.cuda.device_count()},
}
BRIEF = {"num-partitions": CLIENTS, "num-rounds": 2, "batch-size": 16, "shots-per-class": 5, "device": "cuda"}
BACKBONES = {"clip-vision": {"clip-model": "fedapp-tiny-vit"}}
# `precision` is the frozen encoders' (fedapp/config/schema.py): the CLIP families have them;
# zoo CNNs train in fp32 and FedD2P's server CLIP loads in fp32.
PRECISIONS = {"clip-text": ("fp32", "bf16", "fp16"), "clip-vision": ("fp32", "bf16", "fp16")}
EVERY_PRECISION = [
    (method, precision)
    for method, spec in sorted(CATALOG.items())
    for precision in PRECISIONS.get(spec.backbone, ("fp32",))
]
# Ray: every method in fp32, and each CLIP family's paper method in its low precisions (a
# simulation's fixed cost is seconds; every method in every precision is run in process below).
RAY_RUNS = [(method, "fp32") for method in sorted(CATALOG)] + [
    (method, precision) for method in ("sdfed", "pep-fedpt") for precision in ("bf16", "fp16")
]


def _overrides(method: str, precision: str = "fp32", **extra) -> dict:
    return {"method": method, **BRIEF, **BACKBONES.get(CATALOG[method].backbone, {}), "precision": precision, **extra}


@pytest.mark.parametrize(("method", "precision"), RAY_RUNS, ids=[f"{m}-{p}" for m, p in RAY_RUNS])
def test_every_method_trains_on_a_share_of_the_gpu_in_ray_simulation(method, precision, tmp_path):
    overrides = _overrides(method, precision, **{"results-dir": str(tmp_path), "run-name": "run"})
    simulation.simulate(make_server_app(overrides), make_client_app(overrides), CLIENTS, backend_config=BACKEND)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [row["round"] for row in rows] == [1, 2]
    for row in rows:
        assert row["clients_failed"] == 0 and row["clients_fit"] > 0, row
        assert row["clients_evaluated"] == CLIENTS and 0.0 <= row["acc_mean"] <= 1.0
        assert row["train_flops_round"] > 0


@pytest.mark.parametrize(("method", "precision"), EVERY_PRECISION, ids=[f"{m}-{p}" for m, p in EVERY_PRECISION])
def test_every_method_keeps_its_tensors_on_the_gpu_in_every_precision(method, precision):
    """In this process (the in-process driver), so that the GPU's own memory counter shows the work."""
    torch.cuda.reset_peak_memory_stats()
    history = run_in_process(_overrides(method, precision)).history
    assert [record.round for record in history] == [1, 2]
    assert all(record.clients_failed == 0 and record.train_flops_round > 0 for record in history)
    assert torch.cuda.max_memory_allocated() > 0


def _launch(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedapp.launch", *args],
        check=False, capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip


def test_the_launcher_runs_pfedlora_on_gpu_shares(tmp_path):
    """pFedLoRA failed every client on a GPU before issue 40 (its FLOP count fed a CPU tensor to the model)."""
    results = tmp_path / "results"
    run_config = f'num-rounds=2 num-partitions={CLIENTS} shots-per-class=10 device="cuda" results-dir="{results}"'
    proc = _launch(
        "--preset", str(ROOT / "conf" / "pfedlora-digits.yaml"), "--run-config", run_config,
        "--gpus-per-client", str(GPU_SHARE), "--flwr-home", str(tmp_path / "flwr"), cwd=tmp_path,
    )  # fmt: skip
    seen = proc.stdout + proc.stderr
    assert proc.returncode == 0, seen[-3000:]
    assert "using cuda:0" in seen and "CUDA is not available" not in seen, seen[-3000:]
    (run_dir,) = results.iterdir()
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [row["clients_failed"] for row in rows] == [0, 0] and all(row["train_flops_round"] > 0 for row in rows)


def test_the_launcher_checks_gpu_shares_against_this_machine(tmp_path):
    too_many = torch.cuda.device_count() + 1
    for share, refusal in (("1.5", "above 1, Ray only hands out whole GPUs"), (str(too_many), "torch finds only")):
        proc = _launch("--gpus-per-client", share, "--flwr-home", str(tmp_path / "flwr"), cwd=tmp_path, timeout=120)
        assert proc.returncode == 2 and refusal in proc.stderr, proc.stderr
    assert not (tmp_path / "flwr").exists()


def test_pretraining_on_the_gpu_writes_a_checkpoint_the_cpu_loads(tmp_path, capsys):
    from PIL import Image  # noqa: PLC0415

    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    for cls, name in enumerate(("red", "green", "blue")):
        (data / name).mkdir(parents=True)
        for i in range(40):
            pixels = rng.integers(0, 80, (32, 32, 3), dtype=np.uint8)
            pixels[..., cls] += 150
            Image.fromarray(pixels).save(data / name / f"{i}.png")
    out = tmp_path / "clip.pt"
    argv = ["--data", str(data), "--out", str(out), "--model", TINY_CLIP, "--epochs", "2", "--batch-size", "16"]
    assert load_script("pretrain_clip").main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 0
    assert "on cuda in bf16" in capsys.readouterr().out
    state = torch.load(out, weights_only=True)["state_dict"]
    floats = [tensor for tensor in state.values() if tensor.is_floating_point()]
    assert all(tensor.device.type == "cpu" and tensor.dtype == torch.float32 for tensor in floats)
    clear_clip_cache()
    assert load_open_clip(TINY_CLIP, str(out), device="cpu").model.logit_scale.device.type == "cpu"


EXPORTED = {
    "pfedlora": {"client-models": "cnn-4,cnn-5"},
    "sdfed": {"prompt-length": 2, "local-prompt-lengths": "2,3,4,3"},
    "pep-fedpt": {"clip-model": "fedapp-tiny-vit", "prompt-length": 2, "class-prompt-length": 2},
    "fedd2p": {"client-models": "vgg-2,vgg-3", "d2p-steps": 3},
}


@pytest.mark.parametrize("method", EXPORTED)
def test_models_trained_on_the_gpu_load_on_the_cpu_and_score_as_reported(method, tmp_path):
    overrides = {**_overrides(method), **EXPORTED[method], "results-dir": str(tmp_path), "run-name": method}
    run_in_process(overrides, record=True)
    run_dir, config = tmp_path / method, resolve_run_config(overrides)
    final = read_metrics(run_dir / "metrics.jsonl")[-1]
    for k in range(CLIENTS):
        model = fedapp.load_model(run_dir, client=k, device="cpu")
        assert all(p.device.type == "cpu" for p in model.parameters())
        test = load_client_data(config, k, CLIENTS).splits["test"]
        with torch.no_grad():
            predicted = model(prepare_images(run_dir, test.images, client=k)).argmax(dim=1).numpy()
        # The GPU's kernels round differently from the CPU's: a prediction near a tie may flip.
        assert abs(float((predicted == test.labels).mean()) - final["client_acc"][str(k)]) <= 0.1
