"""Method name → (server strategy, edge client), resolved lazily from the catalog.

Entries are import paths (:mod:`fedapp.catalog`), so a client process imports
only its own client module (a FedD2P edge device never pulls in the server's
foundation model).
"""

from __future__ import annotations

import importlib

from fedapp.catalog import CATALOG, CATALOG_PROBLEMS, MethodSpec
from fedapp.errors import ConfigError
from fedapp.options import did_you_mean


def _resolve(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def method_spec(method: str) -> MethodSpec:
    """The catalog entry of ``method``; a ConfigError lists the methods there are."""
    if method in CATALOG_PROBLEMS:
        raise ConfigError(f"config key 'method' = {method!r} cannot run: {CATALOG_PROBLEMS[method]}")
    try:
        return CATALOG[method]
    except KeyError:
        raise ConfigError(
            f"config key 'method' = {method!r} is not one of: {', '.join(CATALOG)}{did_you_mean(method, CATALOG)}"
        ) from None


def strategy_class(method: str) -> type:
    """The Strategy subclass that runs ``method`` on the server."""
    return _resolve(method_spec(method).strategy)


def client_class(method: str) -> type:
    """The NumPyClient subclass that runs ``method`` on an edge device."""
    return _resolve(method_spec(method).client)
