"""What each offline preset's documented command shows: its mean client accuracy in round 1 and in its
last round, its clients that never trained, and, on a CLIP backbone, that backbone's zero-shot accuracy
on the same clients' test images (the figures the method pages and ``tests/integration/
test_presets_accuracy.py`` give).

    python benchmarks/preset_figures.py [conf/sdfed-digits.yaml ...]

Every preset on ``dataset: digits`` by default; each runs in this process, its own rounds, clients and
backbone (``pretrained: reserve`` makes the tiny backbone on first use and caches it), on one torch
thread as the test runs them: a float sum's order differs with the thread count, and over 40 epochs of
pretraining and 10 rounds that moves the last digits of a figure. The pages' figures came from
``OMP_NUM_THREADS=1 FEDAPP_CACHE_DIR=$(mktemp -d) python benchmarks/preset_figures.py`` (the
backbones made afresh, as on a machine that runs the preset first).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fedapp.catalog import CATALOG
from fedapp.config import resolve_run_config
from fedapp.config.run_config import load_preset
from fedapp.config.schema import APP_ROOT
from fedapp.inprocess import run_in_process

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zero_shot import client_accuracies

OFFLINE = sorted(
    path for path in (APP_ROOT / "conf").glob("*.yaml") if load_preset(str(path)).get("dataset") == "digits"
)


def zero_shot(preset: Path) -> tuple[float, int]:
    """The preset backbone's zero-shot mean client accuracy, and how many test images those clients hold."""
    scores = client_accuracies({"preset": str(preset)})
    return sum(scores["acc"]) / len(scores["acc"]), int(sum(scores["images"]))


def figures(preset: Path, results_dir: Path | None = None) -> dict:
    """One run of ``preset``: accuracy by round, held-out accuracy (or None) and zero-shot (or None)."""
    values = {"preset": str(preset), **({"results-dir": str(results_dir)} if results_dir else {})}
    config = resolve_run_config(values)
    history = run_in_process(values).history
    clip = CATALOG[config.method].backbone != "cnn"
    return {
        "accuracy": [record.acc_mean for record in history],
        "held_out": history[-1].extra.get("held_out_acc_mean") if config.held_out_fraction else None,
        "zero_shot": zero_shot(preset) if clip else None,
    }


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    presets = [Path(arg) for arg in argv] or OFFLINE
    print("| preset | round 1 | last round | never trained | zero-shot (test images) |")
    print("|---|---|---|---|---|")
    for preset in presets:
        got = figures(preset)
        held = "" if got["held_out"] is None else f"{got['held_out']:.3f}"
        zero = "" if got["zero_shot"] is None else f"{got['zero_shot'][0]:.3f} ({got['zero_shot'][1]})"
        accuracy = got["accuracy"]
        print(f"| {preset.stem} | {accuracy[0]:.3f} | {accuracy[-1]:.3f} (round {len(accuracy)}) | {held} | {zero} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
