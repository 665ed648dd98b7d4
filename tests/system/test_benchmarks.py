"""The benchmark scripts run in their smoke mode (tiny sizes), so they cannot rot; no timing is asserted."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

from fedapp.models import seeded_model
from fedapp.params import get_arrays
from fedapp.report import MAIN_HEADER
from tests.paths import ROOT, load_script


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the first markdown table in ``text``."""
    lines = []
    for line in text.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_bytes_smoke_measures_every_method_and_the_wire_is_never_smaller(capsys):
    bytes_benchmark = load_script("bytes")
    rows = bytes_benchmark.main(["--smoke"])
    printed = table_rows(capsys.readouterr().out)

    methods = list(bytes_benchmark.SMOKE_METHODS)
    assert [r.method for r in rows] == methods
    assert [cells[0] for cells in printed] == methods
    for row, cells in zip(rows, printed, strict=True):
        for direction in (row.up, row.down):
            # Each layer wraps the one below: arrays, .npy tensors, Flower objects, protobuf RPCs, HTTP.
            traffic = direction.traffic
            assert traffic.http > traffic.protobuf >= direction.objects >= direction.counted >= direction.payload
            assert traffic.requests >= 3
        ratios = [part.strip() for part in cells[8].split("/")]
        for ratio, direction in zip(ratios, (row.up, row.down), strict=True):
            if direction.payload:
                assert float(ratio) >= 1.0
                assert direction.ratio >= 1.0
            else:
                assert ratio == "—"  # nothing to send
    by_method = {r.method: r for r in rows}
    assert by_method["standalone"].up.payload == by_method["standalone"].down.payload == 0
    fedavg = by_method["fedavg"]
    assert fedavg.up.params == fedavg.down.params > 0


def test_overhead_smoke_runs_both_ways_and_the_simulation_computes_what_the_plain_loop_does(capsys):
    overhead = load_script("overhead")
    rows = overhead.main(["--smoke"])
    printed = table_rows(capsys.readouterr().out)

    assert [(r.method, r.clients) for r in rows] == [(m, 4) for m in overhead.SMOKE_METHODS]
    assert [cells[0] for cells in printed] == list(overhead.SMOKE_METHODS)
    for row in rows:
        # The same clients, seeds and thread layout: Flower's run reproduces the process loop exactly.
        assert row.same_accuracy, (row.method, row.processes.acc_mean, [m["acc_mean"] for m in row.flower.metrics])
        assert len(row.threads.acc_mean) == len(row.processes.acc_mean) == 2
        assert all(m["clients_fit"] == 4 for m in row.flower.metrics)
        assert row.plain_wall > 0 and row.flower.wall_seconds > 0


def test_scale_smoke_measures_rounds_and_the_memory_of_every_process(capsys):
    """At the page's evaluation setting: about 5 images a client (issue 66: at 10,000 clients of
    CIFAR-10 no client had a test split, and the page's rows had no accuracy), every client tested
    on images of the shared test pool. pFedLoRA only, as the page's commands."""
    scale = load_script("scale")
    runs = scale.main(["--smoke", "--methods", "pfedlora"])
    printed = table_rows(capsys.readouterr().out)

    assert [r.method for r in runs] == ["pfedlora"]
    assert [cells[0] for cells in printed] == ["pfedlora"]
    for run, cells in zip(runs, printed, strict=True):
        assert run.setting == scale.Setting(300, 0.03)
        assert run.clients_fit == [9, 9] and run.clients_tested == [9, 9]  # 3% of 300 in each round
        assert run.test_images >= 1 and math.isfinite(run.final_accuracy)
        assert f"9/9 x {run.test_images:.1f}" in cells and f"{run.final_accuracy:.3f}" in cells
        assert len(run.round_seconds) == 2
        # The SuperLink, the simulation process and its Ray workers were found and measured.
        assert run.processes >= 4
        assert run.peak_pss > 100 * 2**20


