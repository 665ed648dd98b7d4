"""FedAvg on real CIFAR-10 images (ImageFolder .tar.gz), 10 clients, through ``flwr run``.

Prints the final mean/worst client accuracy and seconds per round; the full
per-round metrics and plots land in the run folder it names::

    python benchmarks/cifar10_fedavg.py --data /data/cifar10-train.tar.gz

The archive holds CIFAR-10's 50,000 training images; each client's share is
split 8:1:1 into train/val/test, so accuracy is measured on held-out images
from the clients' own label distributions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fedapp.launch import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="CIFAR-10 in ImageFolder layout: a folder or .tar.gz")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--partition", default="dirichlet", choices=["iid", "dirichlet", "pathological"])
    parser.add_argument("--model", default="cnn-1")
    parser.add_argument("--local-epochs", type=int, help="default: the preset's (2)")
    parser.add_argument("--results-dir", default="results/benchmarks")
    args = parser.parse_args()

    overrides = {
        "preset": "conf/fedavg-cifar10.yaml",
        "data-dir": str(Path(args.data).expanduser().resolve()),
        "num-rounds": args.rounds,
        "partition": args.partition,
        "model": args.model,
        "results-dir": str(Path(args.results_dir).resolve()),
        "run-name": f"cifar10-fedavg-{args.partition}-{args.model}-{args.clients}c-{args.rounds}r",
    }
    if args.local_epochs is not None:
        overrides["local-epochs"] = args.local_epochs
    started = time.perf_counter()
    run_dir = run(overrides, num_clients=args.clients)
    wall = time.perf_counter() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Round 1 also pays for worker start-up and the one-time image decode.
    steady = [r["round_seconds"] for r in rows[1:]] or [rows[0]["round_seconds"]]
    print(f"run folder:           {run_dir}")
    print(f"rounds:               {summary['rounds']}")
    print(f"final mean acc:       {summary['final_acc_mean']:.4f}")
    print(f"final worst acc:      {summary['final_acc_worst']:.4f}")
    print(f"final global acc:     {summary['final_global_acc']:.4f}")
    print(f"first round seconds:  {rows[0]['round_seconds']:.1f}")
    print(f"seconds per round:    {sum(steady) / len(steady):.1f} (rounds 2..{len(rows)})")
    print(f"MB communicated:      {summary['total_mb']:.1f}")
    print(f"wall time:            {wall:.0f}s")


if __name__ == "__main__":
    main()
