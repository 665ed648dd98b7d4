"""FedD2P edge client: a small VGG-block CNN that never sees the foundation model.

It trains its own model (S0: cross-entropy only in its first round; then
cross-entropy plus KL to the server's knowledge of each sample's class) and
uploads per-class soft labels at temperature tau1 with class counts. Nothing
here imports open_clip.
"""

from __future__ import annotations

from torch import Tensor, nn

from fedapp.aggregation import Arrays
from fedapp.clients.per_class import PerClassClient
from fedapp.methods.fedd2p import distillation_term, knowledge_loss, soft_labels
from fedapp.methods.fedd2p_options import FedD2PClientOptions
from fedapp.training import LossFn, cross_entropy_loss


class FedD2PClient(PerClassClient):
    """FedD2P and its baselines B2/B3 (they differ only on the server)."""

    options: FedD2PClientOptions

    def statistic(self, model: nn.Module, x: Tensor) -> Tensor:
        return soft_labels(model, x, self.options.d2p_tau1)

    @property
    def distil_temperature(self) -> float:
        """S3's temperature: the paper's Eq. 3 softens the client's output with the same
        sigma_tau as its soft labels (Eq. 2), tau1 = 10, unless ``d2p-distil-temperature`` says otherwise."""
        return self.options.d2p_distil_temperature or self.options.d2p_tau1

    def loss(self, global_stats: Arrays) -> LossFn:
        return knowledge_loss(global_stats[0], global_stats[1], self.options.kd_weight, self.distil_temperature)

    def round_epochs(self) -> int | None:
        warmup = self.options.warmup_epochs
        return warmup if warmup and self.personal_rounds() == 0 else None

    def round_figures(self, model: nn.Module, global_stats: Arrays) -> dict[str, float]:
        """What S3 leaves: the KL to the server's knowledge after this round's training."""
        knowledge, present = global_stats
        temperature = self.distil_temperature
        return {
            "distillation_kl": distillation_term(model, self.data.train, knowledge, present, temperature, self.device)
        }

    def round_loss(self, global_stats: Arrays) -> LossFn:
        # S0: the client's first round trains on its labels alone; later rounds distil.
        return cross_entropy_loss if self.personal_rounds() == 0 else self.loss(global_stats)
