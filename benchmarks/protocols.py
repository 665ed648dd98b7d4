"""Every method on the same evaluation protocols, then one comparison report.

The data is turned into ``--domains`` synthetic domains (grayscale, blur,
colour-shift, rotation, ...), each split between ``--clients-per-domain``
clients by Dirichlet. Three protocols, one `flwr run` per method and protocol:

* ``domain``: every client trains; accuracy per domain beside the mean.
* ``lodo`` (leave-one-domain-out): the last domain's clients never train and are
  evaluated at the end by the methods that can serve a new client.
* ``b2n`` (base-to-novel, text-prompt methods only): clients train on the first
  half of the classes and are scored on both halves; harmonic mean reported.

Then ``fedapp-report`` writes the markdown table and the figure over all runs::

    python benchmarks/protocols.py --data /data/cifar10-train.tar.gz
    python benchmarks/protocols.py --methods fedavg,promptfl --protocols domain --rounds 3   # quicker

Backbones are the random-init tiny ones by default (CPU, no downloads), so the
figures compare the protocols' mechanics, not pretrained CLIP's strength.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import add_common_arguments, common_overrides, run_method

from fedapp.catalog import CATALOG
from fedapp.report import write_report

METHODS = ("fedavg", "standalone", "pfedlora", "fedd2p", "promptfl", "sdfed", "pep-fedpt")
PROTOCOLS = ("domain", "lodo", "b2n")
# Learning rates of the family benchmarks: SGD on whole CNNs vs on prompts and heads of a frozen backbone.
CNN_LR, PROMPT_LR = 0.05, 0.01
# What each family needs besides the common keys (the family benchmarks' backbones).
METHOD_KEYS = {
    "pfedlora": {"client-models": "cnn-1,cnn-2,cnn-3,cnn-4,cnn-5"},
    "fedd2p": {"client-models": "vgg-2,vgg-3,vgg-4", "d2p-steps": 50},
    "pep-fedpt": {"clip-model": "fedapp-tiny-vit"},
}


def protocol_keys(protocol: str, domains: int, per_domain: int) -> dict:
    keys = {
        "partition": "domain",
        "synthetic-domains": domains,
        "clients-per-domain": per_domain,
        "num-partitions": domains * per_domain,
    }
    if protocol == "lodo":
        keys["held-out-domain"] = domains - 1
    if protocol == "b2n":
        keys["base-to-novel"] = True
    return keys


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(
        parser, methods=METHODS, results_dir="results/benchmarks/protocols", rounds=10, lr=0.0, batch_size=32
    )
    parser.set_defaults(lr=None)  # by default each method gets its family's rate (CNN_LR or PROMPT_LR)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--domains", type=int, default=4)
    parser.add_argument("--clients-per-domain", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.3, help="Dirichlet split of a domain among its clients")
    parser.add_argument("--shots", type=int, default=50, help="training samples per class per client (0 = all)")
    parser.add_argument("--target", type=float, default=0.3, help="accuracy for rounds/seconds-to-target")
    args = parser.parse_args(argv)

    run_dirs = []
    for protocol in args.protocols.split(","):
        if protocol not in PROTOCOLS:
            parser.error(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
        keys = protocol_keys(protocol, args.domains, args.clients_per_domain)
        methods = [m for m in args.methods.split(",") if protocol != "b2n" or CATALOG[m].names_unseen_classes]
        for method in methods:
            common = {
                **common_overrides(args),
                **keys,
                "alpha": args.alpha,
                "shots-per-class": args.shots,
                "target-accuracy": args.target,
                "min-clients": 2,
                "lr": args.lr or (CNN_LR if CATALOG[method].backbone.startswith("cnn") else PROMPT_LR),
                **METHOD_KEYS.get(method, {}),
            }
            setting = f"{protocol}-D{args.domains}x{args.clients_per_domain}-R{args.rounds}"
            run_dirs.append(run_method(method, common, setting, int(keys["num-partitions"])).run_dir)
    results = Path(args.results_dir)
    markdown = write_report(run_dirs, results / "report.md", results / "report.png", args.target)
    print(markdown)
    return markdown


if __name__ == "__main__":
    main()
