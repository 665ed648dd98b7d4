"""fedapp.sweep's plan: grid parsing, one validated folder per run, names that never collide."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml

from fedapp import sweep
from fedapp.errors import ConfigError
from fedapp.sweep import main, parse_grid, plan_sweep, run_sweep


def test_grid_items_are_toml_values_or_arrays() -> None:
    assert parse_grid(["lr=[0.01, 0.03]", 'partition="iid"']) == {"lr": [0.01, 0.03], "partition": ["iid"]}
    for bad, message in (("lr", "not key=value"), ("lr=[", "not a TOML value"), ("lr=[]", "no values")):
        with pytest.raises(ConfigError, match=message):
            parse_grid([bad])
    with pytest.raises(ConfigError, match="twice"):
        parse_grid(["lr=0.1", "lr=0.2"])


def test_plan_gives_every_run_its_own_folder_and_seeds_share_a_digest(tmp_path: Path) -> None:
    runs = plan_sweep(
        {"num-rounds": 2},
        methods=["fedavg", "standalone"],
        seeds=[0, 1],
        grid={"lr": [0.01, 0.03]},
        results_dir=tmp_path,
    )
    assert len(runs) == 8 and len({run.name for run in runs}) == 8
    assert runs[0].name.startswith("fedavg-lr0.01-") and runs[0].name.endswith("-s0")
    assert runs[0].name[:-3] == runs[1].name[:-3]  # same setting, other seed
    assert all(run.prepared.run_dir == tmp_path.resolve() / run.name for run in runs)
    assert [run.prepared.config["seed"] for run in runs[:2]] == [0, 1]
    # A setting outside the grid (here num-rounds) is in the digest: another sweep cannot reuse the folder.
    other = plan_sweep({"num-rounds": 3}, methods=["fedavg"], seeds=[0], grid={"lr": [0.01]}, results_dir=tmp_path)
    assert other[0].name != runs[0].name


def test_a_run_made_by_an_earlier_version_is_found_by_its_settings(tmp_path: Path) -> None:
    """A folder whose config lacks keys added since (at their defaults) and whose name has an older
    digest is the same run: the plan uses its folder, so a sweep skips or resumes it."""
    (planned,) = plan_sweep({"num-rounds": 2}, methods=["fedavg"], seeds=[1], results_dir=tmp_path)
    config = planned.prepared.config.as_dict()
    old = {key: value for key, value in config.items() if key not in ("aggregation", "update-norm-bound")}
    (tmp_path / "fedavg-0ld000-s1").mkdir()
    (tmp_path / "fedavg-0ld000-s1" / "config.yaml").write_text(yaml.safe_dump(old))
    (again,) = plan_sweep({"num-rounds": 2}, methods=["fedavg"], seeds=[1], results_dir=tmp_path)
    assert again.name == "fedavg-0ld000-s1" and again.prepared.run_dir == tmp_path.resolve() / again.name
    # Another seed or setting is another run.
    (seed0,) = plan_sweep({"num-rounds": 2}, methods=["fedavg"], seeds=[0], results_dir=tmp_path)
    (other,) = plan_sweep({"num-rounds": 3}, methods=["fedavg"], seeds=[1], results_dir=tmp_path)
    assert seed0.name == planned.name.replace("-s1", "-s0") and other.name not in (planned.name, again.name)


def test_every_run_is_validated_before_any_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sweep run \(method=fedavg, alpha=-1.0, seed=0\).*'alpha'"):
        plan_sweep({}, methods=["fedavg"], seeds=[0], grid={"alpha": [0.5, -1.0]}, results_dir=tmp_path)
    with pytest.raises(ConfigError, match="own flag"):
        plan_sweep({}, seeds=[0], grid={"seed": [1, 2]}, results_dir=tmp_path)


def test_cli_refuses_bad_input_in_one_line_and_dry_run_lists_the_plan(tmp_path: Path, capsys) -> None:
    assert main(["--results-dir", str(tmp_path), "--grid", "lr=["]) == 2
    assert "not a TOML value" in capsys.readouterr().err
    assert main(["--results-dir", str(tmp_path), "--run-config", "seed=3", "--seeds", "0,1"]) == 2
    assert "sets 'seed'" in capsys.readouterr().err
    assert main(["--results-dir", str(tmp_path), "--methods", "fedavg", "--seeds", "0,1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 runs" in out and out.count("fedavg-") == 2
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    # Every run's CLIP checkpoint is looked for before the first run starts, not by each run's ServerApp.
    missing = tmp_path / "small-clip.pt"
    argv = ["--results-dir", str(tmp_path), "--methods", "fedavg,sdfed", "--run-config", f'pretrained="{missing}"']
    argv.append("--dry-run")  # the plan is refused too (and a regression starts nothing)
    assert main(argv) == 2
    assert f"'pretrained' = '{missing}': checkpoint not found" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_checkpointed_run_resumes_unless_its_clients_kept_their_state_in_memory(tmp_path, monkeypatch, capsys):
    """A standalone run whose clients' models were in memory starts again, its earlier attempt set
    aside; before, the sweep resumed it and its clients trained from scratch under a later round."""
    brief = {"num-rounds": 2, "num-partitions": 2}
    runs = [
        *plan_sweep(brief, methods=["fedavg", "standalone"], seeds=[0], results_dir=tmp_path),
        *plan_sweep(
            {**brief, "state": "disk", "state-dir": str(tmp_path / "state")},
            methods=["standalone"],
            seeds=[0],
            results_dir=tmp_path,
        ),
    ]
    for run in runs:
        run.prepared.run_dir.mkdir()
        (run.prepared.run_dir / "checkpoint.npz").write_bytes(b"round 1")
    submitted = []
    monkeypatch.setattr(sweep, "local_federation", contextlib.nullcontext)
    monkeypatch.setattr(sweep, "shared_ray", lambda env: contextlib.nullcontext({"RAY_ADDRESS": "10.0.0.1:6379"}))
    monkeypatch.setattr(sweep, "check_runs_data", lambda overrides, labels: None)  # a child process: integration's
    monkeypatch.setattr(sweep, "submit", lambda prepared, env, **_: submitted.append(prepared) or prepared.run_dir)
    finished, failed = run_sweep(runs)
    assert failed == [] and len(finished) == 3
    assert [(p.config.method, p.config.state, p.config.resume) for p in submitted] == [
        ("fedavg", "memory", True),
        ("standalone", "memory", False),
        ("standalone", "disk", True),
    ]
    in_memory = runs[1].prepared.run_dir
    assert (in_memory.with_name(f"{in_memory.name}.incomplete-1") / "checkpoint.npz").read_bytes() == b"round 1"
    assert not in_memory.exists()  # the new attempt starts in an empty place (submit was stubbed)
    out = capsys.readouterr().out
    assert (
        f"{in_memory.name}: starting again (the earlier attempt moved to {in_memory.name}.incomplete-1; its "
        "clients' personal state was in memory, which a resume cannot bring back)" in out
    )
    assert out.count("resuming from its checkpoint") == 2
    assert "3 runs share one Ray (RAY_ADDRESS=10.0.0.1:6379)" in out
