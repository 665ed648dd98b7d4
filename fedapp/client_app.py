"""Flower ClientApp: builds the configured method's NumPyClient on a node.

Node config keys (``--node-config`` of ``flower-supernode``, or set by the
simulation engine): ``partition-id`` and ``num-partitions`` pick this node's
share of the configured source; ``data-dir`` instead points at the node's own
files; ``state-dir`` and ``cache-dir`` are where the node writes.

A node's paths are the node's: on a SuperNode, personal state, caches and
downloads go under the node config's ``state-dir`` and ``cache-dir`` (or their
defaults on the device), never where a submitted run config says. Only in a
simulation (or a script that builds clients itself), where the user who starts
the run owns every node, do the run config's ``state-dir`` and ``cache-dir`` apply.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.client import Client, ClientApp, NumPyClient
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common import Context

from fedapp.clientdata import CLASS_NAMES_KEY, ClientData, check_class_agreement, load_client_data
from fedapp.config import SCHEMA, RunConfig, resolve_run_config
from fedapp.data.arrays import resolve_cache_dir
from fedapp.errors import ConfigError
from fedapp.extras import check_client_extras
from fedapp.flower.client_mods import dp_clipping_mod, secagg_client_mod
from fedapp.flower.message_records import answer, is_message_api
from fedapp.registry import client_class
from fedapp.state import RUN_TOKEN_KEY, DiskStateStore, MemoryStateStore, StateStore, on_supernode
from fedapp.training import select_device


def simulated_without_gpu() -> bool:
    """Whether this process is a Ray simulation worker that Ray gave no GPU (``--gpus-per-client`` 0).

    Ray 2.x hides the GPUs from such a worker (``CUDA_VISIBLE_DEVICES=""``) but says it will
    stop doing so (``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO``); the client decides from Ray's
    assignment itself, so a worker given no GPU trains on the CPU under either behaviour.
    """
    ray = sys.modules.get("ray")  # a Ray worker has imported it; elsewhere there is nothing to ask
    if ray is None or not ray.is_initialized():
        return False
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:
        return False
    return not context.get_accelerator_ids().get("GPU")


def client_device(name: str):
    """The device a client trains on: ``device`` as :func:`~fedapp.training.select_device` reads it,
    the CPU in a simulation worker given no GPU (where ``auto`` and ``cuda`` say why)."""
    if name != "cpu" and simulated_without_gpu():
        return select_device(name, no_gpu_reason="this simulated client was given no GPU; --gpus-per-client gives one")
    return select_device(name)


def node_partition(node_config: Mapping[str, Any], config: RunConfig) -> tuple[int, int]:
    """This node's ``(partition-id, num-partitions)``."""
    try:
        partition_id = int(node_config.get("partition-id", 0))
        num_partitions = int(node_config.get("num-partitions", config.num_partitions))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"node config partition-id/num-partitions must be integers: {err}") from err
    if not 0 <= partition_id < num_partitions:
        raise ConfigError(f"node config partition-id = {partition_id} is outside 0..{num_partitions - 1}")
    return partition_id, num_partitions


log = logging.getLogger("flwr.fedapp")

NODE_WRITE_KEYS = ("state-dir", "cache-dir")
"""Run config keys naming where a client writes: on a SuperNode the node config decides them."""


def default_state_root() -> str:
    """A SuperNode's state root when its node config names none: ``$XDG_STATE_HOME/fedapp``."""
    return str(Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "fedapp")


def node_view(config: RunConfig, node_config: Mapping[str, Any], supernode: bool) -> RunConfig:
    """``config`` with the paths this node writes to chosen by the node.

    In a simulation (or a script of the user's) the run config's ``state-dir`` and
    ``cache-dir`` apply unless the node config sets them. On a SuperNode
    (``supernode``) they come from the node config or the
    device's defaults (``$XDG_STATE_HOME/fedapp``, ``FEDAPP_CACHE_DIR`` or
    ``~/.cache/fedapp``), and downloads go to ``<cache-dir>/downloads``. The run name
    is pinned first, so a derived name is the same as the server's.
    """
    values = {**config.as_dict(), "run-name": config.resolved_run_name}
    if not supernode:
        for key in NODE_WRITE_KEYS:
            if key in node_config:
                values[key] = str(node_config[key])
        return RunConfig.from_values(values)
    ignored = [key for key in NODE_WRITE_KEYS if config[key] != SCHEMA[key].default and key not in node_config]
    if ignored:
        _warn_once(", ".join(f"{key}={config[key]!r}" for key in ignored))
    values["state-dir"] = str(node_config.get("state-dir", default_state_root()))
    values["cache-dir"] = str(resolve_cache_dir(str(node_config.get("cache-dir", ""))))
    if config.download:
        values["data-dir"] = str(Path(values["cache-dir"]) / "downloads")
    return RunConfig.from_values(values)


