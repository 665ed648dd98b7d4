"""Shared by the comparison benchmarks: run methods through `flwr run`, tabulate."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedapp.config import settings_digest
from fedapp.launch import prepare_run, run

# Moved to fedapp.report (the run report uses them too); the benchmark scripts still import them from here.
from fedapp.report import fmt_count, markdown_table  # noqa: F401 - re-exported


@dataclass(frozen=True)
class MethodRun:
    method: str
    setting: str
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    wall_seconds: float
    run_dir: Path

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
    """One `flwr run` of ``method`` with ``common`` overrides.

    Its run folder is ``<method>-<setting>-<digest of every setting>``: a rerun with other settings
    gets a folder of its own, and one with the same settings is refused (results are never overwritten).
    """
    overrides = {**common, "method": method}
    digest = settings_digest(prepare_run(overrides, num_clients).config.as_dict())
    started = time.perf_counter()
    run_dir = run({**overrides, "run-name": f"{method}-{setting}-{digest}"}, num_clients=num_clients)
    wall = time.perf_counter() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"{method} [{setting}]: mean acc {summary['final_acc_mean']:.4f} ({wall:.0f}s)", flush=True)
    return MethodRun(method, setting, summary, metrics, wall, run_dir)


def data_overrides(data: str | None, test_data: str | None) -> dict[str, Any]:
    """Run-config keys for an ImageFolder source (default: scikit-learn digits)."""
    out: dict[str, Any] = {}
    if data:
        out.update({"dataset": "imagefolder", "data-dir": str(Path(data).expanduser().resolve())})
    if test_data:
        out["test-data-dir"] = str(Path(test_data).expanduser().resolve())
    return out


def add_common_arguments(
    parser: argparse.ArgumentParser,
    *,
    methods: tuple[str, ...],
    results_dir: str,
    rounds: int,
    lr: float,
    batch_size: int,
    local_epochs: int = 1,
) -> None:
    """The options every comparison script takes: data, schedule, optimiser, output."""
    parser.add_argument("--data", help="ImageFolder folder or .tar.gz (default: scikit-learn digits)")
    parser.add_argument("--test-data", help="optional external test split (ImageFolder)")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--local-epochs", type=int, default=local_epochs)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--methods", default=",".join(methods))
    parser.add_argument("--results-dir", default=results_dir)


def common_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Run-config keys from :func:`add_common_arguments` (SGD with momentum 0.9)."""
    return {
        "num-rounds": args.rounds,
        "local-epochs": args.local_epochs,
        "batch-size": args.batch_size,
        "lr": args.lr,
        "momentum": 0.9,
        "results-dir": str(Path(args.results_dir).resolve()),
        **data_overrides(args.data, args.test_data),
    }


def partition_overrides(args: argparse.Namespace, partition: str) -> dict[str, Any]:
    """Run-config keys of one partition setting on a frozen open_clip backbone."""
    return {
        "partition": partition,
        "classes-per-client": args.classes_per_client,
        "alpha": args.alpha,
        "shots-per-class": args.shots,
        "clip-model": args.clip_model,
        "pretrained": args.pretrained,
    }
