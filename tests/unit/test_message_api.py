"""Our strategies and clients on Flower's Message API (fedapp/flower/message_api.py), over a
grid in this process: failures left out and named, misuse refused, the records of each
message and the DP clipping of a Message-API reply. (Whole runs: tests/integration/test_message_api_runs.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.client import NumPyClient
from flwr.common import Context, FitIns, GetPropertiesIns, ndarrays_to_parameters
from flwr.common.constant import MessageTypeLegacy
from flwr.compat.common import recorddict_compat as compat
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from fedapp import client_app
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError
from fedapp.flower.client_mods import dp_clipping_mod
from fedapp.flower.message_api import MessageStrategy
from fedapp.flower.message_records import answer, is_message_api, joined_metrics, split_metrics
from tests.message_grid import FIRST_NODE, InProcessGrid, run_on_message_api

pytestmark = pytest.mark.usefixtures("task_identity")


def test_a_node_that_fails_or_stays_silent_is_left_out_and_named():
    overrides = {"method": "fedavg", "model": "cnn-1", "num-partitions": 3, "num-rounds": 1, "shots-per-class": 3}
    grid = InProcessGrid(overrides, fail={FIRST_NODE + 1: "error", FIRST_NODE + 2: "silent"})
    strategy, result = run_on_message_api(overrides, grid)
    (record,) = strategy.strategy.history
    assert record.clients_fit == 1
    assert record.clients_failed == 2
    reasons = " | ".join(record.extra["left_out_reasons"])
    assert f"node {FIRST_NODE + 1} crashed" in reasons and f"{FIRST_NODE + 2}" in reasons and "no reply" in reasons
    assert result.arrays is not None  # the round still aggregated the one usable update


def test_start_refuses_initial_arrays_that_are_not_the_methods():
    overrides = {"method": "fedavg", "model": "cnn-1", "num-partitions": 2, "num-rounds": 1}
    strategy = MessageStrategy.from_config(resolve_run_config(overrides))
    strategy.initial_arrays()
    with pytest.raises(ConfigError, match=r"initial_arrays=strategy\.initial_arrays"):
        strategy.start(grid=InProcessGrid(overrides), initial_arrays=ArrayRecord([np.zeros(3)]), num_rounds=1)


def test_metrics_split_into_numbers_and_details_and_join_back():
    metrics = {"acc": 0.5, "n": 3, "flag": True, "note": "text"}
    content = split_metrics(metrics, **{"num-examples": 7})
    assert dict(content.metric_records["metrics"]) == {"acc": 0.5, "n": 3, "num-examples": 7}
    assert dict(content.config_records["details"]) == {"flag": True, "note": "text"}
    assert joined_metrics(content) == {**metrics, "num-examples": 7}
    with pytest.raises(ValueError, match="num-examples"):
        split_metrics({"num-examples": 1}, **{"num-examples": 2})


def test_message_api_messages_are_told_apart_from_the_legacy_layout():
    arrays = [np.ones(2, dtype=np.float32)]
    legacy = compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters(arrays), {"server-round": 1}), keep_input=True)
    ours = RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord({"server-round": 1})})
    assert not is_message_api(Message(legacy, dst_node_id=1, message_type=MessageType.TRAIN))
    assert is_message_api(Message(ours, dst_node_id=1, message_type=MessageType.TRAIN))
    assert is_message_api(Message(RecordDict(), dst_node_id=1, message_type=MessageType.QUERY))
    assert not is_message_api(Message(RecordDict(), dst_node_id=1, message_type="get_properties"))


class FarClient(NumPyClient):
    """A client whose update is far from what it was sent (a norm of 300 per array)."""

    def fit(self, parameters, config):
        return [p + 100.0 for p in parameters], 5, {"train_loss": 1.0}


def test_dp_client_clipping_clips_a_message_api_update():
    sent = [np.zeros(9, dtype=np.float32)]
    config = {"server-round": 1, KEY_CLIPPING_NORM: 0.5}
    message = Message(
        RecordDict({"arrays": ArrayRecord(sent), "config": ConfigRecord(config)}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    reply = dp_clipping_mod(message, None, lambda msg, ctxt: answer(FarClient(), msg))
    (update,) = reply.content.array_records["arrays"].to_numpy_ndarrays()
    assert math.isclose(float(np.linalg.norm(update - sent[0])), 0.5, rel_tol=1e-5)
    assert reply.content.metric_records["metrics"]["num-examples"] == 5


@pytest.mark.parametrize("api", ["legacy", "message"])
def test_a_partition_query_is_answered_without_loading_data_or_building_a_model(monkeypatch, api):
    """The sampler asks every node its partition before each round's draw (issue: a start that does not
    grow with N); the answer comes from the node config. A training message still builds the client."""
    built = []
    monkeypatch.setattr(client_app, "load_client_data", lambda *args: built.append(args) or 1 / 0)
    app = client_app.make_client_app({"method": "fedavg", "model": "cnn-1", "num-partitions": 4})
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 3}, state=RecordDict(), run_config={})
    if api == "legacy":
        content = compat.getpropertiesins_to_recorddict(GetPropertiesIns(config={}))
        query = Message(content, dst_node_id=7, message_type=MessageTypeLegacy.GET_PROPERTIES)
        properties = compat.recorddict_to_getpropertiesres(app(query, context).content).properties
    else:
        query = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=7, message_type=MessageType.QUERY)
        properties = dict(app(query, context).content["properties"])
    assert properties == {"partition-id": 3} and built == []
    with pytest.raises(ZeroDivisionError):
        client_app.make_numpy_client_fn({"method": "fedavg"})(context).fit([], {})
    assert len(built) == 1
