"""The stand-in GPU (tests/fake_device.py): it refuses what CUDA refuses and lets through
what CUDA allows, so that the placement check over every method (tests/integration/
test_device_placement.py) can be trusted in both directions."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedapp.flops import forward_flops
from fedapp.methods import pfedlora
from fedapp.models import build_model
from fedapp.training import TensorData, evaluate, train
from tests.fake_device import DeviceMixError, fake_accelerator, on_accelerator


@pytest.fixture
def gpu(monkeypatch):
    with fake_accelerator(monkeypatch) as device:
        yield device


def _forward_flops_before_issue_40(module: nn.Module, input_shape: Sequence[int]) -> int:
    """fedapp.flops.forward_flops as it was (its forward pass), which failed every pFedLoRA
    client on a GPU: "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor)"."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            module(torch.zeros(1, *input_shape))
    finally:
        module.train(was_training)
    return 0


def test_the_old_forward_flops_is_refused_and_the_counter_is_not(gpu):
    net = pfedlora.ModelWithAdapter(build_model("cnn-1", 10), pfedlora.LowRankAdapter(500, 40, 10)).to(gpu)
    with pytest.raises(
        DeviceMixError, match=r"conv2d mixes devices: tensors on cuda:0 .* and on the CPU \[\(1, 3, 32, 32\)\]"
    ):
        _forward_flops_before_issue_40(net.model, (3, 32, 32))
    assert forward_flops(net.model, (3, 32, 32)) > 0


def test_moves_and_factories_land_where_they_are_asked(gpu):
    model = build_model("cnn-1", 10).to(gpu)
    weight = next(model.parameters())
    assert on_accelerator(weight) and weight.device == gpu and weight.is_cuda
    x = torch.randn(2, 3, 32, 32)
    assert not on_accelerator(x) and x.device.type == "cpu"
    moved = x.to(gpu)
    assert on_accelerator(moved) and not on_accelerator(x)  # the source stays on the CPU
    assert on_accelerator(torch.zeros(3, device=weight.device))
    assert on_accelerator(moved.to(torch.float64)) and on_accelerator(moved * 2)
    back = moved.cpu()
    assert not on_accelerator(back) and back.numpy().shape == (2, 3, 32, 32)


def test_what_cuda_refuses_is_refused(gpu):
    model = build_model("cnn-1", 10).to(gpu)
    with pytest.raises(DeviceMixError, match="conv2d mixes devices"):
        model(torch.zeros(1, 3, 32, 32))
    on_gpu = torch.ones(4, device=gpu)
    with pytest.raises(DeviceMixError, match="mixes devices"):
        on_gpu + torch.ones(4)
    with pytest.raises(DeviceMixError, match="mixes devices"):
        torch.cat([on_gpu, torch.ones(4)])
    with pytest.raises(DeviceMixError, match="to numpy"):
        on_gpu.numpy()


def test_what_cuda_allows_is_allowed(gpu):
    on_gpu = torch.arange(6.0, device=gpu)
    assert on_accelerator(on_gpu * torch.tensor(2.0))  # a 0-d CPU tensor is a scalar to CUDA
    assert on_accelerator(on_gpu[torch.tensor([0, 2])])  # CPU indices into a CUDA tensor
    on_gpu.copy_(torch.zeros(6))  # copies cross devices
    assert float(on_gpu.sum()) == 0.0 and on_gpu.tolist() == [0.0] * 6


def test_the_shared_loops_train_and_evaluate_on_the_stand_in(gpu):
    model = build_model("cnn-1", 10)
    data = TensorData(torch.randn(10, 3, 32, 32), torch.arange(10) % 10)  # on the CPU, as a client's splits
    result = train(model, data, epochs=1, batch_size=4, lr=0.1, momentum=0.9, seed=0, device=gpu)
    assert result.steps == 3 and result.flops > 0
    assert all(on_accelerator(p) and on_accelerator(p.grad) for p in model.parameters())
    assert 0.0 <= evaluate(model, data, device=gpu).accuracy <= 1.0
    logits = model(data.x[:2].to(gpu))
    assert on_accelerator(F.softmax(logits, dim=1))