def test_scale_settings_are_parsed_and_bad_ones_named():
    scale = load_script("scale")
    assert scale.parse_settings("1000:0.1,100:1") == [scale.Setting(1000, 0.1), scale.Setting(100, 1.0)]
    assert scale.Setting(1000, 0.1).sampled == 100
    for bad in ("1000:0", "1:0.5", "many:0.1", "100:1.5"):
        with pytest.raises(ValueError, match="setting"):
            scale.parse_settings(bad)


def test_protocols_benchmark_runs_leave_one_domain_out_and_reports_it(tmp_path):
    protocols = load_script("protocols")
    results = tmp_path / "protocols"
    markdown = protocols.main(
        [
            *("--methods", "fedavg,pfedlora", "--protocols", "lodo", "--rounds", "1"),
            *("--domains", "2", "--clients-per-domain", "2", "--shots", "4", "--results-dir", str(results)),
        ]
    )
    rows = table_rows(markdown)
    # Run folders are <method>-<setting>-<settings digest>: a rerun with other settings gets its own.
    names = [re.sub(r"-[0-9a-f]{6}$", "", cells[0]) for cells in rows]
    assert names == ["fedavg-lodo-D2x2-R1", "pfedlora-lodo-D2x2-R1"]
    # FedAvg's global model serves the left-out domain; pFedLoRA says why it cannot.
    held_out = MAIN_HEADER.index("held-out / novel")
    assert rows[0][held_out].startswith("held-out ")
    assert rows[1][held_out].startswith("n/a: pfedlora cannot serve a client that never trained")
    assert (results / "report.md").read_text() == markdown
    assert (results / "report.png").stat().st_size > 0


def test_poll_interval_smoke_measures_an_idle_federation(capsys):
    poll_interval = load_script("poll_interval")
    [row] = poll_interval.main(["--smoke"])
    printed = table_rows(capsys.readouterr().out)
    assert [cells[0] for cells in printed] == ["1"]
    assert row.interval == 1.0 and row.window == 5.0
    # The SuperLink, both SuperNodes and their SuperExecs were found and spent some CPU, far below a core.
    assert 0.0 < row.share_of_a_core < 1.0


def test_soak_smoke_accounts_for_every_round_through_faults_and_a_restart(capsys):
    """Four rounds over loopback; one node fails 70% of its messages, another restarts at round 2."""
    result = load_script("soak").main(["--smoke"])
    assert "| every round accounted for | yes |" in capsys.readouterr().out
    assert result.every_round_accounted and result.rounds_recorded == 4
    assert result.restarted_at_round >= 2 and result.clients_failed > 0
    assert result.peak_mb_first_half > 0 and result.peak_mb_second_half > 0


def test_edge_smoke_measures_a_cnn1_client_round_and_the_installed_footprint(capsys):
    """CNN-1 in a fresh process of this interpreter: start-up, one epoch, the traffic and the peak RSS."""
    edge = load_script("edge")
    report = edge.main(["--smoke"])
    out = capsys.readouterr().out
    printed = table_rows(out)

    assert [cells[:2] for cells in printed] == [["cnn-1", "fedavg"]]
    [row] = report.rows
    [cells] = printed
    assert float(cells[2]) == pytest.approx(row.startup_seconds, abs=0.01) and row.startup_seconds > 0
    assert float(cells[3].replace(",", "")) > 0 and row.train_images > 0 and row.fit_seconds > 0
    # FedAvg sends the whole model down and back up: the arrays plus one .npy header each way.
    arrays = get_arrays(seeded_model("cnn-1", 10, seed=0, image_size=32))
    nbytes = sum(a.nbytes for a in arrays)
    assert int(cells[4].replace(",", "")) == row.bytes_round
    assert 2 * nbytes <= row.bytes_round <= 2 * (nbytes + 128 * len(arrays))
    # The peak grows step by step from torch's import alone to the evaluated round.
    stages = list(row.rss_stages_mb.values())
    assert list(row.rss_stages_mb) == ["torch", "imports", "data and client", "fit", "evaluate"]
    assert 50 < stages[0] <= stages[1] <= stages[2] <= stages[3] <= stages[4] == row.round_rss_mb < 10_000
    assert float(cells[5]) == pytest.approx(row.round_rss_mb, abs=0.5)
    assert cells[6] == cells[7] == "—"  # no SuperNode in the smoke run
    assert row.clientapp_rss_mb is None and report.torch.rss_mb == stages[0]

    [install] = report.installs
    footprint = install.footprint
    assert "smoke: NOT a lean install" in install.label and f"| {install.label} | {footprint.packages} |" in out
    assert footprint.packages > footprint.other_packages > 0 and footprint.megabytes > footprint.torch_megabytes > 0
    assert "Lean / full: not measured" in out
    assert re.search(r"Goal a CNN-1 client round under 300 MB RSS: \d+ MB \(in-process.*: (met|NOT met)\.", out)