@functools.cache
def _warn_once(ignored: str) -> None:
    # client_fn runs for every message: say it once per process and setting, not every round.
    log.warning("run config %s not used on this SuperNode: a node writes only where its own node config says", ignored)


def flower_state_store(state: RecordDict) -> MemoryStateStore:
    """A state store over a node's ``Context.state`` (kept by Flower across rounds)."""
    return MemoryStateStore(
        state,
        encode=lambda arrays: ArrayRecord({name: Array(np.ascontiguousarray(a)) for name, a in arrays.items()}),
        decode=lambda record: {name: array.numpy() for name, array in record.items()},
    )


def make_store(context: Context, config: RunConfig, partition_id: int) -> StateStore:
    """The client's state store: the node's Context, or files under the state dir
    (``config`` as :func:`node_view` gives it)."""
    if config.state == "disk":
        return DiskStateStore(config.state_dir, config.resolved_run_name, partition_id)
    return flower_state_store(context.state)


class AgreementCheckedClient(NumPyClient):
    """A method's client that first checks what every instruction carries: that its classes
    are the server's (a node whose own folders differ is refused with both lists instead of
    training with swapped labels), and that its personal state belongs to the server's run
    (:meth:`fedapp.state.DiskStateStore.join_run`: never another run's, unless the run
    config's ``personal-state-from`` asks for it)."""

    def __init__(self, client: NumPyClient, data: ClientData, store: StateStore, continue_from: str = "") -> None:
        self.client = client
        self.data = data
        self.store = store
        self.continue_from = continue_from

    def _check(self, config) -> None:
        check_class_agreement(self.data, config.get(CLASS_NAMES_KEY))
        token = config.get(RUN_TOKEN_KEY)
        self.store.join_run(None if token is None else str(token), self.continue_from)

    def get_parameters(self, config):
        return self.client.get_parameters(config)

    def fit(self, parameters, config):
        self._check(config)
        return self.client.fit(parameters, config)

    def evaluate(self, parameters, config):
        self._check(config)
        return self.client.evaluate(parameters, config)


class NodeClient(NumPyClient):
    """A node's client, built when an instruction first needs it.

    The server's partition query (``get_properties``) is answered from the node config
    alone: asking every node which partition it holds, before sampling, then costs no data
    loading and no model, so a simulation's first round does not grow with the clients
    that are never sampled.
    """

    def __init__(self, partition_id: int, build: Callable[[], AgreementCheckedClient]) -> None:
        self.partition_id = partition_id
        self._build = build

    @functools.cached_property
    def client(self) -> AgreementCheckedClient:
        """The method's client over this node's data and state (built on first use)."""
        return self._build()

    @property
    def data(self) -> ClientData:
        return self.client.data

    def get_properties(self, config):
        """This node's partition, as every method's client reports it (``fedapp.clients.base``)."""
        return {"partition-id": self.partition_id}

    def get_parameters(self, config):
        return self.client.get_parameters(config)

    def fit(self, parameters, config):
        return self.client.fit(parameters, config)

    def evaluate(self, parameters, config):
        return self.client.evaluate(parameters, config)


FAULT_RATE_ENV = "FEDAPP_FAULT_RATE"
"""Chaos testing: the share of training and evaluation messages this node's ClientApp fails."""


class InjectedFault(RuntimeError):
    """A failure the node was told to inject (:data:`FAULT_RATE_ENV`), as a crashing client would."""


def fault_injection_mod(msg, ctxt: Context, call_next):
    """Fail a share of this node's train/evaluate messages when ``FEDAPP_FAULT_RATE`` is set in
    the SuperNode's environment (a soak test's flaky device); a no-op otherwise."""
    rate = float(os.environ.get(FAULT_RATE_ENV, "0") or 0)
    # One draw per message, from its id: a ClientApp process may live for one message only.
    draw = random.Random(f"{ctxt.node_id}:{msg.metadata.message_id}").random() if rate > 0 else 1.0
    if msg.metadata.message_type in ("train", "evaluate") and draw < rate:
        raise InjectedFault(f"injected fault ({FAULT_RATE_ENV}={rate:g} on node {ctxt.node_id})")
    return call_next(msg, ctxt)


def resolved_config(values: Mapping[str, Any], ignore_unknown: bool) -> RunConfig:
    """:func:`resolve_run_config`, validated once per process for each distinct run config.

    A simulation worker builds a client for every message, and validation checks
    every client's share (e.g. each client's prompt length), which would make a
    message's cost grow with the number of clients.
    """
    try:
        key = tuple(sorted(values.items()))
        hash(key)
    except TypeError:  # an unhashable override (only from scripts): validate every time
        return resolve_run_config(dict(values), ignore_unknown=ignore_unknown)
    return _resolved_config(key, ignore_unknown)


@functools.lru_cache(maxsize=16)
def _resolved_config(items: tuple[tuple[str, Any], ...], ignore_unknown: bool) -> RunConfig:
    return resolve_run_config(dict(items), ignore_unknown=ignore_unknown)


