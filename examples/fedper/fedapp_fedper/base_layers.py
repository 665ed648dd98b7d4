"""FedPer (Arivazhagan et al., 2019): federated base layers, personalisation layers.

Every client runs the same architecture. The base layers are averaged across
clients; each client keeps its model's last ``K_P`` layers with weights (by default
one: the classifier ``head``), trained on its own labels, so they personalise to
its label skew. With ``K_P = 1``, the mirror image of LG-FedAvg, which shares the
head and keeps the representation local.

Nothing here imports Flower: plain torch, unit-testable alone.
"""

from __future__ import annotations

from torch import nn


def layers_with_weights(model: nn.Module) -> list[str]:
    """The names of ``model``'s child modules that hold parameters, in order (a pooling layer holds none)."""
    return [name for name, child in model.named_children() if any(True for _ in child.parameters())]


class BaseLayers(nn.Module):
    """The layers of ``model`` that FedPer shares: every child module but its last
    ``personal_layers`` with weights.

    A view, not a copy: its parameters are the model's own tensors, so loading
    arrays into it updates the model, and its ``state_dict`` is the payload.
    """

    def __init__(self, model: nn.Module, personal_layers: int = 1) -> None:
        super().__init__()
        weighted = layers_with_weights(model)
        if not 1 <= personal_layers < len(weighted):
            raise ValueError(
                f"{type(model).__name__} has {len(weighted)} layers with weights: keep 1..{len(weighted) - 1} "
                f"personal, not {personal_layers}"
            )
        personal = set(weighted[-personal_layers:])
        for name, child in model.named_children():
            if name not in personal:
                self.add_module(name, child)
