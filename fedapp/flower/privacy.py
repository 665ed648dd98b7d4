"""Client-level differential privacy: Flower's fixed-clipping wrappers, fitted to our strategies.

With ``dp`` = ``server`` the server clips every client's update (its change to
the global arrays) to L2 norm ``dp-clipping-norm`` = C; with ``dp`` = ``client``
the clients clip (Flower's ``fixedclipping_mod``, in every ClientApp of this
project, see :func:`fedapp.flower.client_mods.dp_clipping_mod`) and the server checks the bound. Either
way the server then averages the clipped updates and adds Gaussian noise of
standard deviation ``sigma * C / m`` (``sigma`` = ``dp-noise-multiplier``, m =
the clients sampled that round) to every element of the new global arrays.

Three things differ from Flower's wrappers as they are, each needed for the
guarantee or for this project:

* the average is uniform over clients and divided by m, the number sampled
  (DP-FedAvg's fixed denominator, McMahan et al. 2018), not example-weighted:
  with example weights a large client moves the mean by more than C/m, beyond
  what the noise is calibrated to. A round with fewer usable replies than m
  moves the global arrays proportionally less instead of being dropped
  (Flower's wrappers skip any round with a failure). The round's ``train_loss``
  is then the clients' plain mean too;
* the noised aggregate becomes what the strategy holds (``global_arrays``,
  checkpoints), i.e. exactly what the clients receive next;
* the noise is drawn from fresh OS entropy every round, never from ``seed``
  (anyone who reads the config could otherwise subtract it).

The privacy budget (:func:`epsilon`) is that of client-level (user-level) DP
under add/remove-one-client adjacency: the released global arrays of all rounds
so far reveal little about whether any one client, with all its data, took part.
It comes from an RDP accountant for the sampled Gaussian mechanism (integer
orders, Mironov et al. 2019) with q = sampled / training clients. Our sampler
draws a fixed-size subset each round; the Poisson-sampling analysis is the
customary approximation for it (exact when every client trains every round, q = 1).
Client-reported metrics (train loss, accuracy) are not privatised.
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from flwr.supercore.differential_privacy import compute_stdv

from fedapp.aggregation import Arrays
from fedapp.config import RunConfig, check_dp_config, held_out_partitions
from fedapp.dp import clip_update, epsilon, same_layout, sampled_per_round, sampling_rate, update_norm
from fedapp.errors import ConfigError

log = logging.getLogger("flwr.fedapp")


# ----- server side -----------------------------------------------------------------


def client_sampling(config: RunConfig) -> tuple[int, int, float]:
    """``(training clients, min-clients, fraction-fit)`` of a run, as :mod:`fedapp.dp` takes them:
    every partition may be sampled to train but the held-out ones."""
    training = config.num_partitions - len(held_out_partitions(config))
    return training, config.min_clients, config.fraction_fit


def _uniform(res: FitRes) -> FitRes:
    """The reply with weight 1 (a positive example count becomes 1; anything else stays, to be refused)."""
    n = res.num_examples
    weight = 1 if isinstance(n, int | np.integer) and not isinstance(n, bool) and n > 0 else n
    return FitRes(status=res.status, parameters=res.parameters, num_examples=weight, metrics=res.metrics)


class _FixedClippingMixin:
    """What both of our wrappers share; mixed in before the Flower wrapper it extends."""

    strategy: object
    noise_multiplier: float
    clipping_norm: float
    num_sampled_clients: int
    current_round_params: Arrays
    mode = ""

    def __init__(self, strategy, config: RunConfig) -> None:
        super().__init__(  # type: ignore[call-arg]
            strategy,
            config.dp_noise_multiplier,
            config.dp_clipping_norm,
            sampled_per_round(*client_sampling(config)),
        )
        self.delta = config.dp_delta
        self.q = sampling_rate(*client_sampling(config))
        self.current_round_params = []
        recorder = strategy.recorder
        if recorder is not None:
            recorder.summary_extra.update(self.summary_fields(strategy.completed_rounds))
            recorder.write_summary()

    def __getattr__(self, name: str):
        # The wrapped strategy's own attributes (global_arrays, history, recorder, ...) stay reachable.
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.strategy!r}, sigma={self.noise_multiplier:g}, C={self.clipping_norm:g})"

    def summary_fields(self, rounds: int) -> dict[str, object]:
        """What summary.json says about the privacy of the arrays released after ``rounds`` rounds."""
        return {
            "dp": self.mode,
            "dp_epsilon": epsilon(self.q, self.noise_multiplier, rounds, self.delta),
            "dp_delta": self.delta,
            "dp_noise_multiplier": self.noise_multiplier,
            "dp_clipping_norm": self.clipping_norm,
            "dp_sampling_rate": self.q,
            "dp_rounds": rounds,
            "dp_guarantee": (
                "client-level (user-level) (dp_epsilon, dp_delta)-DP of the global arrays released in all rounds "
                "so far, w.r.t. adding or removing one participating client with all its data; RDP accountant of "
                "the sampled Gaussian at q = dp_sampling_rate; client-reported metrics are not covered"
            ),
        }

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        instructions = super().configure_fit(server_round, parameters, client_manager)  # type: ignore[misc]
        self.current_round_params = parameters_to_ndarrays(parameters)
        if instructions:  # the noise's denominator: the clients actually sampled this round
            self.num_sampled_clients = len(instructions)
        return instructions

    def _aggregate_clipped(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Uniform mean of the (clipped) replies through the wrapped strategy, rescaled to the
        fixed denominator, plus noise; the result is also what the strategy holds from now on."""
        strategy = self.strategy
        current = self.current_round_params
        aggregated, metrics = strategy.aggregate_fit(server_round, [(p, _uniform(r)) for p, r in results], failures)
        # Every round with a fit counts, also one skipped for too few replies (conservative).
        fields = self.summary_fields(server_round)
        eps = fields["dp_epsilon"]
        strategy.add_round_metric(server_round, "dp_epsilon", eps)
        if strategy.recorder is not None:
            strategy.recorder.summary_extra.update(fields)
        if aggregated is None:
            return None, metrics
        used = strategy.clients_fit(server_round)
        scale = used / max(self.num_sampled_clients, used)
        std = compute_stdv(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients)
        rng = np.random.default_rng()  # fresh OS entropy: unpredictable, so not reproducible
        noised = [
            (old + (new.astype(np.float64) - old) * scale + rng.normal(0.0, std, new.shape)).astype(new.dtype)
            for new, old in zip(parameters_to_ndarrays(aggregated), current, strict=True)
        ]
        strategy.global_arrays = noised
        log.info(
            "round %d: DP average of %d clipped updates over %d sampled, noise std %.4g; epsilon %.4g (delta %g)",
            server_round,
            used,
            self.num_sampled_clients,
            std,
            eps,
            self.delta,
        )
        return ndarrays_to_parameters(noised), metrics


