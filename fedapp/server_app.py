"""Flower ServerApp: validates the run config, checks the data, builds the strategy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from fedapp.config import RunConfig, resolve_run_config
from fedapp.registry import strategy_class


def build_strategy(config: RunConfig, *, record: bool = True):
    """The configured method's strategy, after the data has been checked.

    Loading and partitioning the source here means a missing folder, a corrupt
    image or an empty client stops the run before any client trains.
    """
    return strategy_class(str(config["method"])).from_config(config, record=record)


def make_server_fn(overrides: Mapping[str, Any] | None = None):
    """A ``server_fn`` whose run config is Flower's, with ``overrides`` on top."""

    def server_fn(context: Context) -> ServerAppComponents:
        config = resolve_run_config({**context.run_config, **(overrides or {})})
        strategy = build_strategy(config)
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=int(config["num-rounds"])))

    return server_fn


def make_server_app(overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp for this project (``overrides`` let tests and scripts set keys)."""
    return ServerApp(server_fn=make_server_fn(overrides))


app = make_server_app()
