"""PEP-FedPT vs FedVPT, FedVPT-D, local VPT and head-only FedAvg on a frozen ViT.

One `flwr run` per method and partition. Prints a markdown table in the
paper's terms: mean and worst local test accuracy of the training clients,
mean accuracy of the held-out clients (which never train and are evaluated
with the global prompts, prototypes and their own label counts), rounds to the
target accuracy, and parameters communicated::

    python benchmarks/family_d.py --data /data/cifar10-train.tar.gz \
        --partitions pathological,dirichlet --rounds 15

The default backbone is the random-init ``fedapp-tiny-vit`` (8 blocks, 32x32
input), so the figures show the methods' mechanics on CPU, not a pretrained
ViT's strength. The paper's setting (ViT-B/16 pretrained, CIFAR-100, 224x224)
is ``--clip-model ViT-B-16 --pretrained openai --image-size 224`` on a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (
    MethodRun,
    add_common_arguments,
    common_overrides,
    fmt_count,
    markdown_table,
    partition_overrides,
    run_method,
)

METHODS = ("pep-fedpt", "fedvpt", "fedvpt-d", "local-vpt", "head-fedavg")


def parse_args() -> argparse.Namespace:
    """The command line: the comparison scripts' common options, the clients, partitions and backbone."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(
        parser, methods=METHODS, results_dir="results/benchmarks/family-d", rounds=15, lr=0.01, batch_size=32
    )
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--held-out", type=float, default=0.2, help="share of clients that never train")
    parser.add_argument("--partitions", default="pathological,dirichlet")
    parser.add_argument("--classes-per-client", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--shots", type=int, default=50, help="training samples per class per client (0 = all)")
    parser.add_argument("--clip-model", default="fedapp-tiny-vit")
    parser.add_argument("--pretrained", default="")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--target", type=float, default=0.5, help="accuracy for rounds-to-target")
    return parser.parse_args()


def results_table(runs: list[MethodRun]) -> str:
    """One row per partition and method, in the paper's terms (held-out accuracy, rounds to target)."""
    header = [
        "setting",
        "method",
        "mean acc",
        "worst acc",
        "held-out acc",
        "rounds to target",
        "params communicated",
        "s/round",
    ]
    rows = []
    for r in runs:
        held = r.summary.get("final_held_out_acc_mean")
        reached = r.summary["rounds_to_target"]
        rows.append(
            [
                r.setting,
                r.method,
                f"{r.summary['final_acc_mean']:.4f}",
                f"{r.summary['final_acc_worst']:.4f}",
                "n/a" if held is None else f"{held:.4f}",
                "not reached" if reached is None else str(reached),
                fmt_count(r.summary["total_params_communicated"]),
                f"{r.seconds_per_round:.1f}",
            ]
        )
    return markdown_table(header, rows)


def main() -> None:
    """Run every method on every partition and print the comparison table."""
    args = parse_args()
    runs = []
    for partition in args.partitions.split(","):
        common = {
            **common_overrides(args),
            "num-partitions": args.clients,
            "held-out-fraction": args.held_out,
            "min-clients": 2,
            **partition_overrides(args, partition),
            "image-size": args.image_size,
            "target-accuracy": args.target,
        }
        setting = f"N{args.clients}-H{args.held_out:g}-{partition}-R{args.rounds}"
        runs += [run_method(method, common, setting, args.clients) for method in args.methods.split(",")]

    print(
        f"\nBackbone {args.clip_model} ({args.pretrained or 'random init'}, frozen), {args.clients} clients, "
        f"{args.held_out:.0%} held out, {args.shots or 'all'} shots per class, target {args.target}\n"
    )
    print(results_table(runs))


if __name__ == "__main__":
    main()
