"""Choosing a grid's point on validation data: the clients' accuracy on the share of their own
data they hold back from training (``val_acc_mean`` in metrics.jsonl), never on the test data.

A point's score is its runs' validation accuracy averaged over the last ``last_rounds`` rounds
of each run, then over its seeds; each method's chosen point is the one with the highest score
(the first in grid order on a tie). The record of a choice (:meth:`Selection.as_dict`) holds
every point's validation figures and the test accuracy of the chosen point only: a choice never
reads another point's test figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedapp.errors import DataError
from fedapp.metrics import read_metrics
from fedapp.report.tables import fmt_acc, markdown_table, table_cell


@dataclass(frozen=True)
class Candidate:
    """One grid point of one method and the run folders of its seeds."""

    method: str
    point: Mapping[str, Any]
    run_dirs: tuple[Path, ...]

    @property
    def label(self) -> str:
        """``"sdfed lr=0.01"``: the method and the point's grid values."""
        return " ".join([self.method, *(f"{key}={value}" for key, value in self.point.items())])


@dataclass(frozen=True)
class ScoredCandidate:
    """A candidate's validation score: the mean over its seeds of each run's score."""

    candidate: Candidate
    per_run: tuple[float, ...]

    @property
    def score(self) -> float:
        return sum(self.per_run) / len(self.per_run)


@dataclass(frozen=True)
class Selection:
    """One method's choice: every point scored, and the one chosen."""

    method: str
    last_rounds: int
    scored: tuple[ScoredCandidate, ...]

    @property
    def chosen(self) -> ScoredCandidate:
        best = max(scored.score for scored in self.scored)
        return next(scored for scored in self.scored if scored.score == best)

    def as_dict(self) -> dict[str, Any]:
        """The record of the choice: the rule, every point's validation figures, and the chosen
        point's test accuracy (the last round's ``acc_mean`` of each of its runs)."""
        chosen = self.chosen
        return {
            "method": self.method,
            "rule": f"highest mean over seeds of val_acc_mean averaged over each run's last {self.last_rounds} rounds",
            "points": [
                {
                    "point": dict(scored.candidate.point),
                    "runs": [path.name for path in scored.candidate.run_dirs],
                    "val_per_run": list(scored.per_run),
                    "val_score": scored.score,
                }
                for scored in self.scored
            ],
            "chosen": dict(chosen.candidate.point),
            "chosen_test_acc_per_run": [_last_test_accuracy(path) for path in chosen.candidate.run_dirs],
        }


def validation_score(run_dir: Path, last_rounds: int = 1) -> float:
    """The mean of ``val_acc_mean`` over the run's last ``last_rounds`` rounds.

    Raises
    ------
    DataError
        The run recorded no validation accuracy in those rounds (a run without a validation
        share, ``local-split`` ``x,0,y``, or one made before clients scored it), or fewer rounds.
    """
    if last_rounds < 1:
        raise DataError(f"a validation score needs at least one round, got last_rounds={last_rounds}")
    lines = _metrics(run_dir)
    if len(lines) < last_rounds:
        raise DataError(
            f"run folder {run_dir}: {len(lines)} rounds recorded, the score averages the last {last_rounds}"
        )
    values = [line.get("val_acc_mean") for line in lines[-last_rounds:]]
    if any(not isinstance(value, int | float) or not math.isfinite(value) for value in values):
        raise DataError(
            f"run folder {run_dir}: no validation accuracy (val_acc_mean) in its last {last_rounds} rounds, so no "
            "choice can rest on it; give the clients a validation share (local-split, e.g. 0.8,0.1,0.1) and run again"
        )
    return float(sum(values) / len(values))


def select(candidates: Sequence[Candidate], last_rounds: int = 1) -> list[Selection]:
    """Each method's candidates scored on validation, in the order the methods first appear."""
    by_method: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        if not candidate.run_dirs:
            raise DataError(f"{candidate.label}: no finished run to score")
        by_method.setdefault(candidate.method, []).append(candidate)
    return [
        Selection(
            method=method,
            last_rounds=last_rounds,
            scored=tuple(
                ScoredCandidate(member, tuple(validation_score(path, last_rounds) for path in member.run_dirs))
                for member in members
            ),
        )
        for method, members in by_method.items()
    ]


def render_selection(selections: Sequence[Selection]) -> str:
    """Markdown: each point's validation score and seeds, the chosen one marked, and the chosen
    point's test accuracy (no other point's test figure is shown)."""
    body = []
    for selection in selections:
        chosen = selection.chosen
        for scored in selection.scored:
            is_chosen = scored is chosen
            test = [_last_test_accuracy(path) for path in scored.candidate.run_dirs] if is_chosen else []
            body.append(
                [
                    table_cell(scored.candidate.label),
                    str(len(scored.per_run)),
                    fmt_acc(scored.score),
                    "**chosen**" if is_chosen else "",
                    fmt_acc(sum(test) / len(test)) if test else "not read",
                ]
            )
    rounds = sorted({selection.last_rounds for selection in selections})
    rule = (
        "Chosen per method: the highest validation accuracy (the clients' own held-back data), averaged over "
        f"each run's last {', '.join(map(str, rounds))} round(s) and over seeds. Test accuracy is read for the "
        "chosen point only."
    )
    header = ["method and point", "runs", "val acc", "choice", "test acc"]
    return f"{rule}\n\n{markdown_table(header, body)}"


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    try:
        lines = read_metrics(Path(run_dir) / "metrics.jsonl")
    except (OSError, ValueError) as error:
        raise DataError(f"run folder {run_dir}: cannot read metrics.jsonl ({error})") from error
    if not lines:
        raise DataError(f"run folder {run_dir}: metrics.jsonl is empty (the run recorded no round)")
    return lines


def _last_test_accuracy(run_dir: Path) -> float:
    return float(_metrics(run_dir)[-1]["acc_mean"])