def test_edge_lean_env_counts_an_install_profile_inside_a_larger_venv():
    """The profiles come from pyproject.toml, and [all] is counted inside this [dev] venv."""
    lean_env = load_script("lean_env")
    base, full, dev = (lean_env.profile_requirements(ROOT, extra) for extra in ("", "all", "dev"))
    names = [{re.split(r"[\[<>=!~;, ]", text, maxsplit=1)[0].lower() for text in p} for p in (base, full, dev)]
    assert {"flwr", "torch", "safetensors", "pip"} <= names[0] < names[1] < names[2]
    assert {"open_clip_torch", "scikit-learn", "matplotlib"} <= names[1] - names[0]
    assert "fedapp" not in names[2] and {"mlflow", "pytest"} <= names[2] - names[1]

    python = Path(sys.executable)
    base_sizes, torch = lean_env.installed_sizes(python, base, ("fedapp",))
    full_sizes, _ = lean_env.installed_sizes(python, full, ("fedapp",))
    assert {"torch", "torchvision", "fedapp"} <= torch | {"fedapp"} <= set(base_sizes) < set(full_sizes)
    assert {"ray", "open-clip-torch", "scikit-learn"} <= set(full_sizes) - set(base_sizes)
    assert "mlflow" not in full_sizes and "pytest" not in full_sizes


def test_launch_phases_smoke_times_every_phase_of_a_real_launch(capsys):
    figures = load_script("launch_phases").main(["--smoke"])
    assert figures["returncode"] == 0 and figures["rounds"] == 2
    for phase in ("flower_start_s", "simulation_start_s", "workers_start_s", "round_1_s", "steady_round_s"):
        assert figures[phase] is not None and figures[phase] > 0, phase
    assert figures["backbone_loads"] >= 1 and figures["shutdown_s"] >= 0
    assert figures["fixed_cost_s"] == pytest.approx(
        figures["launch_s"] - figures["round_1_s"] - figures["steady_round_s"]
    )
    # No GPU here: nothing sampled, and the table says so instead of inventing figures.
    assert figures["gpu"] is None and "gpu_busy_share_after_round_1" not in figures
    assert "| flower_start_s |" in capsys.readouterr().out


def test_run_memory_smoke_samples_every_process_of_a_real_launch(capsys):
    result = load_script("run_memory").main(["--smoke"])
    names = [process["name"] for process in result["processes"]]
    assert {"fedapp.launch", "flwr-simulation", "ClientAppActor", "raylet"} <= set(names)
    assert result["peak_summed_pss_mb"] >= max(process["peak_pss_mb"] for process in result["processes"]) > 0
    assert "peak summed PSS:" in capsys.readouterr().out


def test_sweep_overhead_smoke_times_a_launch_and_a_sweep_of_the_same_runs(capsys):
    result = load_script("sweep_overhead").main(["--smoke"])
    assert result["runs"] == 2 and result["sweep_wall_s"] > result["sweep_rounds_s"] > 0
    budget = 2 * result["launch_rounds_s"] + result["launch_start_up_s"]
    assert result["budget_s"] == pytest.approx(budget, abs=0.11)
    assert "sweep / budget:" in capsys.readouterr().out
