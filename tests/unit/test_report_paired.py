"""fedapp-report --paired-against: every setting minus a reference setting, seed by seed, through the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedapp import report
from fedapp.errors import DataError
from fedapp.report import main, report_rows
from tests.unit.test_report import BASE_CONFIG, curve, write_run

# Last-round mean accuracy per (method, lr, seed); worst client is 0.2 below (see curve()).
FINAL = {
    ("fedavg", 0.05, 0): 0.70,
    ("fedavg", 0.05, 1): 0.80,
    ("fedavg", 0.05, 2): 0.75,
    ("fedprox", 0.05, 0): 0.72,
    ("fedprox", 0.05, 1): 0.79,
    ("fedprox", 0.05, 2): 0.80,
    ("fedavg", 0.1, 0): 0.60,  # another setting of the reference's method: the reference must be picked by lr
    ("fedavg", 0.1, 5): 0.90,  # a seed the reference did not run: paired with nothing
}


def write_grid(results: Path) -> Path:
    for (method, lr, seed), final in FINAL.items():
        # fedprox sends twice fedavg's bytes a round and spends 3x its FLOPs; both reach 0.6 in round 2
        nbytes, flops = (2000, 3e9) if method == "fedprox" else (1000, 1e9)
        write_run(
            results,
            f"{method}-lr{lr}-s{seed}",
            {**BASE_CONFIG, "method": method, "lr": lr, "seed": seed, "num-rounds": 3},
            curve([0.5, 0.6, final], [nbytes] * 3, [1.0] * 3, train_flops_cumulative=[flops, 2 * flops, 3 * flops]),
        )
    return results


def paired_rows(markdown: str) -> dict[str, dict[str, str]]:
    section = markdown.split("## Paired over seeds")[1].split("\n## ", maxsplit=1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| setting")]
    cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines]
    return {row[0]: dict(zip(report.PAIRED_HEADER, row, strict=True)) for row in cells}


def test_each_setting_minus_the_reference_seed_by_seed(tmp_path, capsys):
    results = write_grid(tmp_path / "runs")
    out = tmp_path / "report.md"
    code = main(
        [str(results), "--out", str(out), "--figure", "", "--target", "0.6", "--paired-against", "fedavg lr=0.05"]
    )
    assert code == 0
    capsys.readouterr()
    markdown = out.read_text()
    assert "## Paired over seeds, against fedavg, lr=0.05" in markdown
    rows = paired_rows(markdown)
    # The reference is not paired with itself; fedavg at 0.1 shares only seed 0 with it.
    assert set(rows) == {"fedprox, lr=0.05", "fedavg, lr=0.1"}
    prox = rows["fedprox, lr=0.05"]
    assert prox["seeds paired"] == "3 (0, 1, 2)"
    assert prox["mean acc − reference (per seed)"] == "+0.0200, -0.0100, +0.0500"
    # mean of (0.02, -0.01, 0.05) = 0.02, sample std = 0.03
    assert prox["mean ± std"] == "+0.0200 ± 0.0300"
    assert prox["higher in"] == "2 of 3"
    assert prox["worst client − reference"] == "+0.0200 ± 0.0300"
    # Both reach 0.6 in round 2 in every seed: 3x the FLOPs and 2x the MB, seed by seed.
    assert prox["train FLOPs to target ÷ reference"] == "3.00 ± 0.00× (3/3)"
    assert prox["MB to target ÷ reference"] == "2.00 ± 0.00× (3/3)"
    other = rows["fedavg, lr=0.1"]
    assert (other["seeds paired"], other["mean ± std"], other["higher in"]) == ("1 (0)", "-0.1000", "0 of 1")


def test_settings_on_other_data_are_not_paired_with_the_reference(tmp_path, capsys):
    """Seed 0 at alpha = 10 holds another partition than seed 0 at alpha = 0.1: such a difference says
    nothing of either method, so only the settings on the reference's data get a row (a sweep over two
    alphas, as Family C's, before paired every run with the reference's seed)."""
    results = tmp_path / "runs"
    for method, alpha, final in (
        ("fedavg", 0.1, 0.7),
        ("fedprox", 0.1, 0.75),
        ("fedavg", 10.0, 0.4),
        ("fedprox", 10.0, 0.5),
    ):
        config = {**BASE_CONFIG, "method": method, "alpha": alpha, "seed": 0, "num-rounds": 1}
        write_run(results, f"{method}-alpha{alpha}-s0", config, curve([final], [10], [1.0]))
    other_split = {
        **BASE_CONFIG,
        "method": "fedprox",
        "alpha": 0.1,
        "seed": 0,
        "num-rounds": 1,
        "class-assignment": "random",
    }
    write_run(results, "fedprox-random-s0", other_split, curve([0.9], [10], [1.0]))
    out = tmp_path / "report.md"
    assert main([str(results), "--out", str(out), "--figure", "", "--paired-against", "fedavg alpha=0.1"]) == 0
    capsys.readouterr()
    rows = paired_rows(out.read_text())
    assert list(rows) == ["fedprox, alpha=0.1, class-assignment=first-deterministic"]
    assert rows["fedprox, alpha=0.1, class-assignment=first-deterministic"]["mean ± std"] == "+0.0500"


def test_each_client_is_compared_with_itself_in_the_reference_run(tmp_path, capsys):
    """A mean above the reference's can come from a few clients: the row counts, over the paired seeds,
    the clients above, below and level with their own accuracy in the reference run (last round)."""
    results = tmp_path / "runs"
    last_round = {  # (method, seed) -> client_acc of the last round; round 1's must not count
        ("fedavg", 0): {"0": 0.50, "1": 0.60, "2": 0.70},
        ("fedavg", 1): {"0": 0.40, "1": 0.80, "2": 0.30},
        ("fedprox", 0): {"0": 0.90, "1": 0.60, "2": 0.65},  # one higher, one level, one lower
        ("fedprox", 1): {"0": 0.45, "1": 0.90, "2": 0.10, "3": 0.99},  # client 3 has no reference: left out
    }
    for (method, seed), clients in last_round.items():
        config = {**BASE_CONFIG, "method": method, "seed": seed, "num-rounds": 2}
        first = {name: 0.0 for name in clients}
        write_run(
            results, f"{method}-s{seed}", config, curve([0.5, 0.6], [10, 10], [1.0, 1.0], client_acc=[first, clients])
        )
    out = tmp_path / "report.md"
    assert main([str(results), "--out", str(out), "--figure", "", "--paired-against", "fedavg"]) == 0
    capsys.readouterr()
    assert paired_rows(out.read_text())["fedprox"]["clients higher / lower / equal"] == "3 / 2 / 1"


def test_runs_without_per_client_accuracy_have_no_client_counts(tmp_path, capsys):
    results = write_grid(tmp_path / "runs")
    out = tmp_path / "report.md"
    assert main([str(results), "--out", str(out), "--figure", "", "--paired-against", "fedavg lr=0.05"]) == 0
    capsys.readouterr()
    assert paired_rows(out.read_text())["fedprox, lr=0.05"]["clients higher / lower / equal"] == "—"


def test_a_setting_that_never_reaches_the_target_has_no_cost_ratio(tmp_path):
    results = write_grid(tmp_path / "runs")
    rows = report_rows(report.expand_run_dirs([results]), target=0.78)
    groups = report.group_by_seed(rows)
    table = report.render_paired_table(groups, report.select_reference(groups, "fedavg lr=0.05"))
    # At 0.78 the reference reaches it in seed 1 only, fedprox in seeds 1 and 2: one seed has both (round 3).
    prox = next(line for line in table.splitlines() if line.startswith("| fedprox"))
    assert prox.endswith("| — | 3.00× (1/3) | 2.00× (1/3) |")
    lone = next(line for line in table.splitlines() if line.startswith("| fedavg, lr=0.1"))
    assert lone.endswith("| — (0/1) | — (0/1) |")


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("fedavg", "names 2 settings: fedavg, lr=0.05; fedavg, lr=0.1; add key=value"),
        ("fedavg lr=0.2", "names none of the reported settings (methods: fedavg, fedprox)"),
        ("scaffold", "names none of the reported settings"),
        ("lr=0.05", "start with a method name"),
        ("fedavg lr", "'lr' is not key=value"),
    ],
)
def test_a_reference_naming_no_single_setting_fails_before_any_file_is_written(tmp_path, capsys, reference, message):
    results = write_grid(tmp_path / "runs")
    out, figure = tmp_path / "report.md", tmp_path / "report.png"
    code = main([str(results), "--out", str(out), "--figure", str(figure), "--paired-against", reference])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not out.exists() and not figure.exists()


def test_a_reference_value_matches_however_the_number_was_written(tmp_path):
    results = write_grid(tmp_path / "runs")
    groups = report.group_by_seed(report_rows(report.expand_run_dirs([results])))
    assert report.select_reference(groups, "fedprox, lr=5e-2").setting == "fedprox, lr=0.05"
    with pytest.raises(DataError, match="names none"):
        report.select_reference(groups, "fedprox lr=0.5")


def test_no_paired_table_unless_asked(tmp_path):
    results = write_grid(tmp_path / "runs")
    assert "Paired over seeds" not in report.render_markdown(report_rows(report.expand_run_dirs([results])))
