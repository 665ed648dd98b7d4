"""FedD2P server: the foundation model lives here, and only here.

Clients upload per-class soft labels and counts; the server pools them by
count into ``a``, trains the linguistic-assistance prompt generator against
``a`` through the frozen CLIP, and sends the generator's per-class
distributions ``g`` back. The two baselines differ only in what goes back:
``fedd2p-agg`` (B2) returns ``a`` itself, no FM; ``fedd2p-gt`` (B3) trains the
generator on ground truth alone (no distillation from ``a``).
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch

from fedapp.aggregation import Arrays
from fedapp.clientdata import clip_weights
from fedapp.errors import ConfigError, ModelError, StateError
from fedapp.flower.strategy import ClientUpdate
from fedapp.methods.fedd2p import (
    ServerKnowledgeModel,
    class_descriptions,
    class_distribution_figures,
    global_knowledge,
    train_generator,
)
from fedapp.methods.fedd2p_options import FedD2PClientOptions, FedD2POptions
from fedapp.models import load_open_clip
from fedapp.models.vpt import vision_tower_shape
from fedapp.strategies.per_class import PerClassStrategy
from fedapp.training import select_device

log = logging.getLogger("flwr.fedapp")


class FedD2PStrategy(PerClassStrategy):
    """Sends ``[knowledge (classes, classes), present (classes,)]``; receives
    ``[per-class soft labels (classes, classes), class counts (classes,)]``."""

    options: FedD2PClientOptions

    #: The per-class distributions sent back (FedD2P-agg: the pooled soft labels themselves).
    statistic_name = "class_knowledge"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.config.method != "fedd2p-agg":
            # Fail before round 1 on a backbone the generator cannot prompt.
            try:
                vision_tower_shape(self.config.clip_model)
            except ModelError as err:
                raise ConfigError(f"config key 'clip-model' = {self.config['clip-model']!r}: {err}") from err

    @property
    def generator_options(self) -> FedD2POptions:
        """The prompt generator's keys: FedD2P's and B3's (B2, ``fedd2p-agg``, has no generator)."""
        if not isinstance(self.options, FedD2POptions):
            raise TypeError(f"method {self.config.method!r} has no prompt generator")
        return self.options

    def statistic_dim(self) -> int:
        return self.num_classes

    @functools.cached_property
    def knowledge_model(self) -> ServerKnowledgeModel:
        """The frozen CLIP with the generator (built on first use; FedD2P-agg never builds it)."""
        cfg = self.config
        device = select_device(cfg.device)
        clip = load_open_clip(cfg.clip_model, clip_weights(cfg, cfg.clip_model), device=str(device))
        descriptions = class_descriptions(self.class_names, self.generator_options.d2p_template, cfg.dataset)
        log.info(
            "FedD2P class descriptions: %s", "; ".join(descriptions[:3]) + ("; ..." if len(descriptions) > 3 else "")
        )
        model = ServerKnowledgeModel(
            clip,
            descriptions,
            prompt_tokens=self.generator_options.d2p_prompt_tokens,
            kind=self.generator_options.d2p_generator,
            seed=cfg.seed,
        )
        return model.to(device)

    def strategy_state(self) -> dict[str, np.ndarray]:
        """The prompt generator's weights, once it exists (CLIP itself is frozen)."""
        if "knowledge_model" not in self.__dict__:
            return {}
        weights = self.knowledge_model.generator.state_dict()
        return {f"generator.{name}": value.detach().cpu().numpy() for name, value in weights.items()}

    def load_strategy_state(self, state: dict[str, np.ndarray]) -> None:
        if not state:
            return
        weights = {name.removeprefix("generator."): torch.from_numpy(value) for name, value in state.items()}
        try:
            self.knowledge_model.generator.load_state_dict(weights)
        except RuntimeError as err:
            raise StateError(f"the checkpoint's prompt generator does not fit this configuration: {err}") from err

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> Arrays:
        pooled, present = super().aggregate_updates(server_round, updates)
        self.add_distribution_metrics(server_round, "a", pooled, present)
        method = self.config.method
        if method == "fedd2p-agg":
            return [pooled, present]
        loss = train_generator(
            self.knowledge_model,
            pooled,
            present,
            steps=self.generator_options.d2p_steps,
            lr=self.generator_options.d2p_lr,
            temperature=self.generator_options.d2p_tau2,
            distil=method == "fedd2p",
        )
        self.add_round_metric(server_round, "generator_loss", loss)
        knowledge = global_knowledge(self.knowledge_model, self.generator_options.d2p_tau2)
        self.add_distribution_metrics(server_round, "g", knowledge, present)
        return [knowledge, present]

    def add_distribution_metrics(self, server_round: int, name: str, rows, present) -> None:
        """``<name>_true_class_mass`` and ``<name>_entropy`` of the round's ``a_c`` or ``g_c``:
        how sharp the knowledge is that goes to the prompt generator, and back to the devices."""
        for figure, value in class_distribution_figures(rows, present).items():
            self.add_round_metric(server_round, f"{name}_{figure}", value)
