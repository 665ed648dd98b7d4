"""The claims as data: a family's spec (``claims/family-<x>.yaml``), its run records, and each claim
paired over seeds by the rule of :mod:`fedapp.report.verdict` (``python benchmarks/claims.py``)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedapp.config import with_defaults
from fedapp.report.verdict import PairedVerdict, cost_verdict, paired_verdict

ROOT = Path(__file__).resolve().parent.parent
CLAIMS_DIR = ROOT / "claims"
PAGES = {"claims": ROOT / "benchmarks" / "CLAIMS.md", "readme": ROOT / "README.md"}
HEADLINE_SEEDS, OTHER_SEEDS = 5, 3
#: A setting's value taken from the family's selection record (the point chosen on validation).
CHOSEN = "chosen"
RECORD_FILES = ("config.yaml", "metrics.jsonl", "summary.json")
COST_FIGURES = {
    "rounds": "round",
    "MB": "mb_cumulative",
    "training FLOPs": "train_flops_cumulative",
    "parameters": "params_cumulative",
}


def read_selections(path: Path) -> list[dict[str, Any]]:
    """The per-method choices of a ``selection.json`` (``python -m fedapp.sweep --select`` writes it)."""
    try:
        return list(json.loads(path.read_text())["selections"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ClaimsError(f"{path}: not a selection record ({type(err).__name__}: {err})") from err


class ClaimsError(Exception):
    """A spec or record that cannot give a table; the message names the file."""


@dataclass(frozen=True)
class Claim:
    """One claim "a beats b" of a paper (for a cost: "a costs less than b to the target")."""

    text: str
    a: str
    b: str
    paper: str | Mapping[str, str] = ""
    headline: bool = False
    ablation: bool = False
    figure: str = "acc_mean"
    figure_b: str = ""
    lower_is_better: bool = False
    cost: str = ""
    target: float | None = None
    groups: tuple[str, ...] = ()

    def paper_figure(self, group: str) -> str:
        return self.paper.get(group, "") if isinstance(self.paper, Mapping) else self.paper


@dataclass(frozen=True)
class Family:
    """A family's spec (``claims/family-<x>.yaml``)."""

    name: str
    title: str
    paper: str
    records: Path
    last_rounds: int
    selection: str
    groups: Mapping[str, Mapping[str, Any]]
    settings: Mapping[str, Mapping[str, Any]]
    claims: tuple[Claim, ...]
    source: Path = field(default=Path())
    preset: str = ""
    select_seed: int | None = None
    select_group: str = ""
    select_grids: Mapping[str, Mapping[str, list[Any]]] = field(default_factory=dict)

    @property
    def selection_dir(self) -> Path:
        """Where the selection runs' records and ``selection.json`` live."""
        return self.records / "selection"

    def chosen(self) -> dict[str, dict[str, Any]]:
        """Method -> its chosen grid point, from the selection record (empty before it ran)."""
        path = self.selection_dir / "selection.json"
        if not path.is_file():
            return {}
        return {entry["method"]: entry["chosen"] for entry in read_selections(path)}

    def resolved(self, setting: str) -> dict[str, Any] | None:
        """The setting's keys with every ``chosen`` value filled from the selection record (None
        while the selection has not run)."""
        keys = dict(self.settings[setting])
        wanted = [key for key, value in keys.items() if value == CHOSEN]
        if not wanted:
            return keys
        point = self.chosen().get(str(keys["method"]))
        if point is None:
            return None
        missing = [key for key in wanted if key not in point]
        if missing:
            raise ClaimsError(f"{self.source}: {setting!r} takes {missing} from a selection that did not choose them")
        return {**keys, **{key: point[key] for key in wanted}}


