"""A round's record for tests: every field has a plain value unless the test names it."""

from __future__ import annotations

from typing import Any

from fedapp.metrics import RoundRecord


def round_record(server_round: int, **fields: Any) -> RoundRecord:
    """A :class:`~fedapp.metrics.RoundRecord` of ``server_round`` with ``fields`` set and the
    rest defaulted (four clients, half accuracy, one MB per round, one second)."""
    values: dict[str, Any] = {
        "round": server_round,
        "acc_mean": 0.5,
        "acc_worst": 0.4,
        "acc_std": 0.1,
        "clients_evaluated": 4,
        "global_acc": None,
        "train_loss": 1.0,
        "clients_fit": 4,
        "clients_failed": 0,
        "bytes_up_per_client": 1.0,
        "bytes_down_per_client": 1.0,
        "bytes_round_total": 8,
        "mb_cumulative": 1.0 * server_round,
        "round_seconds": 1.0,
    }
    values.update(fields)
    return RoundRecord(**values)
