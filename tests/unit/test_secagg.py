"""Secure aggregation (SecAgg+): config rules, the client mod, and end-to-end runs
whose aggregate is checked against the plain example-weighted average of the
clients' (captured, unmasked) uploads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat

from fedapp.catalog import CATALOG, methods_where
from fedapp.client_app import make_client_app
from fedapp.config import METHODS, resolve_run_config
from fedapp.errors import ConfigError
from fedapp.flower.secure_aggregation import SecAggReplies, check_float_uploads
from fedapp.registry import strategy_class
from fedapp.strategies.shared_module import SharedModuleStrategy

CLIENTS = 3

# ----- config rules ---------------------------------------------------------------


def secagg_config(**extra):
    return resolve_run_config({"method": "promptfl", "num-partitions": CLIENTS, "secagg": True, **extra})


def test_every_method_is_either_allowed_or_refused_with_a_reason():
    allowed = methods_where(averages_parameters=True)
    assert set(allowed) <= set(METHODS)
    for method in set(METHODS) - set(allowed):
        assert CATALOG[method].uploads_note.startswith("uploads "), method
    for method in allowed:
        # The server does nothing but the example-weighted average SecAgg+ computes.
        cls = strategy_class(method)
        assert issubclass(cls, SharedModuleStrategy), method
        assert cls.aggregate_updates is SharedModuleStrategy.aggregate_updates, method


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"method": "fedproto"}, "method 'fedproto' cannot use secure aggregation, because .* per-class"),
        ({"method": "standalone"}, "method 'standalone' cannot use secure aggregation, because it uploads nothing"),
        ({"secagg-num-shares": 3, "secagg-reconstruction-threshold": 4}, "must be less than 'secagg-num-shares'"),
        ({"secagg-num-shares": 5, "secagg-reconstruction-threshold": 3}, "more than 'min-clients' = 2"),
        ({"secagg-num-shares": 2.5}, "whole number >= 3"),
        ({"secagg-num-shares": 2}, "whole number >= 3"),
        ({"secagg-reconstruction-threshold": 2.5}, "whole number"),
        ({"min-clients": 1}, "at least 2 clients per round"),
        ({"resume": True}, "resuming a run under secure aggregation is not supported"),
        ({"secagg-quantization-range": 2**31}, "overflow"),
        ({"secagg-clipping-range": 0.0}, "'secagg-clipping-range' = 0.0 must be > 0.0"),
    ],
)
def test_secagg_config_refusals(extra, message):
    with pytest.raises(ConfigError, match=message):
        secagg_config(**extra)


def test_secagg_keys_are_ignored_when_off_and_valid_settings_pass():
    resolve_run_config({"method": "fedproto", "secagg-num-shares": 2.5})  # secagg off: nothing to check
    config = secagg_config(**{"secagg-num-shares": 3, "secagg-reconstruction-threshold": 2})
    assert config["secagg"] and config["secagg-num-shares"] == 3.0


def test_integer_uploads_are_refused():
    # VGG models carry BatchNorm's integer batch counter, which SecAgg+ cannot average.
    strategy = strategy_class("fedavg")(secagg_config(method="fedavg", model="vgg-2"), 10)
    with pytest.raises(ConfigError, match="integer arrays"):
        check_float_uploads(strategy)
    check_float_uploads(strategy_class("fedavg")(secagg_config(method="fedavg", model="cnn-1"), 10))


# ----- the strategy's side, with replies as SecAggPlusWorkflow hands them over -------


class _Proxy:
    def __init__(self, cid: str) -> None:
        self.cid = cid


def workflow_results(aggregate, counts, losses):
    """What SecAggPlusWorkflow passes to aggregate_fit: per client its own count and
    metrics, all sharing one Parameters (the unmasked average, as float64)."""
    shared = ndarrays_to_parameters([np.asarray(a, np.float64) for a in aggregate])
    return [
        (_Proxy(str(i)), FitRes(Status(Code.OK, ""), shared, n, {"train_loss": loss, "partition_id": i}))
        for i, (n, loss) in enumerate(zip(counts, losses, strict=True))
    ]


def secure_strategy():
    strategy = strategy_class("promptfl")(secagg_config(), 10)
    strategy.secure_aggregation = SecAggReplies(8.0, 2**22, 1000.0)
    strategy.initialize_parameters(None)
    return strategy


def test_strategy_takes_the_pre_averaged_reply_once_and_counts_every_participant():
    strategy = secure_strategy()
    aggregate = [np.full(a.shape, 0.25) for a in strategy.global_arrays]
    params, metrics = strategy.aggregate_fit(1, workflow_results(aggregate, [10, 30, 60], [1.0, 2.0, 3.0]), [])
    got = parameters_to_ndarrays(params)
    assert [a.dtype for a in got] == [np.float32]  # the global arrays' dtype, not the workflow's float64
    np.testing.assert_array_equal(got[0], np.float32(0.25))
    assert metrics["train_loss"] == pytest.approx((10 * 1 + 30 * 2 + 60 * 3) / 100)
    round_log = strategy._round_log[1]
    assert round_log.clients_fit == 3 and not round_log.skipped
    # Each participant sent a masked int64 vector: twice the float32 arrays, plus headers and the weight.
    assert round_log.bytes_up == [round_log.bytes_up[0]] * 3 and round_log.bytes_up[0] > 2 * 8 * 64 * 4


def test_a_diverged_participant_spoils_the_secure_sum_and_skips_the_round():
    strategy = secure_strategy()
    before = strategy.global_arrays
    aggregate = [np.full(a.shape, 0.25) for a in strategy.global_arrays]
    params, _ = strategy.aggregate_fit(1, workflow_results(aggregate, [10, 30, 60], [1.0, math.nan, 3.0]), [])
    assert params is None
    round_log = strategy._round_log[1]
    assert round_log.skipped and round_log.clients_fit == 2 and round_log.clients_failed == 1
    assert any("cannot be taken apart" in reason for reason in round_log.left_out)
    np.testing.assert_array_equal(strategy.global_arrays[0], before[0])


# ----- the client's side --------------------------------------------------------------


def node_context() -> Context:
    node_config = {"partition-id": 0, "num-partitions": CLIENTS}
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def plain_fit_message() -> Message:
    ins = FitIns(ndarrays_to_parameters([np.zeros((8, 64), np.float32)]), {"server-round": 1})
    return Message(content=compat.fitins_to_recorddict(ins, True), dst_node_id=7, message_type=MessageType.TRAIN)


def test_client_app_runs_secaggplus_and_refuses_to_upload_unmasked(task_identity):
    overrides = {"method": "promptfl", "num-partitions": CLIENTS, "shots-per-class": 8, "device": "cpu"}
    app = make_client_app({**overrides, "secagg": True})
    setup = ConfigRecord(
        {
            Key.STAGE: Stage.SETUP,
            Key.SAMPLE_NUMBER: 3,
            Key.SHARE_NUMBER: 3,
            Key.THRESHOLD: 2,
            Key.CLIPPING_RANGE: 8.0,
            Key.TARGET_RANGE: 2**22,
            Key.MOD_RANGE: 2**32,
            Key.MAX_WEIGHT: 1000.0,
        }
    )
    msg = Message(content=RecordDict({RECORD_KEY_CONFIGS: setup}), dst_node_id=7, message_type=MessageType.TRAIN)
    reply = app(msg, node_context())
    assert sorted(reply.content.config_records[RECORD_KEY_CONFIGS]) == ["pk1", "pk2"]  # its public keys
    with pytest.raises(ConfigError, match="refusing to upload its arrays unmasked"):
        app(plain_fit_message(), node_context())
    # Without secagg the same mod lets a plain fit instruction through.
    reply = make_client_app(overrides)(plain_fit_message(), node_context())
    assert not reply.has_error() and reply.content.array_records["fitres.parameters"]


# ----- end to end ---------------------------------------------------------------------
