"""The bad-input matrix: every row is one mistake a user, a data folder, a
checkpoint or a client can make, the entry point that meets it, and the clear
message it must produce (before any round runs, or, for client replies,
instead of spoiling the round).

Config and data rows go through what the ServerApp runs first
(``resolve_run_config`` and ``server_components``); protocol rows drive a
real strategy with replies a broken or stale client could send.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from flwr.common import (
    Code,
    Context,
    EvaluateRes,
    FitRes,
    Message,
    MessageType,
    RecordDict,
    Status,
    ndarrays_to_parameters,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server import SimpleClientManager
from PIL import Image

from fedapp.checkpoint import ServerCheckpoint, rng_state, save_checkpoint
from fedapp.client_app import make_client_app, node_partition, own_data_config
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError, DataError, StateError
from fedapp.flower.driver import PartitionProxy, stand_in_manager
from fedapp.server_app import build_strategy, server_components
from fedapp.state import DiskStateStore
from fedapp.strategies import FedAppStrategy, FedAvgStrategy, PFedLoRAStrategy, PromptFLStrategy

# ----- configuration -----------------------------------------------------------------------------------------------

CONFIG_ROWS = [
    ("unknown key", {"no-such-key": 1}, "unknown config key(s): no-such-key"),
    ("wrong type", {"num-rounds": "ten"}, "'num-rounds' = 'ten' has type str, expected int"),
    ("out of range", {"lr": 0}, "'lr' = 0.0 must be > 0.0"),
    ("unknown method", {"method": "fedsgd"}, "'method' = 'fedsgd' is not one of: sdfed, pfedlora"),
    ("unknown model", {"model": "resnet-9000"}, "'model' = 'resnet-9000' is not one of: cnn-1"),
    ("unknown dataset", {"dataset": "mnist-x"}, "'dataset' = 'mnist-x' is not one of: digits"),
    (
        "more classes per client than classes",
        {"partition": "pathological", "classes-per-client": 11},
        "'classes-per-client' = 11 is more than the 10 classes of dataset 'digits'",
    ),
    ("more min-clients than clients", {"min-clients": 20}, "'min-clients' = 20 is more than 'num-partitions' = 10"),
    ("missing preset", {"preset": "conf/no-such-preset.yaml"}, "'preset' = 'conf/no-such-preset.yaml': file not found"),
    ("missing data path", {"dataset": "imagefolder", "data-dir": "/no/such/folder"}, "path does not exist"),
    ("run name climbing out", {"run-name": "../../x"}, "'run-name' = '../../x' must be a single folder name"),
    ("absolute run name", {"run-name": "/tmp/x"}, "'run-name' = '/tmp/x' must be a single folder name"),
    ("run name with a folder", {"run-name": "a/b"}, "'run-name' = 'a/b' must be a single folder name"),
    (
        "prompt longer than the text context",
        {"method": "sdfed", "local-prompt-lengths": "4,55", "sdfed-combination": "average"},
        "gives client 1 a prompt of 55 tokens, but 'fedapp-tiny-clip' reads 32 text tokens",
    ),
    (
        "global and local prompts too long as one sequence (the default combination)",
        {"method": "sdfed", "local-prompt-lengths": "4,24"},
        "config keys 'prompt-length' = 8 and 'local-prompt-lengths' = '4,24' with sdfed-combination = 'sequence' "
        "gives client 1 a prompt of 32 tokens",
    ),
    ("unknown class assignment", {"class-assignment": "cyclic"}, "'class-assignment' = 'cyclic' is not one of"),
    (
        "resume of clients whose state was in memory",
        {"method": "fedd2p", "resume": True},
        "config keys 'resume' = true and 'state' = \"memory\": fedd2p's clients keep personal state",
    ),
]


def test_a_preset_that_is_not_utf8_is_named_in_one_line(tmp_path):
    """Issue 42: a Latin-1 preset raised UnicodeDecodeError with a traceback."""
    preset = tmp_path / "latin1.yaml"
    preset.write_bytes("# préréglage\nnum-rounds: 2\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"'preset' = '.*latin1\.yaml': not UTF-8 text \(byte 4: b'\\xe9'\)"):
        resolve_run_config({"preset": str(preset)})


@pytest.mark.parametrize(("overrides", "message"), [row[1:] for row in CONFIG_ROWS], ids=[r[0] for r in CONFIG_ROWS])
def test_bad_config_is_refused_with_the_key_named(overrides, message):
    with pytest.raises(ConfigError) as info:
        resolve_run_config(overrides)
    assert message in str(info.value)


# ----- data --------------------------------------------------------------------------------------------------------


def image_folder(root: Path, classes=("cat", "dog"), per_class: int = 6) -> Path:
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def empty_folder(root: Path) -> Path:
    root.mkdir()
    return root


def corrupt_image(root: Path) -> Path:
    image_folder(root)
    (root / "cat" / "broken.png").write_bytes(b"not a png")
    return root


def class_without_images(root: Path) -> Path:
    image_folder(root)
    (root / "bird").mkdir()
    return root


DATA_ROWS = [
    ("empty folder", empty_folder, 2, "has no class subfolders; expected <root>/<class>/<image files>"),
    ("corrupt image", corrupt_image, 2, "cannot decode image file"),
    ("class folder without images", class_without_images, 2, "bird contains no images"),
    ("client partition with no samples", image_folder, 20, "between 1 and the number of samples (12), got 20"),
]


@pytest.mark.parametrize(("make", "clients", "message"), [r[1:] for r in DATA_ROWS], ids=[r[0] for r in DATA_ROWS])
def test_bad_data_stops_the_server_before_round_one(tmp_path, make, clients, message):
    folder = make(tmp_path / "data")
    config = resolve_run_config(
        {"dataset": "imagefolder", "data-dir": str(folder), "num-partitions": clients, "min-clients": 1}
    )
    with pytest.raises(DataError) as info:
        server_components(config)
    assert message in str(info.value)


# ----- a node's own data, met by the ClientApp when the server's instruction arrives --------------------------------

NODE_DATA_ROWS = [
    ("class folder cased differently", ("Cat", "dog"), "(names that differ in case)"),
    ("class folder missing", ("dog",), "missing ['cat'], not the server's []"),
    ("extra class folder", ("bird", "cat", "dog"), "missing [], not the server's ['bird']"),
    ("class folder renamed", ("cat", "hound"), "missing ['dog'], not the server's ['hound']"),
]


def fit_on_node(server_data: Path, node_data: Path, *, device_lacks_server_path: bool = False) -> Message:
    """Round 1's instruction from a server over ``server_data``, handled by the ClientApp of a
    node whose node config points at its own ``node_data`` (on a device without the server's
    path, when ``device_lacks_server_path``)."""
    run_config = {"method": "fedavg", "dataset": "imagefolder", "data-dir": str(server_data), "model": "cnn-5"}
    run_config |= {"num-partitions": 1, "min-clients": 1, "image-size": 16, "device": "cpu"}
    strategy = build_strategy(resolve_run_config(run_config), record=False)  # no run folder: nothing to keep
    [(_, fit_ins)] = strategy.configure_fit(1, strategy.initialize_parameters(None), stand_in_manager(1))
    if device_lacks_server_path:
        shutil.rmtree(server_data)
    content = compat.fitins_to_recorddict(fit_ins, True)
    context = Context(run_id=1, node_id=7, node_config={"data-dir": str(node_data)}, state=RecordDict(), run_config={})
    return make_client_app(run_config)(Message(content, dst_node_id=7, message_type=MessageType.TRAIN), context)


@pytest.mark.parametrize(
    ("node_classes", "message"), [r[1:] for r in NODE_DATA_ROWS], ids=[r[0] for r in NODE_DATA_ROWS]
)
def test_a_node_whose_classes_differ_from_the_servers_is_refused_with_both_lists(
    tmp_path, task_identity, node_classes, message
):
    with pytest.raises(DataError) as info:
        fit_on_node(image_folder(tmp_path / "server"), image_folder(tmp_path / "node", classes=node_classes))
    assert f"its classes {list(node_classes)} are not the server's ['cat', 'dog']" in str(info.value)
    assert message in str(info.value)


def test_a_node_whose_classes_agree_trains(tmp_path, task_identity):
    data = image_folder(tmp_path / "data")
    assert not fit_on_node(data, data).has_error()


def test_a_node_on_its_own_data_needs_not_have_the_servers_data_dir(tmp_path, task_identity):
    reply = fit_on_node(
        image_folder(tmp_path / "server"), image_folder(tmp_path / "node"), device_lacks_server_path=True
    )
    assert not reply.has_error()
    assert compat.recorddict_to_fitres(reply.content, keep_input=False).num_examples > 0


def test_a_node_on_its_own_data_derives_the_servers_run_name(tmp_path):
    values = {"method": "fedavg", "dataset": "imagefolder", "data-dir": str(image_folder(tmp_path / "server"))}
    node = own_data_config(values, str(image_folder(tmp_path / "node")), ignore_unknown=False)
    assert node.resolved_run_name == resolve_run_config(values).resolved_run_name
    assert node.data_dir == values["data-dir"]


def test_node_config_partition_outside_the_federation_is_refused():
    config = resolve_run_config({"num-partitions": 4})
    with pytest.raises(ConfigError, match=r"partition-id = 4 is outside 0..3"):
        node_partition({"partition-id": 4, "num-partitions": 4}, config)


# ----- checkpoints and client state --------------------------------------------------------------------------------


def resume_config(tmp_path: Path, **overrides):
    return resolve_run_config(
        {"results-dir": str(tmp_path), "run-name": "run", "resume": True, "model": "cnn-5", **overrides}
    )


def write_checkpoint(tmp_path: Path, method: str) -> Path:
    config = resolve_run_config({"method": method, "results-dir": str(tmp_path), "run-name": "run"}).as_dict()
    checkpoint = ServerCheckpoint(round=1, config=config, global_arrays=[np.zeros(3, np.float32)], rng=rng_state())
    return save_checkpoint(tmp_path / "run" / "checkpoint.npz", checkpoint)


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(StateError, match=r"resume=true, but run folder .*run does not exist: nothing to resume"):
        server_components(resume_config(tmp_path))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "run").mkdir()  # a folder without a checkpoint in it
    with pytest.raises(StateError, match=r"no checkpoint at .*nothing to resume"):
        server_components(resume_config(tmp_path))


def test_corrupt_checkpoint_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.npz").write_bytes(b"\x00" * 64)
    with pytest.raises(StateError, match="corrupt or not a fedapp checkpoint"):
        server_components(resume_config(tmp_path))


def test_checkpoint_of_another_method_is_refused(tmp_path):
    write_checkpoint(tmp_path, "standalone")
    with pytest.raises(StateError, match="belongs to method 'standalone', not 'fedavg'"):
        server_components(resume_config(tmp_path))


def test_corrupt_client_state_is_refused_with_a_fix(tmp_path):
    store = DiskStateStore(tmp_path, "run", 0)
    store.directory.mkdir(parents=True)
    store.path("model").write_bytes(b"garbage")
    with pytest.raises(StateError, match=r"unreadable .*delete it to start fresh"):
        store.load("model")


# ----- protocol: replies a broken or stale client could send ---------------------------------------------------------


def one_round(strategy: FedAppStrategy, change_second_reply) -> tuple[dict, list[np.ndarray]]:
    """Round 1 with two clients, the second reply altered; the round's record and the new global arrays."""
    manager = SimpleClientManager()
    proxies = [PartitionProxy(0), PartitionProxy(1)]
    for proxy in proxies:
        manager.register(proxy)
    sent = strategy.initialize_parameters(manager)
    assert len(strategy.configure_fit(1, sent, manager)) == 2
    replies = []
    for proxy in proxies:
        arrays = [a + 0.5 if np.issubdtype(a.dtype, np.floating) else a for a in strategy.global_arrays]
        metrics = {"train_loss": 1.0, "partition_id": proxy.partition, "server_round": 1}
        if proxy.partition == 1:
            arrays, metrics = change_second_reply(arrays, metrics)
        replies.append((proxy, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 10, metrics)))
    strategy.aggregate_fit(1, replies, [])
    evaluations = [(p, EvaluateRes(Status(Code.OK, ""), 0.5, 10, {"accuracy": 0.5})) for p in proxies]
    strategy.aggregate_evaluate(1, evaluations, [])
    record = strategy.history[-1]
    return {"clients_fit": record.clients_fit, **record.extra}, strategy.global_arrays


