"""pFedLoRA against the model-heterogeneous baselines, one `flwr run` per method.

Prints one markdown table: mean / worst / std local test accuracy, parameters
communicated and training FLOPs until the target mean accuracy is first
reached, and seconds per round::

    python benchmarks/family_b.py --data /data/cifar10-train.tar.gz \
        --clients 10 --fraction 1.0 --rounds 20

Every method gets the same clients, data, rounds, local epochs, batch size and
learning rate; client k runs CNN-(k mod 5 + 1) unless ``--homogeneous``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import MethodRun, data_overrides, fmt_count, markdown_table, run_method

METHODS = ("pfedlora", "standalone", "lg-fedavg", "fedproto", "fd", "fml", "fedkd")
HETERO = "cnn-1,cnn-2,cnn-3,cnn-4,cnn-5"


def parse_args() -> argparse.Namespace:
    """The command line: data, federation, schedule, optimiser, client models and output."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="ImageFolder folder or .tar.gz (default: scikit-learn digits)")
    parser.add_argument("--test-data", help="optional external test split (ImageFolder)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--classes-per-client", type=int, default=2)
    parser.add_argument("--partition", default="pathological")
    parser.add_argument("--target", type=float, default=0.8, help="mean accuracy for the *-to-target columns")
    parser.add_argument("--homogeneous", action="store_true", help="every client runs CNN-1")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--results-dir", default="results/benchmarks/family-b")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def shared_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Run-config keys every method runs with: the same clients, data, schedule and client models."""
    return {
        "num-rounds": args.rounds,
        "fraction-fit": args.fraction,
        "min-clients": max(1, min(2, args.clients)),
        "local-epochs": args.local_epochs,
        "batch-size": args.batch_size,
        "lr": args.lr,
        "momentum": args.momentum,
        "partition": args.partition,
        "classes-per-client": args.classes_per_client,
        "client-models": "cnn-1" if args.homogeneous else HETERO,
        "target-accuracy": args.target,
        "seed": args.seed,
        "results-dir": str(Path(args.results_dir).resolve()),
        **data_overrides(args.data, args.test_data),
    }


def results_table(runs: list[MethodRun]) -> str:
    """One row per method: final accuracies, the cost to the target and seconds per round."""
    header = [
        "method",
        "mean acc",
        "worst acc",
        "std",
        "best mean acc",
        "params to target",
        "FLOPs to target",
        "params total",
        "s/round",
    ]
    rows = [
        [
            r.method,
            f"{r.summary['final_acc_mean']:.4f}",
            f"{r.summary['final_acc_worst']:.4f}",
            f"{r.summary['final_acc_std']:.4f}",
            f"{r.summary['best_acc_mean']:.4f}",
            fmt_count(r.summary["params_to_target"]),
            fmt_count(r.summary["train_flops_to_target"]),
            fmt_count(r.summary["total_params_communicated"]),
            f"{r.seconds_per_round:.1f}",
        ]
        for r in runs
    ]
    return markdown_table(header, rows)


def main() -> None:
    """Run every method on the same clients and print the comparison table."""
    args = parse_args()
    common = shared_overrides(args)
    setting = f"N{args.clients}-C{args.fraction:g}-{args.partition}-E{args.local_epochs}-R{args.rounds}"
    runs = [run_method(method, common, setting, args.clients) for method in args.methods.split(",")]

    print(
        f"\nSetting: {setting}, target mean accuracy {args.target}, client models "
        f"{'CNN-1' if args.homogeneous else 'CNN-1..5'}\n"
    )
    print(results_table(runs))


if __name__ == "__main__":
    main()
