"""The pretraining, zero-shot, personal-state and simulation-poll scripts through their command lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.paths import load_script


def _colour_folder(root: Path, per_class: int = 20) -> Path:
    rng = np.random.default_rng(0)
    for cls, name in enumerate(("red thing", "green thing", "blue thing")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 80, (32, 32, 3), dtype=np.uint8)
            pixels[..., cls] += 150
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_pretrain_clip_cli_writes_checkpoint_curve_and_plot_then_reuses_them(tmp_path: Path, capsys) -> None:
    script = load_script("pretrain_clip")
    data, out = _colour_folder(tmp_path / "data"), tmp_path / "out" / "clip.pt"
    argv = ["--data", str(data), "--out", str(out), "--model", "fedapp-tiny-clip", "--epochs", "1"]
    argv += ["--batch-size", "8", "--cache-dir", str(tmp_path / "cache")]
    assert script.main(argv) == 0
    printed = capsys.readouterr().out
    assert "pretraining fedapp-tiny-clip on cpu in fp32" in printed  # --device auto, no GPU here
    assert "epoch   1/1" in printed and "checkpoint written" in printed
    for suffix in ("", ".json", ".png"):
        assert Path(f"{out}{suffix}").is_file()
    assert json.loads(printed.splitlines()[-1])["checkpoint"] == str(out)
    assert script.main(argv) == 0 and "reused" in capsys.readouterr().out
    assert script.main([*argv[:-4], "--epochs", "2", *argv[-4:]]) == 1
    assert "not made from these settings" in capsys.readouterr().err


def test_zero_shot_cli_scores_every_client_per_seed(capsys) -> None:
    script = load_script("zero_shot")
    config = 'method="coop-local" clip-model="fedapp-tiny-clip" num-partitions=3 partition="iid"'
    assert script.main(["--run-config", config, "--seeds", "0,1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert [row["seed"] for row in rows] == [0, 1] and all(0.0 <= row["acc_mean"] <= 1.0 for row in rows)
    assert lines[-2].startswith("acc_mean: ") and lines[-2].endswith("over 2 seeds")


def test_personal_state_benchmark_times_both_ways_for_each_model(capsys) -> None:
    script = load_script("personal_state")
    rows = script.main(["--clients", "3", "--models", "cnn-5", "vgg-2"])
    assert [(row.model, row.way) for row in rows] == [
        (model, way) for model in ("cnn-5", "vgg-2") for way in ("npz + build", "safetensors + assign")
    ]
    assert all(row.save_ms > 0 and row.load_ms > 0 and row.megabytes > 0.1 for row in rows)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| cnn-5")]
    assert len(printed) == 2


@pytest.mark.usefixtures("task_identity")  # restored after the script sets its own
def test_simulation_poll_benchmark_times_a_pass_for_each_node_count(capsys) -> None:
    seconds = load_script("simulation_poll").main(["--nodes", "20", "60", "--messages", "10"])
    assert list(seconds) == [20, 60] and all(s > 0 for pair in seconds.values() for s in pair)
    assert [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines()[2:]] == ["20", "60"]


def test_launch_phases_reads_the_phases_off_a_launchs_lines():
    script = load_script("launch_phases")
    phases = script.Phases()
    lines = [
        (1.0, "Starting local SuperLink on 127.0.0.1:1..."),
        (2.0, "Using SuperLink: local (127.0.0.1:1)"),
        (3.0, "Successfully started run 42"),
        (4.0, "INFO :      Starting Flower Simulation"),
        (6.0, "INFO :      results go to /r/run"),
        (9.0, "(ClientAppActor pid=7) INFO :      backbone ViT-B-16 (fp16) loaded on cuda in 4.5 s"),
        (9.5, "(ClientAppActor pid=8) INFO :      backbone ViT-B-16 (fp16) loaded on cuda in 6.0 s"),
        (
            20.0,
            "INFO :      round 1/3 | acc mean 0.1 | loss 2.3 | fit 4 | 1.00 MB | 14.0s | elapsed 14s | ETA 4s",
        ),
        (
            22.0,
            "INFO :      round 2/3 | acc mean 0.2 | loss 2.2 | fit 4 | 2.00 MB | 2.0s | elapsed 16s | ETA 2s",
        ),
        (
            24.0,
            "INFO :      round 3/3 | acc mean 0.3 | loss 2.1 | fit 4 | 3.00 MB | 2.0s | elapsed 18s | ETA 0s",
        ),
        (24.0, "INFO :      done: round 3/3 | final acc mean 0.3 | 3.00 MB | 18s | results in /r/run"),
    ]
    for at, line in lines:
        phases.read(at, line)
    phases.exit_at = 27.0
    samples = script.GpuSamples(
        utilisation=[(t, busy) for t, busy in [(10, 0), (19, 90), (21, 80), (22, 0), (23, 50), (25, 0)]],
        peak_mib_by_pid={7: 5000.0, 8: 5200.0, 3: 900.0},
        total_mib=143000.0,
        name="NVIDIA H200",
    )
    figures = script.summarise(phases, samples)
    assert (
        figures["flower_start_s"] == 3.0 and figures["simulation_start_s"] == 3.0 and figures["workers_start_s"] == 3.0
    )
    assert figures["backbone_load_s"] == 6.0 and figures["backbone_loads"] == 2
    assert figures["round_1_s"] == 14.0 and figures["steady_round_s"] == 2.0 and figures["round_1_extra_s"] == 12.0
    assert figures["shutdown_s"] == 3.0 and figures["fixed_cost_s"] == 27.0 - 18.0
    # Past round 1 (20 s) until done (24 s): samples at 21, 22, 23; two of three busy.
    assert figures["gpu_busy_share_after_round_1"] == pytest.approx(2 / 3)
    assert figures["gpu_peak_mib_per_process_max"] == 5200.0 and figures["clients_per_gpu_by_memory"] == 24
