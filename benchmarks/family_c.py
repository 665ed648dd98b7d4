"""FedD2P vs its baselines B1 (standalone), B2 (aggregated knowledge, no FM) and
B3 (generator on ground truth only), one `flwr run` per method and Dirichlet alpha.

Prints a markdown table: mean and worst local test accuracy of the devices'
own CNNs (VGG-2/3/4 cycled over devices), bytes up and down per device per
round, and seconds per round::

    python benchmarks/family_c.py --data /data/cifar10-train.tar.gz \
        --alphas 0.1,10 --rounds 10

``--mlp`` adds the ablation with an MLP generator in place of attention. The
server's CLIP defaults to the random-init ``fedapp-tiny-clip``: the figures show
the mechanics and the edge footprint, not what a pretrained CLIP's knowledge is
worth. The paper's setting (ViT-B/32 CLIP pretrained, 10 devices, 20 rounds,
10 local epochs, batch 128, 4,000 samples each) is
``--clip-model ViT-B-32 --pretrained openai --rounds 20 --local-epochs 10
--batch-size 128 --shots 0`` on a machine with the weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import MethodRun, add_common_arguments, common_overrides, markdown_table, run_method

METHODS = ("fedd2p", "fedd2p-agg", "fedd2p-gt", "standalone")
LABELS = {
    "fedd2p": "FedD2P",
    "fedd2p-agg": "B2: aggregated knowledge, no FM",
    "fedd2p-gt": "B3: generator on ground truth",
    "standalone": "B1: standalone",
}


def mean_bytes(run: MethodRun, key: str) -> float:
    return sum(m[key] for m in run.metrics) / len(run.metrics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(
        parser,
        methods=METHODS,
        results_dir="results/benchmarks/family-c",
        rounds=10,
        lr=0.01,
        batch_size=32,
        local_epochs=2,
    )
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--alphas", default="0.1,10", help="comma list of Dirichlet concentrations")
    parser.add_argument("--shots", type=int, default=30, help="training samples per class per device (0 = all)")
    parser.add_argument("--client-models", default="vgg-2,vgg-3,vgg-4")
    parser.add_argument("--clip-model", default="fedapp-tiny-clip")
    parser.add_argument("--pretrained", default="")
    parser.add_argument("--steps", type=int, default=100, help="generator steps per round")
    parser.add_argument("--mlp", action="store_true", help="also run FedD2P with an MLP generator (ablation)")
    args = parser.parse_args()

    runs: list[tuple[str, MethodRun]] = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        common = {
            **common_overrides(args),
            "num-partitions": args.clients,
            "partition": "dirichlet",
            "alpha": alpha,
            "shots-per-class": args.shots,
            "client-models": args.client_models,
            "clip-model": args.clip_model,
            "pretrained": args.pretrained,
            "d2p-steps": args.steps,
        }
        setting = f"N{args.clients}-dirichlet{alpha:g}-R{args.rounds}"
        for method in args.methods.split(","):
            runs.append((LABELS.get(method, method), run_method(method, common, setting, args.clients)))
        if args.mlp:
            ablation = {**common, "d2p-generator": "mlp"}
            runs.append(("FedD2P, MLP generator", run_method("fedd2p", ablation, f"{setting}-mlp", args.clients)))

    print(
        f"\nServer CLIP {args.clip_model} ({args.pretrained or 'random init'}), devices {args.client_models}, "
        f"{args.shots or 'all'} shots per class, {args.local_epochs} local epochs\n"
    )
    header = ["setting", "method", "mean acc", "worst acc", "bytes up/device/round", "bytes down/device/round"]
    header.append("s/round")
    rows = [
        [
            run.setting.removesuffix("-mlp"),
            label,
            f"{run.summary['final_acc_mean']:.4f}",
            f"{run.summary['final_acc_worst']:.4f}",
            f"{mean_bytes(run, 'bytes_up_per_client'):,.0f}",
            f"{mean_bytes(run, 'bytes_down_per_client'):,.0f}",
            f"{run.seconds_per_round:.1f}",
        ]
        for label, run in runs
    ]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
