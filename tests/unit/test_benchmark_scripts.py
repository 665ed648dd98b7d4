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