def wider(arrays, metrics):
    return [np.zeros((*a.shape[:-1], a.shape[-1] * 2), a.dtype) for a in arrays], metrics


def stale(arrays, metrics):
    return arrays, {**metrics, "server_round": 0}


PROTOCOL_ROWS = [
    ("adapter shape mismatch between clients", "pfedlora", wider, "array 0 has shape"),
    ("prompt width mismatch", "promptfl", wider, "array 0 has shape"),
    ("reply from another round", "pfedlora", stale, "reply for round 0 arrived in round 1"),
]


@pytest.mark.parametrize(
    ("method", "change", "reason"), [r[1:] for r in PROTOCOL_ROWS], ids=[r[0] for r in PROTOCOL_ROWS]
)
def test_bad_reply_is_left_out_and_the_round_goes_on(method, change, reason):
    config = resolve_run_config({"method": method, "num-partitions": 2, "min-clients": 1, "shots-per-class": 4})
    strategy = (PFedLoRAStrategy if method == "pfedlora" else PromptFLStrategy)(config, 10)
    record, aggregate = one_round(strategy, change)
    assert record["clients_fit"] == 1
    assert len(record["left_out_reasons"]) == 1
    assert "partition 1" in record["left_out_reasons"][0] and reason in record["left_out_reasons"][0]
    # The aggregate is the good client's update alone.
    initial = PFedLoRAStrategy if method == "pfedlora" else PromptFLStrategy
    fresh = initial(config, 10).initial_arrays()
    for got, start in zip(aggregate, fresh, strict=True):
        if np.issubdtype(start.dtype, np.floating):
            np.testing.assert_allclose(got, start + 0.5, rtol=1e-6)


def test_a_client_without_test_data_is_named_once_and_left_out_of_the_means(caplog):
    """Issue 42: a client whose test split was empty made global_acc NaN without a word."""
    strategy = FedAvgStrategy(resolve_run_config({"num-partitions": 2, "min-clients": 1}), 10)
    proxies = [PartitionProxy(0), PartitionProxy(1)]
    for server_round in (1, 2):
        replies = [
            (proxies[0], EvaluateRes(Status(Code.OK, ""), 0.5, 10, {"accuracy": 0.8})),
            (proxies[1], EvaluateRes(Status(Code.OK, ""), 0.0, 0, {"accuracy": math.nan})),
        ]
        strategy.aggregate_evaluate(server_round, replies, [])
    warned = [r.getMessage() for r in caplog.records if "have no test data" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"client(s) {strategy.client_name(proxies[1])} have no test data")
    record = strategy.history[-1]
    assert record.global_acc == 0.8 and record.acc_mean == 0.8 and record.clients_evaluated == 1
