"""CLAIMS.md's one-machine Family C tables, from the run records in ``benchmarks/claims-runs/family-c``.

    python benchmarks/claims_family_c.py [RECORDS_DIR]

Prints, for α = 0.1 and α = 10, one row per setting and seed (round-10 mean and worst client,
the mean of rounds 8-10, the mechanism's figures and round 1), mean ± std over seeds, then each
claim's difference paired seed by seed at round 10 and over rounds 8-10, in how many seeds the
first setting is higher, and its clients above / below / level with themselves in the other run.
``fedapp-report --paired-against`` gives the round-10 differences and client counts too; the
rounds 8-10 means are this script's alone.
"""

from __future__ import annotations

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


def claim_rows(found: dict[str, dict[int, Rounds]]) -> list[str]:
    out = [
        "| claim | seeds | round 10, paired | rounds 8-10, paired | higher in "
        "| devices higher / lower / equal, round 10 |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in PAIRS:
        seeds = sorted(set(found[a]) & set(found[b]))
        if not seeds:
            continue
        at10 = [found[a][s][ROUNDS - 1]["acc_mean"] - found[b][s][ROUNDS - 1]["acc_mean"] for s in seeds]
        over3 = [last3(found[a][s]) - last3(found[b][s]) for s in seeds]
        clients = [
            found[a][s][ROUNDS - 1]["client_acc"][k] - found[b][s][ROUNDS - 1]["client_acc"][k]
            for s in seeds
            for k in found[a][s][ROUNDS - 1]["client_acc"]
        ]
        counts = (sum(d > 1e-9 for d in clients), sum(d < -1e-9 for d in clients), sum(abs(d) <= 1e-9 for d in clients))
        out.append(
            f"| {a} − {b} | {', '.join(map(str, seeds))} | {mean_std(at10, True)} | {mean_std(over3, True)} | "
            f"{sum(d > 0 for d in at10)}/{len(at10)} | {' / '.join(map(str, counts))} |"
        )
    return out


def main(argv: list[str]) -> int:
    records = Path(argv[0]) if argv else RECORDS
    for alpha, title in ((0.1, "α = 0.1"), (10.0, "α = 10")):
        found = {label: seed_records(records, setting[0], alpha, setting[1]) for label, setting in SETTINGS.items()}
        table = [*setting_rows(found), "", *claim_rows(found)]
        print(f"\n{title}, round {ROUNDS}:\n\n" + "\n".join(line.replace("-0.", "−0.") for line in table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
