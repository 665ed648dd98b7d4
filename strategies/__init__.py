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
which method.
"""

from fedapp.flower.message_api import MessageStrategy
from fedapp.flower.strategy import ClientUpdate, FedAppStrategy
from fedapp.strategies.fd import FDStrategy
from fedapp.strategies.fedavg import FedAvgStrategy
from fedapp.strategies.fedd2p import FedD2PStrategy
from fedapp.strategies.fedkd import FedKDStrategy
from fedapp.strategies.fedproto import FedProtoStrategy
from fedapp.strategies.fedvpt import FedVPTStrategy
from fedapp.strategies.fml import FMLStrategy
from fedapp.strategies.lg_fedavg import LGFedAvgStrategy
from fedapp.strategies.pep_fedpt import PEPFedPTStrategy
from fedapp.strategies.per_class import PerClassStrategy
from fedapp.strategies.pfedlora import PFedLoRAStrategy
from fedapp.strategies.promptfl import PromptFLStrategy
from fedapp.strategies.sdfed import SDFedStrategy
from fedapp.strategies.shared_module import SharedModuleStrategy
from fedapp.strategies.standalone import StandaloneStrategy

__all__ = [
    "ClientUpdate",
    "FDStrategy",
    "FMLStrategy",
    "FedAppStrategy",
    "FedAvgStrategy",
    "FedD2PStrategy",
    "FedKDStrategy",
    "FedProtoStrategy",
    "FedVPTStrategy",
    "LGFedAvgStrategy",
    "MessageStrategy",
    "PEPFedPTStrategy",
    "PFedLoRAStrategy",
    "PerClassStrategy",
    "PromptFLStrategy",
    "SDFedStrategy",
    "SharedModuleStrategy",
    "StandaloneStrategy",
]
