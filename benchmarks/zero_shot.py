"""Zero-shot CLIP on every client's test split, the row prompt-learning papers compare against.

    python benchmarks/zero_shot.py --preset conf/claims-family-a.yaml --seeds 0,1,2 \\
        --run-config 'data-dir="/data/cifar10-train.tar.gz" pretrained="/abs/small-clip.pt"'

Builds each client's data exactly as a federated run with the same configuration
does (partition, splits, shots, base-to-novel, the ``reserve-*`` carve), classifies
its test images with the hand-crafted prompt "a photo of a {c}." and the frozen
CLIP, and prints per seed the mean and worst client accuracy (and under
base-to-novel the base, novel and harmonic-mean accuracy), then mean ± std over
the seeds. Nothing is trained and no process is started.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from fedapp.clientdata import check_data, clip_weights, held_out_clients, load_client_data
from fedapp.config import resolve_run_config
from fedapp.errors import FedAppError
from fedapp.launch import expand_preset, parse_overrides
from fedapp.models.clip import load_open_clip
from fedapp.models.zero_shot import zero_shot_accuracy
from fedapp.report import fmt_mean_std

HAND_CRAFTED = ("a photo of a {c}.",)


def client_accuracies(overrides: dict) -> dict[str, list[float]]:
    """Zero-shot accuracy of every client that a run of ``overrides`` would evaluate (``acc``, under
    base-to-novel ``novel`` too), and how many test images each holds (``images``)."""
    config = resolve_run_config(expand_preset(overrides))
    clients = config.num_partitions
    check_data(config, clients)
    clip = load_open_clip(config.clip_model, clip_weights(config, config.clip_model))
    held = held_out_clients(config)
    scores: dict[str, list[float]] = {"acc": [], "novel": [], "images": []}
    for pid in range(clients):
        if pid in held:
            continue
        data = load_client_data(config, pid, clients)
        test = data.splits["test"]
        if len(test):
            scores["acc"].append(zero_shot_accuracy(clip, test.images, test.labels, data.class_names, HAND_CRAFTED))
            scores["images"].append(len(test))
        novel = data.splits.get("test_novel")
        if novel is not None and len(novel):
            scores["novel"].append(
                zero_shot_accuracy(clip, novel.images, novel.labels, data.novel_class_names, HAND_CRAFTED)
            )
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", help="YAML preset (as for a federated run)")
    parser.add_argument("--run-config", action="append", default=[], help="Flower-style 'key=value ...'")
    parser.add_argument("--seeds", default="0", help="comma list of seeds")
    args = parser.parse_args(argv)
    try:
        base = parse_overrides(args.run_config)
        if args.preset:
            base["preset"] = args.preset
        rows = []
        for seed in (int(s) for s in args.seeds.split(",")):
            scores = client_accuracies({**base, "seed": seed})
            row = {"seed": seed, "acc_mean": float(np.mean(scores["acc"])), "acc_worst": float(np.min(scores["acc"]))}
            if scores["novel"]:
                novel = float(np.mean(scores["novel"]))
                row["novel_acc_mean"] = novel
                row["harmonic_mean"] = 2 * row["acc_mean"] * novel / (row["acc_mean"] + novel)
            rows.append(row)
            print(json.dumps(row), flush=True)
    except FedAppError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for key in rows[0]:
        if key != "seed":
            print(f"{key}: {fmt_mean_std([row[key] for row in rows])} over {len(rows)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
