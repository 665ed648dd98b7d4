"""What every tracker logs, in tracker-neutral form: a round record's numbers by name, and the
configuration as text values; and what a tracker reads of a run (:class:`TrackedRun`)."""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Protocol

from fedapp.metrics import RoundRecord


class TrackedRun(Protocol):
    """What a tracker reads of a run's configuration (a :class:`fedapp.config.RunConfig` has it)."""

    tracker: str
    tracking_uri: str
    results_dir: str
    resume: bool
    method: str
    dataset: str

    @property
    def resolved_run_name(self) -> str: ...

    def __getitem__(self, key: str) -> Any: ...

    def as_dict(self) -> dict[str, Any]: ...


# MLflow accepts letters, digits, '_', '-', '.', ' ', ':' and '/' in a metric name; a domain's
# name (a folder name) may hold anything else.
_NOT_IN_A_NAME = re.compile(r"[^\w\-. :/]")


#: Per-client accuracies by partition (one number per client, hundreds in a cross-device run):
#: metrics.jsonl keeps them; a tracker's charts show their mean, worst and spread.
PER_CLIENT = frozenset({"client_acc", "held_out_client_acc"})


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def metric_name(name: str) -> str:
    """``name`` with every character a tracker refuses in a metric name replaced by ``_``."""
    return _NOT_IN_A_NAME.sub("_", name)


def round_scalars(record: RoundRecord) -> dict[str, float]:
    """Every number of a round's record by its ``metrics.jsonl`` name, the round itself aside (it is
    the step).

    ``global_acc`` is left out when the method has no global model (None), lists, flags and the
    :data:`PER_CLIENT` accuracies are left out, and any other mapping of numbers (``domain_acc``)
    gives one value per entry, named ``domain_acc/<domain>``.
    """
    fields = asdict(record)
    extra = fields.pop("extra")
    fields.pop("round")
    scalars: dict[str, float] = {}
    for name, value in [*fields.items(), *extra.items()]:
        if name in PER_CLIENT:
            continue
        if isinstance(value, Mapping):
            scalars.update({metric_name(f"{name}/{key}"): float(v) for key, v in value.items() if _is_number(v)})
        elif _is_number(value):
            scalars[metric_name(name)] = float(value)
    return scalars


def config_text(value: Any) -> str:
    """A configuration value as the run config writes it (``true``, ``0.01``, ``fedavg``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_params(config: TrackedRun) -> dict[str, str]:
    """Every resolved configuration key, sorted, with its value as text (what MLflow stores)."""
    return {key: config_text(value) for key, value in sorted(config.as_dict().items())}
