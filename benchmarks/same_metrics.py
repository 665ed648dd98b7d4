"""Per-round metrics of one method per family, 2 rounds in this process, for comparing two checkouts.

A change that should not change what a run computes (a move, a split, a rename) is checked by
running this in the checkout before and after it and comparing the two outputs, which must be
equal to the last digit::

    PYTHONPATH=<old checkout> python benchmarks/same_metrics.py > before.json
    python benchmarks/same_metrics.py > after.json && cmp before.json after.json

(``PYTHONPATH`` puts that checkout's ``fedapp`` ahead of the installed one.) Digits, 4 clients, the
random-init tiny backbones, CPU, one thread: nothing to download, about a minute on 2 cores.
"""

from __future__ import annotations

import json
import sys

import torch

from fedapp.inprocess import run_in_process

FAMILIES = {
    "pfedlora": {"method": "pfedlora"},
    "sdfed": {"method": "sdfed"},
    "pep-fedpt": {"method": "pep-fedpt", "clip-model": "fedapp-tiny-vit"},
    "fedd2p": {"method": "fedd2p", "d2p-steps": 5},
}
COMMON = {"num-partitions": 4, "num-rounds": 2, "shots-per-class": 8, "device": "cpu", "seed": 3}
FIGURES = ("acc_mean", "acc_worst", "train_loss", "params_round_total")


def main() -> int:
    torch.set_num_threads(1)
    out = {}
    for family, values in FAMILIES.items():
        history = run_in_process({**COMMON, **values}).history
        out[family] = [{name: getattr(record, name) for name in FIGURES} for record in history]
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
