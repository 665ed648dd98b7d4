"""Server-side Flower strategies, one per method (thin glue over fedapp's core)."""

from strategies.base import ClientUpdate, FedAppStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.standalone import StandaloneStrategy

__all__ = ["ClientUpdate", "FedAppStrategy", "FedAvgStrategy", "StandaloneStrategy"]
