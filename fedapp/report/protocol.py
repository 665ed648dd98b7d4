"""The protocol column: a short readable description of how a run split and evaluated its data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedapp.report.tables import plural


def config_flag(value: Any) -> bool:
    """A boolean config value; older or hand-written configs may hold it as a string."""
    if isinstance(value, str):
        return value.strip().lower() in {"true", "1", "yes", "on"}
    return bool(value)


def describe_protocol(config: Mapping[str, Any], domain_names: Sequence[str] = ()) -> str:
    """A short readable description of how a run split and evaluated its data.

    Parameters
    ----------
    config : Mapping[str, Any]
        The run's resolved config (``config.yaml``). Keys added after a run was made are read
        with their defaults, so older run folders describe themselves too.
    domain_names : Sequence[str]
        Names of the domains, in index order (``summary.json``'s ``domain_names``); used to name
        the left-out domain and to count real domains.

    Returns
    -------
    str
        E.g. ``dirichlet α=0.3``, ``pathological 2/client``,
        ``domain: 4 synthetic domains × 2 clients (Dirichlet α=0.3 within); leave-one-domain-out: blur``.
    """
    partition = str(config.get("partition", "dirichlet"))
    alpha = f"{float(config.get('alpha', 0.3)):g}"
    if partition == "dirichlet":
        text = f"dirichlet α={alpha}"
    elif partition == "pathological":
        text = f"pathological {int(config.get('classes-per-client', 2))}/client"
    elif partition == "shard":
        text = f"shard {int(config.get('shards-per-client', 2))}/client"
    elif partition == "domain":
        synthetic = int(config.get("synthetic-domains", 0))
        per_domain = int(config.get("clients-per-domain", 1))
        if synthetic:
            domains = plural(synthetic, "synthetic domain")
        else:
            # Real domains are the dataset's subfolders: the summary names them; else infer the count.
            count = len(domain_names) or max(1, int(config.get("num-partitions", 1)) // per_domain)
            domains = plural(count, "domain")
        text = f"domain: {domains} × {plural(per_domain, 'client')}"
        if per_domain > 1:  # a domain's data is split among its clients by Dirichlet over labels
            text += f" (Dirichlet α={alpha} within)"
    else:
        text = partition

    fraction = float(config.get("held-out-fraction", 0.0))
    if fraction > 0:
        text += f"; held out {round(fraction * 100, 1):g}% of clients"
    held_domain = int(config.get("held-out-domain", -1))
    if held_domain >= 0:
        name = domain_names[held_domain] if held_domain < len(domain_names) else f"domain {held_domain}"
        text += f"; leave-one-domain-out: {name}"
    if config_flag(config.get("base-to-novel", False)):
        text += "; base-to-novel"
    shots = int(config.get("shots-per-class", 0))
    if shots > 0:
        text += f"; {shots} shots/class"
    return text
