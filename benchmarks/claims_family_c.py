"""CLAIMS.md's one-machine Family C tables, from the run records in ``benchmarks/claims-runs/family-c``.

    python benchmarks/claims_family_c.py [--claims] [RECORDS_DIR]

Prints, for α = 0.1 and α = 10, one row per setting and seed (round-10 mean and worst client,
the mean of rounds 8-10, the mechanism's figures and round 1), mean ± std over seeds, then each
claim's difference paired seed by seed at round 10 and over rounds 8-10, in how many seeds the
first setting is higher, and its clients above / below / level with themselves in the other run.
``fedapp-report --paired-against`` gives the round-10 differences and client counts too; the
rounds 8-10 means are this script's alone.

``--claims`` prints the paper's claims instead, one row per claim and α, beside the paper's CIFAR-10
figures, with a verdict by one rule: a claim "a beats b" holds when a is above b in every seed both
at round 10 and over rounds 8-10, is reversed when a is below b in every seed at both, and has no
consistent order otherwise (seeds, or round 10 and rounds 8-10, disagree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

RECORDS = Path(__file__).resolve().parent / "claims-runs" / "family-c"
ROUNDS = 10
PRESET_DEFAULTS = {"d2p-generator": "attention", "d2p-distil-temperature": 0.0}
SETTINGS = {  # label: (method, the one key it changes from the preset's value, or None)
    "FedD2P": ("fedd2p", None),
    "B1 (standalone)": ("standalone", None),
    "B2 (fedd2p-agg)": ("fedd2p-agg", None),
    "B3 (fedd2p-gt)": ("fedd2p-gt", None),
    "FedD2P, MLP generator": ("fedd2p", ("d2p-generator", "mlp")),
    "FedD2P, temperature 1": ("fedd2p", ("d2p-distil-temperature", 1.0)),
}
PAIRS = [
    ("FedD2P", "B1 (standalone)"),
    ("FedD2P", "B2 (fedd2p-agg)"),
    ("FedD2P", "B3 (fedd2p-gt)"),
    ("FedD2P", "FedD2P, MLP generator"),
    ("FedD2P, temperature 1", "FedD2P"),
    ("FedD2P, temperature 1", "B1 (standalone)"),
    ("B2 (fedd2p-agg)", "B1 (standalone)"),
    ("B3 (fedd2p-gt)", "B1 (standalone)"),
    ("B3 (fedd2p-gt)", "B2 (fedd2p-agg)"),
]
PAPER_CIFAR10 = {  # FedD2P paper, Table 1, CIFAR-10, accuracy in % at α = 0.1 and α = 10
    "FedD2P": {0.1: 75.95, 10.0: 77.36},
    "B1 (standalone)": {0.1: 66.16, 10.0: 67.25},
    "B2 (fedd2p-agg)": {0.1: 68.35, 10.0: 70.39},
    "B3 (fedd2p-gt)": {0.1: 74.01, 10.0: 73.21},
}
CLAIMS = [  # the paper's claim: (a, b) for "a beats b"
    ("FedD2P beats B1", ("FedD2P", "B1 (standalone)")),
    ("FedD2P beats B2", ("FedD2P", "B2 (fedd2p-agg)")),
    ("FedD2P beats B3", ("FedD2P", "B3 (fedd2p-gt)")),
    ("B2 beats B1", ("B2 (fedd2p-agg)", "B1 (standalone)")),
    ("B3 beats B2", ("B3 (fedd2p-gt)", "B2 (fedd2p-agg)")),
    ("the attention generator beats an MLP generator", ("FedD2P", "FedD2P, MLP generator")),
]
Rounds = list[dict]


def seed_records(records: Path, method: str, alpha: float, change: tuple[str, object] | None) -> dict[int, Rounds]:
    """Seed -> the rounds of every 10-round record of ``method`` at ``alpha`` that changes ``change`` alone."""
    found = {}
    for run in sorted(records.glob("*-s[0-9]")):
        config = yaml.safe_load((run / "config.yaml").read_text())
        if (config["method"], config["alpha"], config["num-rounds"]) != (method, alpha, ROUNDS):
            continue
        changed = {key: config[key] for key, default in PRESET_DEFAULTS.items() if config.get(key, default) != default}
        if changed != dict([change] if change else []):
            continue
        found[config["seed"]] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return found


def mean_std(values: list[float], signed: bool = False) -> str:
    number = "{:+.4f}" if signed else "{:.4f}"
    if len(values) == 1:
        return number.format(values[0])
    return f"{number.format(statistics.mean(values))} ± {statistics.stdev(values):.4f}"


def last3(rounds: Rounds) -> float:
    return statistics.mean(line["acc_mean"] for line in rounds[ROUNDS - 3 : ROUNDS])


def figure(line: dict, key: str) -> str:
    return "—" if line.get(key) is None else f"{line[key]:.3f}"


def setting_rows(found: dict[str, dict[int, Rounds]]) -> list[str]:
    out = [
        "| setting | seed | acc mean, round 10 | worst client | rounds 8-10 mean | `a_c` / `g_c` on the class "
        "| client KL term | round 1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, seeds in found.items():
        for seed, rounds in sorted(seeds.items()):
            last = rounds[ROUNDS - 1]
            out.append(
                f"| {label} | {seed} | {last['acc_mean']:.4f} | {last['acc_worst']:.4f} | {last3(rounds):.4f} | "
                f"{figure(last, 'a_true_class_mass')} / {figure(last, 'g_true_class_mass')} | "
                f"{figure(last, 'fit_distillation_kl')} | {rounds[0]['acc_mean']:.4f} |"
            )
        if len(seeds) > 1:
            runs = list(seeds.values())
            out.append(
                f"| {label} | mean ± std | {mean_std([r[ROUNDS - 1]['acc_mean'] for r in runs])} | "
                f"{mean_std([r[ROUNDS - 1]['acc_worst'] for r in runs])} | {mean_std([last3(r) for r in runs])} | | | |"
            )
    return out


def paired(found: dict[str, dict[int, Rounds]], a: str, b: str) -> tuple[list[int], list[float], list[float], str]:
    """Seeds both settings ran, a − b per seed at round 10 and over rounds 8-10, and its clients'
    counts higher / lower / equal (each client against itself in b's run of the same seed)."""
    seeds = sorted(set(found[a]) & set(found[b]))
    at10 = [found[a][s][ROUNDS - 1]["acc_mean"] - found[b][s][ROUNDS - 1]["acc_mean"] for s in seeds]
    over3 = [last3(found[a][s]) - last3(found[b][s]) for s in seeds]
    clients = [
        found[a][s][ROUNDS - 1]["client_acc"][k] - found[b][s][ROUNDS - 1]["client_acc"][k]
        for s in seeds
        for k in found[a][s][ROUNDS - 1]["client_acc"]
    ]
    counts = (sum(d > 1e-9 for d in clients), sum(d < -1e-9 for d in clients), sum(abs(d) <= 1e-9 for d in clients))
    return seeds, at10, over3, " / ".join(map(str, counts))


def claim_rows(found: dict[str, dict[int, Rounds]]) -> list[str]:
    out = [
        "| claim | seeds | round 10, paired | rounds 8-10, paired | higher in "
        "| devices higher / lower / equal, round 10 |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in PAIRS:
        seeds, at10, over3, counts = paired(found, a, b)
        if seeds:
            out.append(
                f"| {a} − {b} | {', '.join(map(str, seeds))} | {mean_std(at10, True)} | {mean_std(over3, True)} | "
                f"{sum(d > 0 for d in at10)}/{len(at10)} | {counts} |"
            )
    return out


def verdict(at10: list[float], over3: list[float]) -> str:
    """The module docstring's rule: every seed above at round 10 and over rounds 8-10, or every seed below."""
    if all(d > 0 for d in at10 + over3):
        return "**holds**"
    if all(d < 0 for d in at10 + over3):
        return "**does not hold**: reversed"
    return "**does not hold**: no consistent order (seeds or rounds 8-10 disagree)"


def paper_claim_rows(by_alpha: dict[float, dict[str, dict[int, Rounds]]]) -> list[str]:
    out = [
        "| claim | α | paper (CIFAR-10, %) | ours: a − b, round 10 | rounds 8-10 | seeds a higher "
        "| devices a higher / lower / equal | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for claim, (a, b) in CLAIMS:
        for alpha, found in by_alpha.items():
            seeds, at10, over3, counts = paired(found, a, b)
            if not seeds:
                continue
            paper = (
                f"{PAPER_CIFAR10[a][alpha]} against {PAPER_CIFAR10[b][alpha]}"
                if a in PAPER_CIFAR10 and b in PAPER_CIFAR10
                else "Fig. 2(b)"
            )
            out.append(
                f"| {claim} | {alpha:g} | {paper} | {mean_std(at10, True)} | {mean_std(over3, True)} | "
                f"{sum(d > 0 for d in at10)} of {len(at10)} | {counts} | {verdict(at10, over3)} |"
            )
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("records", nargs="?", type=Path, default=RECORDS, help="the Family C run records")
    parser.add_argument("--claims", action="store_true", help="the paper's claims with their verdicts")
    args = parser.parse_args(argv)
    if not args.records.is_dir():
        parser.error(f"no folder of run records at {args.records}")
    by_alpha = {
        alpha: {label: seed_records(args.records, setting[0], alpha, setting[1]) for label, setting in SETTINGS.items()}
        for alpha in (0.1, 10.0)
    }
    if args.claims:
        print("\n".join(line.replace("-0.", "−0.") for line in paper_claim_rows(by_alpha)))
        return 0
    for alpha, found in by_alpha.items():
        table = [*setting_rows(found), "", *claim_rows(found)]
        print(f"\nα = {alpha:g}, round {ROUNDS}:\n\n" + "\n".join(line.replace("-0.", "−0.") for line in table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
