"""FedPer (Arivazhagan et al., 2019): federated base layers, a personal classifier head.

Every client runs the same architecture. The base layers (everything but the
``head``) are averaged across clients; each client keeps its own head, trained
on its own labels, so the head personalises to its label skew. The mirror image
of LG-FedAvg, which shares the head and keeps the representation local.

Nothing here imports Flower: plain torch, unit-testable alone.
"""

from __future__ import annotations

from torch import nn


class BaseLayers(nn.Module):
    """The layers of ``model`` that FedPer shares: every child module but ``head``.

    A view, not a copy: its parameters are the model's own tensors, so loading
    arrays into it updates the model, and its ``state_dict`` is the payload.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        children = dict(model.named_children())
        if "head" not in children:
            raise ValueError(f"{type(model).__name__} has no 'head' module to keep personal")
        for name, child in children.items():
            if name != "head":
                self.add_module(name, child)
