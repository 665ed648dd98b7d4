"""Client-level differential privacy (fedapp.flower.privacy): clipping, noise, the accountant, config, a run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.common import (
    Code,
    EvaluateRes,
    FitIns,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server import SimpleClientManager
from flwr.supercore.task_identity import TaskIdentity

from fedapp.config import resolve_run_config
from fedapp.dp import epsilon, rdp_sampled_gaussian, sampled_per_round, sampling_rate, update_norm
from fedapp.errors import ConfigError
from fedapp.flower.client_mods import dp_clipping_mod
from fedapp.flower.driver import PartitionProxy
from fedapp.flower.privacy import ClientSideFixedClipping, ServerSideFixedClipping, client_sampling, wrap_for_privacy
from fedapp.strategies import FedAvgStrategy, LGFedAvgStrategy

C = 1.0


class _Spy(LGFedAvgStrategy):
    """LG-FedAvg (a 500x10 head) that keeps what reaches its aggregation."""

    def aggregate_updates(self, server_round, updates):
        self.received = [u.arrays for u in updates]
        return super().aggregate_updates(server_round, updates)


def dp_config(mode: str = "server", **overrides):
    return resolve_run_config(
        {
            "method": "lg-fedavg",
            "num-partitions": 3,
            "dp": mode,
            "dp-clipping-norm": C,
            "dp-noise-multiplier": 0.0,
            **overrides,
        }
    )


def start_round(wrapper, clients: int = 3):
    """Round 1 configured for ``clients`` proxies; the fit instructions and the arrays sent."""
    manager = SimpleClientManager()
    proxies = [PartitionProxy(i) for i in range(clients)]
    for proxy in proxies:
        manager.register(proxy)
    sent = wrapper.initialize_parameters(manager)
    instructions = wrapper.configure_fit(1, sent, manager)
    return proxies, instructions, parameters_to_ndarrays(sent)


def reply(proxy, arrays, num_examples=10):
    metrics = {"train_loss": 1.0, "partition_id": proxy.partition}
    return proxy, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), num_examples, metrics)


def shifted(current, direction_seed: int, norm: float):
    """``current`` plus a random update of exactly ``norm`` (float32 arrays)."""
    rng = np.random.default_rng(direction_seed)
    update = [rng.normal(size=a.shape) for a in current]
    scale = norm / math.sqrt(sum(float(np.sum(u * u)) for u in update))
    return [(a + u * scale).astype(a.dtype) for a, u in zip(current, update, strict=True)]


# ----- clipping -------------------------------------------------------------------


def test_server_side_clipping_bounds_every_update_the_strategy_receives():
    strategy = _Spy(dp_config(), num_classes=10)
    wrapper = wrap_for_privacy(strategy, strategy.config)
    assert isinstance(wrapper, ServerSideFixedClipping)
    proxies, _, current = start_round(wrapper)
    small = shifted(current, 3, 0.3)
    replies = [
        reply(proxies[0], shifted(current, 1, 100.0), num_examples=1000),
        reply(proxies[1], shifted(current, 2, 7.5), num_examples=10),
        reply(proxies[2], small, num_examples=5),
    ]
    params, _ = wrapper.aggregate_fit(1, replies, [])

    assert len(strategy.received) == 3
    norms = [update_norm(arrays, current) for arrays in strategy.received]
    assert all(n <= C + 1e-6 for n in norms), norms
    assert norms[0] == pytest.approx(C, rel=1e-5) and norms[1] == pytest.approx(C, rel=1e-5)
    small_received = next(a for a in strategy.received if update_norm(a, current) < 0.5)
    assert all(np.array_equal(a, b) for a, b in zip(small_received, small, strict=True))  # untouched
    # A uniform average over the clients (example counts 1000, 10, 5 do not weigh), and what the strategy holds.
    aggregate = parameters_to_ndarrays(params)
    expected = [np.mean([u[i] for u in strategy.received], axis=0) for i in range(len(current))]
    for got, want in zip(aggregate, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(strategy.global_arrays, aggregate, strict=True))


def test_a_failed_client_shrinks_the_step_by_the_fixed_denominator():
    strategy = _Spy(dp_config(), num_classes=10)
    wrapper = wrap_for_privacy(strategy, strategy.config)
    proxies, instructions, current = start_round(wrapper)
    assert len(instructions) == wrapper.num_sampled_clients == 3
    replies = [reply(proxies[0], shifted(current, 1, 50.0)), reply(proxies[1], shifted(current, 2, 50.0))]
    params, _ = wrapper.aggregate_fit(1, replies, [RuntimeError("node-2 lost")])
    step = [a - c for a, c in zip(parameters_to_ndarrays(params), current, strict=True)]
    received = [[a - c for a, c in zip(u, current, strict=True)] for u in strategy.received]
    for i, s in enumerate(step):  # sum of the two clipped updates over the 3 sampled, not their mean
        np.testing.assert_allclose(s, (received[0][i] + received[1][i]) / 3, atol=1e-6)


@pytest.fixture
def task_identity(monkeypatch):
    """Messages outside a running SuperLink need a task identity."""
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def fit_message(arrays, config) -> Message:
    content = compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters(arrays), config), keep_input=True)
    return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


def run_mod(message: Message, trained):
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})

    def client(msg: Message, ctxt: Context) -> Message:
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(trained), 10, {})
        return Message(content=compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)

    out = dp_clipping_mod(message, context, client)
    return parameters_to_ndarrays(compat.recorddict_to_fitres(out.content, keep_input=False).parameters)


@pytest.mark.usefixtures("task_identity")
def test_client_side_mod_clips_when_the_server_asks_and_passes_through_otherwise():
    rng = np.random.default_rng(0)
    current = [rng.normal(size=(500, 10)).astype(np.float32), rng.normal(size=10).astype(np.float32)]
    trained = shifted(current, 1, 40.0)
    clipped = run_mod(fit_message(current, {"server-round": 1, "clipping_norm": C}), trained)
    assert update_norm(clipped, current) == pytest.approx(C, rel=1e-5)
    assert update_norm(clipped, current) <= C + 1e-6
    small = shifted(current, 2, 0.5)
    assert all(
        np.allclose(a, b)
        for a, b in zip(run_mod(fit_message(current, {"clipping_norm": C}), small), small, strict=True)
    )
    # dp = off / server: no clipping norm in the config, and the reply is untouched (Flower's mod would raise).
    untouched = run_mod(fit_message(current, {"server-round": 1}), trained)
    assert all(np.array_equal(a, b) for a, b in zip(untouched, trained, strict=True))


def test_client_side_wrapper_sends_the_norm_and_leaves_out_an_unclipped_update():
    strategy = _Spy(dp_config("client"), num_classes=10)
    wrapper = wrap_for_privacy(strategy, strategy.config)
    assert isinstance(wrapper, ClientSideFixedClipping)
    proxies, instructions, current = start_round(wrapper)
    assert all(ins.config["clipping_norm"] == C for _, ins in instructions)
    replies = [
        reply(proxies[0], shifted(current, 1, 0.9)),
        reply(proxies[1], shifted(current, 2, C)),
        reply(proxies[2], shifted(current, 3, 5.0)),  # a ClientApp that did not clip
    ]
    wrapper.aggregate_fit(1, replies, [])
    assert len(strategy.received) == 2
    evaluations = [(p, EvaluateRes(Status(Code.OK, ""), 0.5, 10, {"accuracy": 0.5})) for p in proxies]
    wrapper.aggregate_evaluate(1, evaluations, [])
    record = wrapper.history[-1]
    assert record.clients_failed == 1
    assert "exceeds the clipping norm" in record.extra["left_out_reasons"][0]
    assert record.extra["dp_epsilon"] == math.inf  # sigma = 0: clipping only, no privacy


# ----- noise ----------------------------------------------------------------------


def test_noise_has_std_sigma_c_over_m_and_becomes_the_global_state():
    sigma = 2.0
    strategy = _Spy(dp_config(**{"dp-noise-multiplier": sigma}), num_classes=10)
    wrapper = wrap_for_privacy(strategy, strategy.config)
    proxies, _, current = start_round(wrapper)
    replies = [reply(p, [a.copy() for a in current]) for p in proxies]  # nobody moved: the step is pure noise
    params, _ = wrapper.aggregate_fit(1, replies, [])
    noised = parameters_to_ndarrays(params)
    assert [a.dtype for a in noised] == [a.dtype for a in current]
    noise = np.concatenate([(a.astype(np.float64) - c).ravel() for a, c in zip(noised, current, strict=True)])
    assert noise.size == 5010
    assert np.std(noise) == pytest.approx(sigma * C / 3, rel=0.06)
    assert abs(np.mean(noise)) < 0.05
    assert all(np.array_equal(a, b) for a, b in zip(strategy.global_arrays, noised, strict=True))


def test_the_strategy_hooks_the_wrappers_use():
    strategy = _Spy(dp_config(), num_classes=10)
    wrapper = wrap_for_privacy(strategy, strategy.config)
    proxies, _, current = start_round(wrapper)
    assert strategy.clients_fit(1) == 0  # configured, nothing aggregated yet
    assert strategy.client_name(proxies[1]) == "client node-1"  # full participation: partitions not asked
    assert strategy.client_name(proxies[1], {"partition_id": 1}) == "client node-1 (partition 1)"
    wrapper.aggregate_fit(1, [reply(p, shifted(current, i, 0.5)) for i, p in enumerate(proxies[:2])], [])
    assert strategy.clients_fit(1) == 2 and strategy.clients_fit(2) == 0
    replaced = [np.full_like(a, 0.25) for a in current]
    strategy.global_arrays = replaced
    assert all(np.array_equal(a, b) for a, b in zip(strategy.global_arrays, replaced, strict=True))
    assert strategy.expected_update() is not None and strategy.expected_update()[0].shape == current[0].shape
    assert wrapper.global_arrays[0][0, 0] == 0.25  # the wrapper reads through to the strategy


# ----- accountant ---------------------------------------------------------------------


def test_rdp_without_subsampling_is_the_gaussian_mechanisms():
    orders = np.arange(2, 40)
    np.testing.assert_allclose(rdp_sampled_gaussian(1.0, 1.5, orders), orders / (2 * 1.5**2))
    # Subsampling only helps, and q -> 1 approaches the unsampled value.
    assert np.all(rdp_sampled_gaussian(0.3, 1.5, orders) < orders / (2 * 1.5**2))
    np.testing.assert_allclose(rdp_sampled_gaussian(1 - 1e-9, 1.5, orders), orders / (2 * 1.5**2), rtol=1e-6)


@pytest.mark.parametrize(
    ("q", "sigma", "rounds", "delta", "expected"),
    [
        # Google's dp_accounting 0.6.0, RdpAccountant with the same integer orders (2..256, 320, ..., 1024).
        (0.5, 1.0, 2, 1e-5, 5.389281203449117),
        (1.0, 1.0, 10, 1e-5, 19.801691480042894),
        (0.1, 1.1, 100, 1e-5, 6.745046581290989),
        (0.01, 4.0, 1000, 1e-6, 0.3470365087619491),
        (1.0, 5.0, 1, 1e-5, 0.794522032537103),
    ],
)
def test_epsilon_matches_dp_accounting(q, sigma, rounds, delta, expected):
    assert epsilon(q, sigma, rounds, delta) == pytest.approx(expected, rel=1e-9)


def test_epsilon_falls_with_noise_and_grows_with_rounds():
    by_sigma = [epsilon(0.5, s, 10, 1e-5) for s in (0.5, 1.0, 2.0, 4.0, 8.0)]
    assert by_sigma == sorted(by_sigma, reverse=True) and len(set(by_sigma)) == 5
    by_rounds = [epsilon(0.5, 1.0, t, 1e-5) for t in (1, 2, 5, 20, 100)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 5
    assert epsilon(0.5, 1.0, 10, 1e-3) < epsilon(0.5, 1.0, 10, 1e-6)
    assert epsilon(0.5, 0.0, 3, 1e-5) == math.inf
    assert epsilon(0.5, 1.0, 0, 1e-5) == 0.0


def test_sampling_rate_follows_the_strategys_sampler():
    config = dp_config(**{"num-partitions": 10, "fraction-fit": 0.25, "min-clients": 2})
    assert client_sampling(config) == (10, 2, 0.25) and sampled_per_round(10, 2, 0.25) == 3
    config = dp_config(**{"num-partitions": 10, "fraction-fit": 0.1, "min-clients": 2, "held-out-fraction": 0.2})
    assert client_sampling(config) == (8, 2, 0.1)  # the 8 that may train
    assert sampled_per_round(8, 2, 0.1) == 2 and sampling_rate(8, 2, 0.1) == 0.25
    assert sampled_per_round(3, 5, 0.5) == 3  # never more than there are


# ----- configuration ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"method": "fedproto"}, "method 'fedproto' uploads per-class prototypes"),
        ({"method": "fd"}, "method 'fd' uploads per-class mean logits"),
        ({"method": "standalone"}, "method 'standalone' uploads nothing"),
        ({"dp-noise-multiplier": -0.5}, "'dp-noise-multiplier' = -0.5 must be >= 0"),
        ({"dp-clipping-norm": 0.0}, "'dp-clipping-norm' = 0.0 must be > 0"),
        ({"dp-delta": 0.0}, "'dp-delta' = 0.0 must be > 0"),
        ({"dp-delta": 1.0}, "'dp-delta' = 1.0 must be < 1"),
        ({"dp": "local"}, "'dp' = 'local' is not one of: off, server, client"),
        ({"secagg": True}, "cannot be combined"),
    ],
)
def test_config_refuses(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        resolve_run_config({"method": "fedavg", "dp": "server", **overrides})


def test_dp_off_accepts_any_method():
    assert resolve_run_config({"method": "fedproto"})["dp"] == "off"


def test_batchnorm_models_are_refused():
    config = resolve_run_config({"method": "fedavg", "model": "vgg-2", "dp": "client"})
    with pytest.raises(ConfigError, match=r"non-float arrays .*int64.*BatchNorm"):
        wrap_for_privacy(FedAvgStrategy(config, num_classes=10), config)


# ----- a run ----------------------------------------------------------------------------
