"""Settings for GPU runs, checked on CPU: device selection and its fallback, mixed
precision of the frozen encoders, one backbone per worker process, and the
simulation's per-client GPU share."""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedapp import launch, training
from fedapp.clientdata import load_client_data
from fedapp.clients.pep_fedpt import PEPFedPTClient
from fedapp.clients.promptfl import PromptFLClient
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError
from fedapp.launch import check_client_resources, federation_overrides
from fedapp.models import TINY_CLIP, TINY_VIT, LoadedClip, load_open_clip
from fedapp.models.clip import _load_cached, register_tiny_configs
from fedapp.models.image_features import encode_images
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder, clip_logits
from fedapp.models.vpt import PromptedViT, VisualPrompts, vision_tower_shape
from fedapp.state import MemoryStateStore
from fedapp.strategies.pep_fedpt import PEPFedPTStrategy
from fedapp.strategies.promptfl import PromptFLStrategy
from fedapp.training import select_device

LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
CLASSES = ("zero", "one", "two", "three")


def _images(n: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


def _fp32_twin(clip: LoadedClip) -> LoadedClip:
    """The same weights (already rounded to the low precision) computed in fp32, so the
    comparison measures the low-precision arithmetic alone."""
    return dataclasses.replace(clip, model=copy.deepcopy(clip.model).float(), precision="fp32")


def _prompt_config(**extra):
    return resolve_run_config({"method": "promptfl", "num-partitions": 4, "shots-per-class": 4, **extra})


def _pep_config(**extra):
    return resolve_run_config(
        {
            "method": "pep-fedpt",
            "clip-model": TINY_VIT,
            "num-partitions": 4,
            "partition": "pathological",
            "classes-per-client": 2,
            "prompt-length": 2,
            "class-prompt-length": 2,
            "shots-per-class": 8,  # bf16 matmuls are slow on most CPUs; keep the fit small
            **extra,
        }
    )


def _client(cls, config, pid: int):
    return cls(config, load_client_data(config, pid, 4), MemoryStateStore({}), torch.device("cpu"))


# ----- device selection --------------------------------------------------------------


@pytest.fixture
def device_log(caplog, monkeypatch):
    """INFO records of the app's logger, with select_device's once-per-process memory reset."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # a CUDA build, whatever this machine has
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    training._log_once.cache_clear()
    caplog.set_level(logging.INFO, logger="flwr.fedapp")
    yield caplog
    training._log_once.cache_clear()


def _device_lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("device = ")]


def test_auto_without_cuda_uses_the_cpu_and_says_so_once_per_process(device_log, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [select_device("auto") for _ in range(3)] == [torch.device("cpu")] * 3
    assert _device_lines(device_log) == [
        (logging.INFO, "device = auto: CUDA not available (no CUDA device found); using CPU")
    ]


def test_auto_in_a_ray_worker_without_a_gpu_names_the_cause(device_log, monkeypatch):
    # Ray sets CUDA_VISIBLE_DEVICES="" in workers given no GPU (--gpus-per-client 0).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert select_device("auto") == torch.device("cpu")
    [(level, message)] = _device_lines(device_log)
    assert level == logging.INFO and "CUDA_VISIBLE_DEVICES=''" in message and "--gpus-per-client" in message


def test_cuda_without_cuda_falls_back_to_the_cpu_with_a_warning(device_log, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_device("cuda") == select_device("cuda") == torch.device("cpu")
    assert _device_lines(device_log) == [
        (logging.WARNING, "device = cuda requested but CUDA is not available (no CUDA device found); using CPU")
    ]


def test_auto_with_a_gpu_picks_cuda_and_names_the_gpu(device_log, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H200")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # what Ray gives the worker it put on GPU 3
    assert select_device("auto") == torch.device("cuda")
    assert _device_lines(device_log) == [
        (logging.INFO, "device = auto: using cuda:0 (NVIDIA H200; CUDA_VISIBLE_DEVICES=3)")
    ]


def test_cpu_is_taken_as_asked_without_a_line(device_log, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert select_device("cpu") == torch.device("cpu")
    assert _device_lines(device_log) == []


# ----- mixed precision of the frozen encoders ----------------------------------------


def _linear_input_dtypes(model: nn.Module, run) -> set[torch.dtype]:
    """Dtypes of the inputs every Linear and Conv2d of ``model`` saw while ``run()`` ran."""
    seen: set[torch.dtype] = set()
    handles = [
        module.register_forward_hook(lambda _m, inputs, _out: seen.add(inputs[0].dtype))
        for module in model.modules()
        if isinstance(module, nn.Linear | nn.Conv2d)
    ]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_runs_the_frozen_encoders_in_that_dtype(precision):
    dtype = LOW[precision]
    clip = load_open_clip(TINY_CLIP, precision=precision)
    assert clip.precision == precision and clip.compute_dtype == dtype
    assert clip.model.visual.transformer.resblocks[0].mlp.c_fc.weight.dtype == dtype
    assert clip.model.ln_final.weight.dtype == torch.float32  # open_clip keeps norms in fp32
    encoder = PromptTextEncoder(clip, CLASSES)
    context = PromptContext(4, encoder.token_width, generator=0).context
    assert _linear_input_dtypes(clip.model, lambda: encode_images(clip, _images())) == {dtype}
    assert _linear_input_dtypes(clip.model, lambda: encoder(context)) == {dtype}
    vit = load_open_clip(TINY_VIT, precision=precision)
    model = PromptedViT(vit, VisualPrompts(vision_tower_shape(TINY_VIT), 10, prompt_length=2))
    assert _linear_input_dtypes(vit.model, lambda: model.tokens(torch.randn(2, 3, 32, 32))) == {dtype}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_features_are_close_to_fp32_ones(precision):
    clip = load_open_clip(TINY_CLIP, precision=precision)
    twin = _fp32_twin(clip)
    images = _images()
    low, ref = encode_images(clip, images), encode_images(twin, images)
    assert low.dtype == torch.float32
    assert F.cosine_similarity(low, ref).min() > 0.999
    torch.testing.assert_close(low, ref, atol=2e-2, rtol=0)
    context = PromptContext(4, 64, generator=0).context
    text_low = PromptTextEncoder(clip, CLASSES)(context)
    text_ref = PromptTextEncoder(twin, CLASSES)(context)
    assert text_low.dtype == torch.float32
    torch.testing.assert_close(text_low, text_ref, atol=2e-2, rtol=0)

    vit = load_open_clip(TINY_VIT, precision=precision)
    prompts = VisualPrompts(vision_tower_shape(TINY_VIT), 10, prompt_length=2)
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pooled_low = PromptedViT(vit, prompts).tokens(x)[0]
        pooled_ref = PromptedViT(_fp32_twin(vit), prompts).tokens(x)[0]
    assert pooled_low.dtype == torch.float32
    assert F.cosine_similarity(pooled_low, pooled_ref).min() > 0.999


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_trainable_parameters_stay_fp32_and_get_finite_gradients(precision):
    clip = load_open_clip(TINY_CLIP, precision=precision)
    encoder = PromptTextEncoder(clip, CLASSES)
    context = PromptContext(4, encoder.token_width, generator=0)
    features = encode_images(clip, _images(8))
    logits = clip_logits(features, encoder(context.context), clip.model.logit_scale)
    loss = F.cross_entropy(logits, torch.arange(8) % len(CLASSES))
    assert logits.dtype == loss.dtype == torch.float32
    loss.backward()
    assert context.context.dtype == context.context.grad.dtype == torch.float32
    assert torch.isfinite(context.context.grad).all() and context.context.grad.abs().sum() > 0

    vit = load_open_clip(TINY_VIT, precision=precision)
    shape = vision_tower_shape(TINY_VIT)
    prompts = VisualPrompts(shape, 4, prompt_layers=(1, 2), prompt_length=2, class_layers=(5,), class_length=2)
    model = PromptedViT(vit, prompts, mixer=lambda j, cls: torch.full((cls.shape[0], 4), 0.25))
    logits = model(torch.randn(4, 3, 32, 32))
    loss = F.cross_entropy(logits, torch.arange(4))
    assert logits.dtype == loss.dtype == torch.float32
    loss.backward()
    for name, param in prompts.named_parameters():
        assert param.dtype == param.grad.dtype == torch.float32, name
        assert torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, name
    assert all(p.grad is None for p in vit.model.parameters())


def test_low_precision_on_cpu_is_honoured_with_a_warning(caplog):
    caplog.set_level(logging.WARNING, logger="flwr.fedapp")
    register_tiny_configs()
    # Past the per-process cache, so the load (and its warning) happens whatever ran before.
    clip = _load_cached.__wrapped__(TINY_CLIP, "", "cpu", "bf16")
    assert clip.compute_dtype == torch.bfloat16
    [message] = [r.getMessage() for r in caplog.records if r.name == "flwr.fedapp"]
    assert message.startswith("precision = bf16 on CPU: the frozen encoders of fedapp-tiny-clip run in bfloat16")
    assert "use precision = fp32 for CPU runs" in message
    caplog.clear()
    _load_cached.__wrapped__(TINY_CLIP, "", "cpu", "fp32")
    assert not [r for r in caplog.records if r.name == "flwr.fedapp"]


def test_promptfl_client_fits_and_evaluates_in_bf16_on_cpu():
    config = _prompt_config(precision="bf16")
    client = _client(PromptFLClient, config, 1)
    start = PromptFLStrategy(config, 10).initial_arrays()
    arrays, n, metrics = client.fit(start, {"server-round": 1})
    assert client.clip.compute_dtype == torch.bfloat16
    assert [a.dtype for a in arrays] == [np.float32] and arrays[0].shape == start[0].shape
    assert np.isfinite(arrays[0]).all() and not np.array_equal(arrays[0], start[0])
    assert n > 0 and np.isfinite(metrics["train_loss"])
    loss, n_test, eval_metrics = client.evaluate(arrays, {"server-round": 1})
    assert np.isfinite(loss) and n_test > 0 and 0.0 <= eval_metrics["accuracy"] <= 1.0


def test_pep_fedpt_client_fits_in_bf16_on_cpu():
    config = _pep_config(precision="bf16")
    start = PEPFedPTStrategy(config, 10).initial_arrays()
    client = _client(PEPFedPTClient, config, 0)
    arrays, _, metrics = client.fit(start, {"server-round": 1})
    assert client.clip.compute_dtype == torch.bfloat16
    assert [a.shape for a in arrays] == [a.shape for a in start]
    assert all(a.dtype == np.float32 for a in arrays[:-1]) and arrays[-1].dtype == np.int64
    assert all(np.isfinite(a).all() for a in arrays) and np.isfinite(metrics["train_loss"])
    assert any(not np.array_equal(a, b) for a, b in zip(arrays[:-2], start[:-2], strict=True))


# ----- one frozen backbone per worker process ----------------------------------------


def test_clients_built_in_one_process_share_one_backbone():
    config = _prompt_config()
    first, second = _client(PromptFLClient, config, 0), _client(PromptFLClient, config, 1)
    assert first.clip is second.clip and first.clip.model is second.clip.model
    # Other run settings (seed, lr) do not change the key: still the same module.
    other_run = _client(PromptFLClient, _prompt_config(seed=3, lr=0.01), 2)
    assert other_run.clip.model is first.clip.model
    # A different precision is a different backbone.
    bf16 = _client(PromptFLClient, _prompt_config(precision="bf16"), 0)
    assert bf16.clip.model is not first.clip.model
    assert bf16.clip is _client(PromptFLClient, _prompt_config(precision="bf16"), 3).clip


def test_visual_prompt_clients_share_one_backbone_per_precision():
    config = _pep_config()
    first, second = _client(PEPFedPTClient, config, 0), _client(PEPFedPTClient, config, 2)
    assert first.clip.model is second.clip.model
    start = PEPFedPTStrategy(config, 10).initial_arrays()
    assert first._model(start).visual is second._model(start).visual  # the prompted models wrap it, not copy
    bf16 = _client(PEPFedPTClient, _pep_config(precision="bf16"), 0)
    assert bf16.clip.model is not first.clip.model and bf16.clip.precision == "bf16"


# ----- the simulation's client resources ---------------------------------------------


def test_federation_overrides_pass_a_fractional_gpu_share_to_flower():
    assert federation_overrides(8, 2, 0.25) == (
        "num-supernodes=8 client-resources-num-cpus=2 client-resources-num-gpus=0.25"
    )
    assert federation_overrides(3, 1, 1).endswith("client-resources-num-gpus=1")
    assert "num-gpus" not in federation_overrides(3, 1, 0.0)


@pytest.mark.parametrize("gpus", [0.0, 0.1, 0.25, 0.5, 1.0, 2.0])
def test_shares_below_one_and_whole_gpus_are_accepted(gpus):
    check_client_resources(1, gpus, gpus_available=2)
    check_client_resources(4, gpus)  # nothing to compare against when the count is not known


@pytest.mark.parametrize(
    "cpus, gpus, available, message",
    [
        (1, -0.25, None, r"--gpus-per-client -0\.25: must be 0 \(no GPU\), a share of one GPU below 1"),
        (1, float("nan"), None, r"--gpus-per-client nan: must be 0"),
        (1, 1.5, None, r"--gpus-per-client 1\.5: above 1, Ray only hands out whole GPUs; use 1 or 2"),
        (1, 0.25, 0, r"--gpus-per-client 0\.25: torch finds no GPU on this machine"),
        (1, 2.0, 1, r"--gpus-per-client 2: torch finds only 1 GPU\(s\)"),
        (0, 0.0, None, r"--cpus-per-client 0: each client needs at least 1 CPU"),
    ],
)
def test_nonsense_client_resources_are_refused_naming_the_flag(cpus, gpus, available, message):
    with pytest.raises(ConfigError, match=message):
        check_client_resources(cpus, gpus, gpus_available=available)


def test_the_launcher_refuses_a_bad_gpu_share_before_any_work(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    assert launch.main(["--gpus-per-client", "1.5", "--flwr-home", str(home)]) == 2
    assert "error: --gpus-per-client 1.5: above 1" in capsys.readouterr().err
    monkeypatch.setattr(launch, "visible_gpus", lambda: 0)
    assert launch.main(["--gpus-per-client", "0.25", "--flwr-home", str(home)]) == 2
    assert "torch finds no GPU" in capsys.readouterr().err
    assert not home.exists()


def test_on_a_ray_cluster_the_gpu_share_is_not_checked_against_this_machine(monkeypatch):
    """With ``RAY_ADDRESS`` the workers run on the cluster's nodes (docs/scale.md): a head
    without a GPU may still ask for GPU shares; without it, this machine's GPUs are counted."""
    monkeypatch.setattr(launch, "visible_gpus", lambda: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert launch.gpus_to_check(0.25) == 0 and launch.gpus_to_check(0.0) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert launch.gpus_to_check(0.25) is None


class _RayStub:
    """What :func:`fedapp.client_app.simulated_without_gpu` asks of Ray, as a worker would answer."""

    WORKER_MODE, SCRIPT_MODE = 1, 0

    def __init__(self, mode: int, gpus: list[str], initialized: bool = True) -> None:
        self.mode, self.gpus, self.initialized = mode, gpus, initialized

    def is_initialized(self) -> bool:
        return self.initialized

    def get_runtime_context(self):
        stub = self

        class Context:
            worker = type("Worker", (), {"mode": stub.mode})()

            def get_accelerator_ids(self):
                return {"GPU": stub.gpus, "TPU": []}

        return Context()


@pytest.mark.parametrize(
    ("ray", "device"),
    [
        (None, "cuda"),  # not in Ray: torch decides (here the stand-in GPU)
        (_RayStub(_RayStub.SCRIPT_MODE, []), "cuda"),  # the driver of an in-process simulation
        (_RayStub(_RayStub.WORKER_MODE, ["0"]), "cuda"),  # a worker given a GPU
        (_RayStub(_RayStub.WORKER_MODE, []), "cpu"),  # a worker given none, whatever it can see
        (_RayStub(_RayStub.WORKER_MODE, [], initialized=False), "cuda"),
    ],
)
def test_a_simulated_client_given_no_gpu_trains_on_the_cpu_though_it_sees_one(ray, device, monkeypatch):
    from fedapp.client_app import client_device  # noqa: PLC0415 - Flower's ClientApp only for this test

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch sees a GPU ...
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "stand-in")
    if ray is None:
        monkeypatch.delitem(sys.modules, "ray", raising=False)
    else:  # ... and Ray, where there is a Ray, says whether this worker may use one
        monkeypatch.setitem(sys.modules, "ray", ray)
    assert client_device("auto").type == device
    assert client_device("cpu").type == "cpu"
