"""Pretrain a small CLIP contrastively on labelled images, for offline machines.

    python benchmarks/pretrain_clip.py --data /data/cifar10-train.tar.gz --out pretrained/small-clip.pt

Trains ``fedapp-small-clip`` (or ``--model``) on the ``reserve-pretrain`` share of
the source's images (class-stratified, seeded by ``--reserve-seed``), prints one
line per epoch (loss, zero-shot accuracy on a slice of the pretraining part held
back from training, ETA), and finally the zero-shot accuracy on the
``reserve-test`` share that no training sees. Writes the checkpoint, ``<out>.json``
(key, accuracy, curve) and ``<out>.png`` (the curve). Federated runs then load it
with ``pretrained="<out>"`` and the same ``reserve-*`` keys, so they never touch a
pretraining image::

    flwr run . --run-config 'clip-model="fedapp-small-clip" pretrained="/abs/path/small-clip.pt"
        reserve-pretrain=0.5 reserve-test=0.1 ...'

Interrupted runs resume from ``<out>.partial`` at the last finished epoch; a
finished checkpoint with the same key is reused, one made from other settings is
never overwritten.

``--device auto`` (the default) trains on a GPU when torch sees one, under bfloat16
autocast (``--precision auto``; ``fp32`` to turn it off, which is also what the CPU
runs). Batches go to the device as ``uint8`` and are normalised, cropped and flipped
there, so the GPU is not waiting on a CPU loader. The checkpoint is the same file
either way (fp32 weights, written from the CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fedapp.data import load_source
from fedapp.data.arrays import resolve_cache_dir
from fedapp.errors import FedAppError
from fedapp.models.clip import SMALL_CLIP
from fedapp.pretrain import PRECISIONS, PretrainSettings, pretrain_clip
from fedapp.training import select_device


def _plot(curve: list[dict[str, float | None]], accuracy: float, path: Path, title: str) -> None:
    import matplotlib  # noqa: PLC0415 - plotting only at the end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    epochs = [row["epoch"] for row in curve]
    fig, loss_axis = plt.subplots(figsize=(6, 3.5))
    loss_axis.plot(epochs, [row["loss"] for row in curve], color="tab:blue", label="training loss")
    loss_axis.set_xlabel("epoch")
    loss_axis.set_ylabel("loss")
    acc_axis = loss_axis.twinx()
    held_back = [float("nan") if row["curve_zero_shot"] is None else row["curve_zero_shot"] for row in curve]
    acc_axis.plot(epochs, held_back, color="tab:orange", label="zero-shot (held back)")
    acc_axis.axhline(accuracy, color="tab:green", linestyle="--", label=f"zero-shot on test part: {accuracy:.3f}")
    acc_axis.set_ylabel("zero-shot accuracy")
    acc_axis.set_ylim(0, 1)
    fig.legend(loc="lower center", ncol=3, fontsize=7)
    loss_axis.set_title(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="ImageFolder folder or .tar.gz (all of the source's images)")
    parser.add_argument("--out", help="checkpoint path (default: <cache-dir>/pretrained/<model>-<key>.pt)")
    parser.add_argument("--model", default=SMALL_CLIP, help="open_clip config name")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reserve-pretrain", type=float, default=0.5)
    parser.add_argument("--reserve-test", type=float, default=0.1)
    parser.add_argument("--reserve-seed", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to train")
    parser.add_argument(
        "--precision",
        default="auto",
        choices=("auto", *PRECISIONS),
        help="autocast: auto is bf16 on a GPU, fp32 on the CPU",
    )
    parser.add_argument(
        "--cache-dir", default="", help="decoded images and default checkpoints (default ~/.cache/fedapp)"
    )
    return parser


class _Progress:
    """Prints one line per epoch: loss, held-back zero-shot accuracy, the epoch's seconds, ETA."""

    def __init__(self, epochs: int) -> None:
        self.epochs, self.started, self.finished = epochs, time.perf_counter(), []

    def __call__(self, row: dict[str, float | None]) -> None:
        now = time.perf_counter()
        epoch_seconds = now - (self.finished[-1] if self.finished else self.started)
        self.finished.append(now)
        eta = (now - self.started) / len(self.finished) * (self.epochs - row["epoch"])
        held_back = "—" if row["curve_zero_shot"] is None else f"{row['curve_zero_shot']:.4f}"
        print(
            f"epoch {row['epoch']:>3}/{self.epochs}  loss {row['loss']:.4f}  "
            f"zero-shot (held back) {held_back}  {epoch_seconds:.1f} s (with the held-back check)  "
            f"ETA {eta / 60:.1f} min",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    device = select_device(args.device)
    precision = args.precision if args.precision != "auto" else ("bf16" if device.type == "cuda" else "fp32")
    try:
        settings = PretrainSettings(
            model_name=args.model,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            reserve_pretrain=args.reserve_pretrain,
            reserve_test=args.reserve_test,
            reserve_seed=args.reserve_seed,
            seed=args.seed,
            precision=precision,
        )
        source = load_source("imagefolder", data_dir=args.data, image_size=args.image_size, cache_dir=args.cache_dir)
        print(
            f"{len(source):,} images, {source.num_classes} classes; "
            f"pretraining {args.model} on {device} in {precision}",
            flush=True,
        )
        result = pretrain_clip(
            source,
            settings,
            Path(args.out) if args.out else None,
            cache_dir=resolve_cache_dir(args.cache_dir),
            on_epoch=_Progress(args.epochs),
            device=device,
        )
    except (FedAppError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    plot = result.checkpoint.with_name(result.checkpoint.name + ".png")
    if not result.cached or not plot.exists():
        _plot(result.curve, result.zero_shot_accuracy, plot, f"{args.model} on {Path(args.data).name}")
    state = "reused (same settings and data)" if result.cached else "written"
    print(f"checkpoint {state}: {result.checkpoint}")
    print(f"zero-shot accuracy on the reserve-test part: {result.zero_shot_accuracy:.4f}")
    print(json.dumps({"checkpoint": str(result.checkpoint), "key": result.key, "zero_shot": result.zero_shot_accuracy}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