class ServerSideFixedClipping(_FixedClippingMixin, DifferentialPrivacyServerSideFixedClipping):
    """Flower's server-side fixed clipping around one of our strategies (``dp`` = ``server``)."""

    mode = "server"

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        current = self.current_round_params
        clipped = []
        for proxy, res in results:
            try:
                arrays = parameters_to_ndarrays(res.parameters)
            except Exception:  # undecodable: the strategy refuses it with its reason
                clipped.append((proxy, res))
                continue
            if same_layout(arrays, current):  # a reply of another layout is refused by the strategy
                arrays = clip_update(arrays, current, self.clipping_norm)
                res = FitRes(res.status, ndarrays_to_parameters(arrays), res.num_examples, res.metrics)
            clipped.append((proxy, res))
        return self._aggregate_clipped(server_round, clipped, failures)


class ClientSideFixedClipping(_FixedClippingMixin, DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side fixed clipping around one of our strategies (``dp`` = ``client``).

    Flower's wrapper sends the clipping norm; the clients' ``fixedclipping_mod``
    clips. A reply whose update is still longer than C (a ClientApp without the
    mod) is left out of the round, since taking it would void the guarantee.
    """

    mode = "client"

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        current = self.current_round_params
        # float32 rounding of `current + clipped update` may overshoot C by a few ulps of the arrays.
        tolerance = self.clipping_norm * 1e-4 + 8 * float(np.finfo(np.float32).eps) * update_norm(
            current, [np.zeros_like(a) for a in current]
        )
        accepted: list[tuple[ClientProxy, FitRes]] = []
        failures = list(failures)
        for proxy, res in results:
            try:
                arrays = parameters_to_ndarrays(res.parameters)
            except Exception:
                accepted.append((proxy, res))
                continue
            norm = update_norm(arrays, current) if same_layout(arrays, current) else 0.0
            if norm > self.clipping_norm + tolerance:
                name = self.strategy.client_name(proxy, res.metrics)
                failures.append(
                    ValueError(
                        f"{name}: update norm {norm:.4g} exceeds the clipping norm {self.clipping_norm:g} "
                        "(does its ClientApp clip, with fixedclipping_mod?)"
                    )
                )
                continue
            accepted.append((proxy, res))
        return self._aggregate_clipped(server_round, accepted, failures)


def wrap_for_privacy(strategy, config: RunConfig):
    """``strategy`` itself when ``dp`` is off, else inside the configured DP wrapper.

    Raises ConfigError when the shared arrays are not all floating point: integer
    arrays (BatchNorm's batch counters, next to its running statistics, which
    are data statistics rather than parameters) can be neither clipped in place
    nor meaningfully noised, and noise could turn running variances negative.
    """
    mode = config.dp
    if mode == "off":
        return strategy
    check_dp_config(config)
    arrays = strategy.global_arrays or strategy.initial_arrays()
    if not arrays or not all(np.issubdtype(a.dtype, np.floating) for a in arrays):
        kinds = sorted({str(a.dtype) for a in arrays if not np.issubdtype(a.dtype, np.floating)})
        raise ConfigError(
            f"config key 'dp' = {mode!r}: method {config['method']!r} with this model shares non-float arrays "
            f"({', '.join(kinds) or 'none at all'}; e.g. BatchNorm's counters and running statistics, as in the "
            "vgg-* models), which cannot be clipped and noised; use a model without BatchNorm (cnn-1 ... cnn-5)"
        )
    wrapper = ServerSideFixedClipping if mode == "server" else ClientSideFixedClipping
    return wrapper(strategy, config)
