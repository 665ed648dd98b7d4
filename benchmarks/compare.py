"""Shared by the comparison benchmarks: run methods through `flwr run`, tabulate."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedapp.launch import run


@dataclass(frozen=True)
class MethodRun:
    method: str
    setting: str
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    wall_seconds: float

    @property
    def seconds_per_round(self) -> float:
        """Mean round time after round 1 (which also starts the workers)."""
        steady = [m["round_seconds"] for m in self.metrics[1:]] or [self.metrics[0]["round_seconds"]]
        return sum(steady) / len(steady)

    @property
    def bytes_per_round_per_client(self) -> float:
        """Mean bytes up + down per sampled client per round."""
        return sum(m["bytes_up_per_client"] + m["bytes_down_per_client"] for m in self.metrics) / len(self.metrics)


def run_method(method: str, common: dict[str, Any], setting: str, num_clients: int) -> MethodRun:
    """One `flwr run` of ``method`` with ``common`` overrides; its run folder is ``<method>-<setting>``."""
    started = time.perf_counter()
    run_dir = run({**common, "method": method, "run-name": f"{method}-{setting}"}, num_clients=num_clients)
    wall = time.perf_counter() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"{method} [{setting}]: mean acc {summary['final_acc_mean']:.4f} ({wall:.0f}s)", flush=True)
    return MethodRun(method, setting, summary, metrics, wall)


def data_overrides(data: str | None, test_data: str | None) -> dict[str, Any]:
    """Run-config keys for an ImageFolder source (default: scikit-learn digits)."""
    out: dict[str, Any] = {}
    if data:
        out.update({"dataset": "imagefolder", "data-dir": str(Path(data).expanduser().resolve())})
    if test_data:
        out["test-data-dir"] = str(Path(test_data).expanduser().resolve())
    return out


def fmt_count(value: float | None) -> str:
    """1234567 -> '1.23M'; None -> 'not reached'."""
    if value is None:
        return "not reached"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
