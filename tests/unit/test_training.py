"""The one training loop's optimizer: torch's SGD update, bit for bit, without torch.optim's step wrapper."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedapp.training import FunctionalSGD


def _train(make_optimizer, steps: int = 6) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3), nn.Linear(3, 3))
    model[2].bias.requires_grad_(False)  # frozen: never stepped
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad])
    data = torch.Generator().manual_seed(1)
    for step in range(steps):
        optimizer.zero_grad()
        x, y = torch.randn(8, 5, generator=data), torch.randint(0, 3, (8,), generator=data)
        # Every other step the last layer is left out of the graph: its grad stays None
        # and its momentum buffer must wait, as torch.optim.SGD's does.
        head = model[:3] if step % 2 else model
        nn.functional.cross_entropy(head(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4)])
def test_functional_sgd_equals_torch_sgd_bit_for_bit(momentum, weight_decay):
    ours = _train(lambda ps: FunctionalSGD(ps, lr=0.1, momentum=momentum, weight_decay=weight_decay))
    torchs = _train(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=momentum, weight_decay=weight_decay))
    assert all(torch.equal(a, b) for a, b in zip(ours, torchs, strict=True))
    untrained = _train(lambda ps: FunctionalSGD(ps, lr=0.0))
    assert not all(torch.equal(a, b) for a, b in zip(ours, untrained, strict=True))  # it did step


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_learning_rate_scale_equals_torch_sgds_parameter_groups(momentum):
    """A prompt learning-rate multiplier: each parameter at lr times its scale, as torch.optim.SGD's
    parameter groups give (the first layer here at 10x, the rest at lr)."""

    def groups(ps: list) -> list[dict]:
        return [{"params": ps[:2], "lr": 1.0}, {"params": ps[2:]}]

    def scale_of(ps: list):
        first = {id(p) for p in ps[:2]}
        return lambda p: 10.0 if id(p) in first else 1.0

    ours = _train(lambda ps: FunctionalSGD(ps, lr=0.1, momentum=momentum, lr_scale=scale_of(ps)))
    torchs = _train(lambda ps: torch.optim.SGD(groups(ps), lr=0.1, momentum=momentum))
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(ours, torchs, strict=True))
    unscaled = _train(lambda ps: FunctionalSGD(ps, lr=0.1, momentum=momentum))
    assert not torch.allclose(ours[0], unscaled[0])
    assert torch.equal(
        _train(lambda ps: FunctionalSGD(ps, lr=0.1, lr_scale=lambda p: 1.0))[0],
        _train(lambda ps: FunctionalSGD(ps, lr=0.1))[0],
    )