def load_family(path: Path) -> Family:
    """Read and check a family's spec: every claim names settings the spec defines."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ClaimsError(f"{path}: cannot read the family's spec ({err})") from err
    try:
        claims = tuple(_claim(item) for item in raw["claims"])
        family = Family(
            name=str(raw["family"]),
            title=str(raw["title"]),
            paper=str(raw["paper"]),
            records=(path.parent / raw["records"]).resolve(),
            last_rounds=int(raw.get("score", {}).get("last-rounds", 1)),
            selection=str(raw["selection"]),
            groups=raw.get("groups") or {"": {}},
            settings=raw["settings"],
            claims=claims,
            source=path,
            preset=str(raw.get("preset", "")),
            select_seed=None if "select" not in raw else int(raw["select"]["seed"]),
            select_group=str(raw.get("select", {}).get("group", "")),
            select_grids=raw.get("select", {}).get("grids", {}),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ClaimsError(f"{path}: not a family spec ({type(err).__name__}: {err})") from err
    for claim in family.claims:
        for side in (claim.a, claim.b):
            if side not in family.settings:
                raise ClaimsError(f"{path}: claim {claim.text!r} names {side!r}, which is not one of its settings")
        if unknown := sorted(set(claim.groups) - set(family.groups)):
            raise ClaimsError(f"{path}: claim {claim.text!r} names group(s) {unknown}, not among {list(family.groups)}")
    return family


def _claim(item: Mapping[str, Any]) -> Claim:
    cost = item.get("cost", {})
    return Claim(
        text=str(item["claim"]),
        a=str(item["a"]),
        b=str(item["b"]),
        paper=item.get("paper", ""),
        headline=bool(item.get("headline", False)),
        ablation=bool(item.get("ablation", False)),
        figure=str(item.get("figure", "acc_mean")),
        figure_b=str(item.get("figure-b", "")),
        lower_is_better=bool(item.get("lower-is-better", False)),
        cost=str(cost.get("figure", "")),
        target=None if not cost else float(cost["target"]),
        groups=tuple(item.get("groups", ())),
    )


def _same(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, bool) or isinstance(value, bool):
        return value == wanted
    if isinstance(wanted, int | float) and isinstance(value, int | float):
        return math.isclose(float(value), float(wanted))
    return str(value) == str(wanted)


@dataclass(frozen=True)
class Record:
    path: Path
    config: Mapping[str, Any]
    rounds: tuple[Mapping[str, Any], ...]


def load_records(folder: Path) -> list[Record]:
    """Every finished run folder in ``folder`` (its metrics hold every configured round).

    A family none of whose runs has landed has no folder yet (git keeps no empty folders): no records.
    """
    if not folder.exists():
        return []
    if not folder.is_dir():
        raise ClaimsError(f"{folder} is not a folder of run records")
    records = []
    for config_path in sorted(folder.glob("*/config.yaml")):
        run = config_path.parent
        config = with_defaults(yaml.safe_load(config_path.read_text()))
        rounds = tuple(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip())
        if len(rounds) != int(config["num-rounds"]):
            raise ClaimsError(f"{run}: {len(rounds)} rounds recorded of its {config['num-rounds']}: not a finished run")
        records.append(Record(run, config, rounds))
    return records


def runs_by_seed(records: Sequence[Record], keys: Mapping[str, Any], label: str) -> dict[int, Record]:
    """Seed -> the one record whose config has every key of ``keys``."""
    found: dict[int, Record] = {}
    for record in records:
        if all(_same(record.config.get(key), value) for key, value in keys.items()):
            seed = int(record.config["seed"])
            if seed in found:
                raise ClaimsError(f"{label}: {found[seed].path.name} and {record.path.name} both match seed {seed}")
            found[seed] = record
    return found


def score(record: Record, figure: str, last_rounds: int) -> float:
    """The mean of ``figure`` over the record's last ``last_rounds`` rounds."""
    values = [line.get(figure) for line in record.rounds[-last_rounds:]]
    if any(not isinstance(value, int | float) for value in values):
        raise ClaimsError(f"{record.path}: no {figure} in its last {last_rounds} rounds")
    return float(statistics.fmean(values))


def cost_to_target(record: Record, cost: str, target: float) -> float | None:
    """``cost``'s figure at the first round whose mean accuracy reaches ``target`` (None: never)."""
    for line in record.rounds:
        if line["acc_mean"] >= target:
            return float(line[COST_FIGURES[cost]])
    return None


@dataclass(frozen=True)
class ClaimRow:
    claim: Claim
    group: str
    result: PairedVerdict
    a_mean: float
    b_mean: float

    @property
    def needed_seeds(self) -> int:
        return HEADLINE_SEEDS if self.claim.headline else OTHER_SEEDS


def evaluate_claims(family: Family, records: Sequence[Record]) -> list[ClaimRow]:
    """Each claim in each group where both settings have records, by the rule."""
    rows = []
    for claim, group in claim_groups(family):
        keys = [family.resolved(side) for side in (claim.a, claim.b)]
        if keys[0] is None or keys[1] is None:
            continue
        labels = (claim.a, claim.b)
        extra = family.groups[group]
        sides = [runs_by_seed(records, {**k, **extra}, f"{s} {group}") for k, s in zip(keys, labels, strict=True)]
        if not sides[0] or not sides[1]:
            continue
        values = claim_values(claim, sides, family.last_rounds)
        if claim.cost:
            result = cost_verdict(*values)
        else:
            result = paired_verdict(*(values if not claim.lower_is_better else values[::-1]))
        means = [_mean([v for s, v in side.items() if s in result.seeds]) for side in values]
        rows.append(ClaimRow(claim, group, result, *means))
    return rows


def claim_values(claim: Claim, sides: Sequence[Mapping[int, Record]], last_rounds: int) -> list[dict[int, Any]]:
    """Each side's figure by seed: its cost to the target, or its score (``figure`` for a,
    ``figure-b`` for b where the claim reads b otherwise)."""
    if claim.cost:
        return [{seed: cost_to_target(r, claim.cost, claim.target) for seed, r in side.items()} for side in sides]
    figures = (claim.figure, claim.figure_b or claim.figure)
    return [
        {seed: score(r, figure, last_rounds) for seed, r in side.items()}
        for side, figure in zip(sides, figures, strict=True)
    ]


def _mean(values: Sequence[float | None]) -> float:
    finite = [v for v in values if v is not None]
    return statistics.fmean(finite) if finite else math.nan


def claim_groups(family: Family) -> list[tuple[Claim, str]]:
    """Every (claim, group) the family's tables owe a row."""
    return [(claim, group) for claim in family.claims for group in claim.groups or tuple(family.groups)]


def families(names: Sequence[str] = ()) -> list[Family]:
    paths = sorted(CLAIMS_DIR.glob("family-*.yaml"))
    loaded = [load_family(path) for path in paths]
    if names:
        unknown = sorted(set(names) - {f.name for f in loaded})
        if unknown:
            raise ClaimsError(
                f"no family {', '.join(unknown)} in {CLAIMS_DIR} (have {', '.join(f.name for f in loaded)})"
            )
        loaded = [f for f in loaded if f.name in names]
    return loaded
