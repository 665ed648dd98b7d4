"""CoOp-local vs PromptFL vs SDFed on one open_clip model, one `flwr run` per method and setting.

Prints one markdown table over partitions and client counts: mean / worst local
test accuracy, bytes per round per client (up + down), seconds per round::

    python benchmarks/family_a.py --data /data/cifar10-train.tar.gz \
        --clients 10,100 --partitions pathological,dirichlet --rounds 10

The default model is the random-init ``fedapp-tiny-clip``: without pretrained
weights the accuracies show the mechanics, not CLIP's strength. Pass
``--clip-model ViT-B-16 --pretrained openai`` on a machine with the weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import add_common_arguments, common_overrides, markdown_table, partition_overrides, run_method

METHODS = ("coop-local", "promptfl", "sdfed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(
        parser, methods=METHODS, results_dir="results/benchmarks/family-a", rounds=10, lr=0.01, batch_size=16
    )
    parser.add_argument("--clients", default="10,100", help="comma list of client counts")
    parser.add_argument("--partitions", default="pathological,dirichlet")
    parser.add_argument("--classes-per-client", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--fraction", type=float, default=None, help="default: 1.0 for 10 clients, 0.1 for more")
    parser.add_argument("--shots", type=int, default=16, help="training samples per class per client")
    parser.add_argument("--clip-model", default="fedapp-tiny-clip")
    parser.add_argument("--pretrained", default="")
    args = parser.parse_args()

    runs = []
    for clients in (int(c) for c in args.clients.split(",")):
        fraction = args.fraction if args.fraction is not None else (1.0 if clients <= 10 else 0.1)
        for partition in args.partitions.split(","):
            common = {
                **common_overrides(args),
                "fraction-fit": fraction,
                "min-clients": 2,
                **partition_overrides(args, partition),
            }
            setting = f"N{clients}-C{fraction:g}-{partition}-R{args.rounds}"
            runs += [run_method(method, common, setting, clients) for method in args.methods.split(",")]

    print(f"\nModel {args.clip_model} ({args.pretrained or 'random init'}), {args.shots} shots per class\n")
    header = ["setting", "method", "mean acc", "worst acc", "bytes/round/client", "s/round"]
    rows = [
        [
            r.setting,
            r.method,
            f"{r.summary['final_acc_mean']:.4f}",
            f"{r.summary['final_acc_worst']:.4f}",
            f"{r.bytes_per_round_per_client:,.0f}",
            f"{r.seconds_per_round:.1f}",
        ]
        for r in runs
    ]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
