"""FedPer (Arivazhagan et al., 2019) as a fedapp plug-in: a method in a package of its own.

``pyproject.toml`` declares :data:`FEDPER` in fedapp's ``fedapp.methods`` entry-point group;
installed beside fedapp, ``method="fedper"`` runs through ``python -m fedapp.launch``,
``flwr run`` and the sweep like any of fedapp's own methods. This module is plain data (the
catalog reads it in every process): the strategy and client are imported only where they run.
"""

from fedapp.catalog import MethodSpec
from fedapp_fedper.options import FedPerOptions

__all__ = ["FEDPER"]

FEDPER = MethodSpec(
    "fedper",
    "fedapp_fedper.strategy:FedPerStrategy",
    "fedapp_fedper.client:FedPerClient",
    "shared base layers, a personal classifier head per client (Arivazhagan et al., 2019)",
    "cnn",
    "parameters",
    new_client_note="only the base layers are shared; a new client's head is untrained",
    personal_state=True,
    options=FedPerOptions,
)
