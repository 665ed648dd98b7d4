"""pFedLoRA against the model-heterogeneous baselines, one `flwr run` per method.

Prints one markdown table: mean / worst / std local test accuracy, parameters
communicated and training FLOPs until the target mean accuracy is first
reached, and seconds per round::

    python benchmarks/family_b.py --data ../shared/datasets/cifar10-train.tar.gz \
        --clients 10 --fraction 1.0 --rounds 30

Every method gets the same clients, data, rounds, local epochs, batch size and
learning rate; client k runs CNN-(k mod 5 + 1) unless ``--homogeneous``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fedapp.launch import run

METHODS = ("pfedlora", "standalone", "lg-fedavg", "fedproto", "fd", "fml", "fedkd")
HETERO = "cnn-1,cnn-2,cnn-3,cnn-4,cnn-5"


def fmt_count(value: float | None) -> str:
    if value is None:
        return "not reached"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="ImageFolder folder or .tar.gz (default: scikit-learn digits)")
    parser.add_argument("--test-data", help="optional external test split (ImageFolder)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=30)
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
    args = parser.parse_args()

    common = {
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
    }
    if args.data:
        common.update({"dataset": "imagefolder", "data-dir": str(Path(args.data).expanduser().resolve())})
    if args.test_data:
        common["test-data-dir"] = str(Path(args.test_data).expanduser().resolve())
    setting = f"N{args.clients}-C{args.fraction:g}-{args.partition}-E{args.local_epochs}-R{args.rounds}"
    rows = []
    for method in args.methods.split(","):
        started = time.perf_counter()
        run_dir = run({**common, "method": method, "run-name": f"{method}-{setting}"}, num_clients=args.clients)
        wall = time.perf_counter() - started
        summary = json.loads((run_dir / "summary.json").read_text())
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steady = [m["round_seconds"] for m in metrics[1:]] or [metrics[0]["round_seconds"]]
        rows.append((method, summary, sum(steady) / len(steady), wall))
        print(f"{method}: mean acc {summary['final_acc_mean']:.4f} ({wall:.0f}s)", flush=True)

    print(
        f"\nSetting: {setting}, target mean accuracy {args.target}, client models "
        f"{'CNN-1' if args.homogeneous else 'CNN-1..5'}\n"
    )
    print(
        "| method | mean acc | worst acc | std | best mean acc | params to target | FLOPs to target "
        "| params total | s/round |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for method, s, per_round, _ in rows:
        to_target = f"{fmt_count(s['params_to_target'])} | {fmt_count(s['train_flops_to_target'])}"
        print(
            f"| {method} | {s['final_acc_mean']:.4f} | {s['final_acc_worst']:.4f} | {s['final_acc_std']:.4f} "
            f"| {s['best_acc_mean']:.4f} | {to_target} | {fmt_count(s['total_params_communicated'])} "
            f"| {per_round:.1f} |"
        )


if __name__ == "__main__":
    main()
