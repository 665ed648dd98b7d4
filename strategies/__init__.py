"""Server-side Flower strategies, one per method (thin glue over fedapp's core)."""

from strategies.base import ClientUpdate, FedAppStrategy
from strategies.fd import FDStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.fedkd import FedKDStrategy
from strategies.fedproto import FedProtoStrategy
from strategies.fml import FMLStrategy
from strategies.lg_fedavg import LGFedAvgStrategy
from strategies.per_class import PerClassStrategy
from strategies.pfedlora import PFedLoRAStrategy
from strategies.promptfl import PromptFLStrategy
from strategies.sdfed import SDFedStrategy
from strategies.shared_module import SharedModuleStrategy
from strategies.standalone import StandaloneStrategy

__all__ = [
    "ClientUpdate",
    "FDStrategy",
    "FMLStrategy",
    "FedAppStrategy",
    "FedAvgStrategy",
    "FedKDStrategy",
    "FedProtoStrategy",
    "LGFedAvgStrategy",
    "PFedLoRAStrategy",
    "PerClassStrategy",
    "PromptFLStrategy",
    "SDFedStrategy",
    "SharedModuleStrategy",
    "StandaloneStrategy",
]
