"""Server-side Flower strategies, one per method (thin glue over fedapp's core).

Every method's class here is a legacy :class:`flwr.server.strategy.Strategy`, usable in
a ServerApp of your own (``ServerApp(server_fn=...)`` or ``DefaultWorkflow``
with a ``LegacyContext``). Build one with
:meth:`FedAppStrategy.from_config`, which reads ``num_classes`` and
``class_names`` from the configured data::

    config = resolve_run_config({"method": "pfedlora", "num-rounds": 2})
    strategy = PFedLoRAStrategy.from_config(config)

:class:`MessageStrategy` puts any of them on Flower's Message API (a
:class:`flwr.serverapp.strategy.Strategy` for an ``@app.main()`` ServerApp)::

    strategy = MessageStrategy(PFedLoRAStrategy.from_config(config))
    strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=2)

The ClientApp must run the same ``method`` (``fedapp.client_app.make_client_app``
reads it from the run config); :mod:`fedapp.registry` says which class serves
which method. Each method's strategy is exported from the catalog (``MethodSpec.strategy``)
and imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from fedapp.catalog import CATALOG
from fedapp.flower.message_api import MessageStrategy
from fedapp.flower.strategy import ClientUpdate, FedAppStrategy
from fedapp.strategies.per_class import PerClassStrategy
from fedapp.strategies.shared_module import SharedModuleStrategy

# Each method's strategy class, by class name, as the catalog names it ("module:Class"): a method
# added to the catalog is exported here without an edit, and imported only when asked for.
_METHOD_STRATEGIES = {
    path.partition(":")[2]: path for path in dict.fromkeys(spec.strategy for spec in CATALOG.values())
    if path.startswith(f"{__name__}.")
}  # fmt: skip

__all__ = ["ClientUpdate", "FedAppStrategy", "MessageStrategy", "PerClassStrategy", "SharedModuleStrategy"]
__all__ += list(_METHOD_STRATEGIES)
__all__.sort()


def __getattr__(name: str) -> Any:
    path = _METHOD_STRATEGIES.get(name)
    if path is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, cls = path.partition(":")
    return getattr(import_module(module), cls)


def __dir__() -> list[str]:
    return sorted({*globals(), *_METHOD_STRATEGIES})