def own_data_config(values: Mapping[str, Any], local_dir: str, ignore_unknown: bool) -> RunConfig:
    """The run config of a node that reads its own ``local_dir``: validated with that folder as
    its ``data-dir`` (the run config's is the server's path, which a device need not have), then
    given the server's value back, so that a derived run name is the server's."""
    config = resolved_config({**values, "data-dir": local_dir}, ignore_unknown)
    return RunConfig.from_values({**config.as_dict(), "data-dir": values.get("data-dir", SCHEMA["data-dir"].default)})


def make_numpy_client_fn(overrides: Mapping[str, Any] | None = None, *, ignore_unknown: bool = False):
    """A function of a node's ``Context`` that builds the configured method's NumPyClient,
    whose run config is Flower's with ``overrides`` on top.

    ``ignore_unknown`` leaves out run-config keys this project does not know
    (another project's, when our ClientApp runs inside it) instead of refusing them.
    """

    def numpy_client_fn(context: Context) -> NodeClient:
        values = {**context.run_config, **(overrides or {})}
        local_dir = str(context.node_config.get("data-dir", ""))
        config = (
            own_data_config(values, local_dir, ignore_unknown) if local_dir else resolved_config(values, ignore_unknown)
        )
        config = node_view(config, context.node_config, on_supernode())
        partition_id, num_partitions = node_partition(context.node_config, config)
        check_client_extras(config, own_data_dir=bool(local_dir))  # before the data and the model

        def build() -> AgreementCheckedClient:
            data = load_client_data(config, partition_id, num_partitions, local_dir)
            store = make_store(context, config, partition_id)
            client = client_class(config.method)(config, data, store, client_device(config.device))
            return AgreementCheckedClient(client, data, store, config.personal_state_from)

        return NodeClient(partition_id, build)

    return numpy_client_fn


def make_client_fn(overrides: Mapping[str, Any] | None = None, *, ignore_unknown: bool = False):
    """A legacy ``client_fn`` (:func:`make_numpy_client_fn`'s client, as a Flower ``Client``)."""
    numpy_client_fn = make_numpy_client_fn(overrides, ignore_unknown=ignore_unknown)

    def client_fn(context: Context) -> Client:
        return numpy_client_fn(context).to_client()

    return client_fn


def message_api_mod(overrides: Mapping[str, Any] | None = None, *, ignore_unknown: bool = False) -> Mod:
    """A mod that answers Message-API messages (:func:`fedapp.flower.message_api.is_message_api`)
    with the method's NumPyClient, and hands the legacy path's messages on."""
    numpy_client_fn = make_numpy_client_fn(overrides, ignore_unknown=ignore_unknown)

    def answer_message_api(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
        if not is_message_api(msg):
            return call_next(msg, ctxt)
        return answer(numpy_client_fn(ctxt), msg)

    return answer_message_api


def make_client_app(overrides: Mapping[str, Any] | None = None, *, ignore_unknown: bool = False) -> ClientApp:
    """A ClientApp for this project that serves both of Flower's APIs (``overrides`` let
    tests and scripts set keys; ``ignore_unknown`` as in :func:`make_numpy_client_fn`).

    Legacy instructions (``api = legacy``) go to the method's client through ``client_fn``;
    Message-API ones (``api = message``, or a ``flwr.serverapp`` strategy of the user's) are
    answered by :func:`message_api_mod`, innermost, so the other mods see both. The SecAgg+
    mod acts only in SecAgg+ rounds (``secagg = true``); other messages pass through.
    """
    return ClientApp(
        client_fn=make_client_fn(overrides, ignore_unknown=ignore_unknown),
        # dp_clipping_mod clips only when the server sends a clipping norm (dp = client); inner to
        # SecAgg+'s, so that an update is clipped before it is masked.
        mods=[
            fault_injection_mod,
            secagg_client_mod(overrides, ignore_unknown=ignore_unknown),
            dp_clipping_mod,
            message_api_mod(overrides, ignore_unknown=ignore_unknown),
        ],
    )


def make_message_client_app(overrides: Mapping[str, Any] | None = None, *, ignore_unknown: bool = False) -> ClientApp:
    """A ClientApp on Flower's Message API only: ``@app.train()``, ``@app.evaluate()`` and
    ``@app.query()`` handlers over the configured method's client (arguments as in
    :func:`make_client_app`), for a ``flwr.serverapp`` strategy, ours
    (:class:`~fedapp.flower.message_api.MessageStrategy`) or a user's."""
    numpy_client_fn = make_numpy_client_fn(overrides, ignore_unknown=ignore_unknown)
    app = ClientApp(mods=[fault_injection_mod, dp_clipping_mod])

    def handle(msg: Message, context: Context) -> Message:  # answer() tells the three kinds apart
        return answer(numpy_client_fn(context), msg)

    for register in (app.train, app.evaluate, app.query):
        register()(handle)
    return app


app = make_client_app()
