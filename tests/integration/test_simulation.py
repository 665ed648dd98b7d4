"""End-to-end runs on digits (Ray simulations in this process; the baselines driven in process):
what each run records and sends.

A few images per class and client (``shots-per-class``): what is checked is what travels and
is recorded, not how well the models learn (``test_presets_learn.py``)."""

from __future__ import annotations

import json

import pytest

from fedapp.client_app import make_client_app
from fedapp.inprocess import run_in_process
from fedapp.metrics import read_metrics
from fedapp.server_app import make_server_app
from tests import simulation
from tests.integration.test_message_api_runs import COMPARED, HELD_OUT
from tests.simulation import BACKEND
from tests.unit.test_protocols import METHOD_SETTINGS

BRIEF = {"num-partitions": 4, "num-rounds": 2, "batch-size": 32, "shots-per-class": 5}


def simulate(tmp_path, **overrides):
    overrides = {"results-dir": str(tmp_path / "results"), "run-name": "run", **BRIEF, **overrides}
    simulation.simulate(
        make_server_app(overrides),
        make_client_app(overrides),
        num_supernodes=overrides["num-partitions"],
        backend_config=BACKEND,
    )
    return tmp_path / "results" / "run"


def test_fedavg_writes_metrics_summary_and_plots(tmp_path):
    run_dir = simulate(tmp_path, method="fedavg", model="cnn-5")
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["clients_fit"] == 4 and row["clients_evaluated"] == 4
        assert 0.0 <= row["acc_worst"] <= row["acc_mean"] <= 1.0
        assert row["global_acc"] is not None
        # Up and down carry the same full model in FedAvg.
        assert row["bytes_up_per_client"] == row["bytes_down_per_client"] > 0
        assert row["bytes_round_total"] == 4 * 2 * row["bytes_up_per_client"]
        # The evaluation instructions carry the global model to the 4 clients again, counted apart.
        assert row["bytes_eval_down_round"] == 4 * row["bytes_down_per_client"]
    assert rows[1]["mb_cumulative"] == pytest.approx(2 * rows[0]["mb_cumulative"])
    assert rows[1]["mb_eval_cumulative"] == pytest.approx(rows[1]["mb_cumulative"] / 2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 2
    assert summary["total_eval_mb"] == pytest.approx(rows[1]["mb_eval_cumulative"])
    assert (run_dir / "accuracy_vs_round.png").stat().st_size > 0
    assert (run_dir / "accuracy_vs_mb.png").stat().st_size > 0
    assert "method: fedavg" in (run_dir / "config.yaml").read_text()


def test_standalone_keeps_personal_models_on_disk_and_sends_nothing(tmp_path):
    state_dir = tmp_path / "state"
    run_dir = simulate(tmp_path, method="standalone", model="cnn-5", state="disk", **{"state-dir": str(state_dir)})
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all(r["global_acc"] is None for r in rows)
    assert rows[-1]["bytes_up_per_client"] < 200  # an empty parameter list, no model
    assert rows[-1]["bytes_eval_down_round"] == 0
    files = sorted(state_dir.glob("run/partition-*/model.safetensors"))
    assert len(files) == 4
    assert [r["fit_personal_rounds"] for r in rows] == [1.0, 2.0]


def test_standalone_state_persists_across_rounds_in_memory(tmp_path):
    # Flower keeps each node's Context.state across rounds; every client reports
    # how many rounds its stored model has been trained.
    run_dir = simulate(tmp_path, method="standalone", model="cnn-5", state="memory", **{"num-rounds": 3})
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["fit_personal_rounds"] for r in rows] == [1.0, 2.0, 3.0]


def test_pfedlora_heterogeneous_clients_exchange_only_the_adapter(tmp_path):
    run_dir = simulate(tmp_path, method="pfedlora", **{"client-models": "cnn-1,cnn-3,cnn-5,cnn-2"})
    rows = read_metrics(run_dir / "metrics.jsonl")
    adapter_params = 500 * 40 + 40 + 40 * 10 + 10
    for row in rows:
        assert row["clients_fit"] == 4 and row["clients_failed"] == 0
        assert row["params_round_total"] == 4 * 2 * adapter_params
        assert row["bytes_up_per_client"] < 4 * adapter_params + 1024  # float32 adapter plus .npy headers
        assert 0.0 <= row["eval_adapter_accuracy"] <= 1.0
        assert row["train_flops_round"] > 0
    assert rows[1]["train_flops_cumulative"] == rows[0]["train_flops_round"] + rows[1]["train_flops_round"]


def test_pfedlora_at_mu_zero_trains_every_local_model_exactly_as_standalone(tmp_path):
    """The mu = 0 ablation of CLAIMS: the adapter still trains and travels, but the local model's loss
    never sees it, so every client's head trains and scores as Standalone's model does, round by
    round (the training loss to the last digit); a mu > 0 does not (the adapter's loss reaches the
    local encoder)."""
    models = {"client-models": "cnn-1,cnn-3,cnn-5,cnn-2"}
    scores = {}
    for name, overrides in (
        ("standalone", {"method": "standalone"}),
        ("mu 0", {"method": "pfedlora", "mu": 0.0}),
        ("mu 0.5", {"method": "pfedlora", "mu": 0.5}),
    ):
        rows = read_metrics(simulate(tmp_path / name.replace(" ", ""), **models, **overrides) / "metrics.jsonl")
        scores[name] = [(row["client_acc"], row["train_loss"]) for row in rows]
    assert scores["mu 0"] == scores["standalone"]
    assert scores["mu 0.5"] != scores["standalone"]


def test_sdfed_runs_with_heterogeneous_local_prompt_lengths(tmp_path):
    run_dir = simulate(tmp_path, method="sdfed", **{"local-prompt-lengths": "4,8,16,12", "shots-per-class": 8})
    rows = read_metrics(run_dir / "metrics.jsonl")
    for row in rows:
        assert row["clients_fit"] == 4 and row["clients_failed"] == 0
        assert row["params_round_total"] == 4 * 2 * 8 * 64  # the global prompt, up and down
    assert rows[-1]["fit_local_prompt_length"] > 0


def test_pep_fedpt_with_held_out_clients_in_simulation(tmp_path):
    run_dir = simulate(
        tmp_path,
        method="pep-fedpt",
        **{"clip-model": "fedapp-tiny-vit", "held-out-fraction": 0.25, "min-clients": 2, "prompt-length": 2},
    )
    rows = read_metrics(run_dir / "metrics.jsonl")
    for row in rows:
        # Three clients train and are evaluated; the fourth is only evaluated, as held out.
        assert row["clients_fit"] == 3 and row["clients_failed"] == 0 and row["clients_evaluated"] == 3
        assert row["held_out_clients"] == 1 and 0.0 <= row["held_out_acc_mean"] <= 1.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_held_out_acc_mean"] == rows[-1]["held_out_acc_mean"]


def in_process(method: str, **overrides) -> list:
    """A baseline's rounds, driven in this process: what its clients exchange is the method's, not
    the engine's (every method also runs in Ray on the Message API: ``test_message_api_runs.py``)."""
    return run_in_process({"method": method, **BRIEF, **overrides}).history


@pytest.mark.parametrize("method", ["head-fedavg", "local-vpt", "fedvpt", "fedvpt-d"])
def test_visual_prompt_baselines_exchange_what_they_train(method):
    rows = in_process(method, **{"clip-model": "fedapp-tiny-vit", "prompt-length": 2})
    assert all(r.clients_fit == 4 and r.clients_failed == 0 for r in rows)
    assert all(0.0 <= r.acc_mean <= 1.0 for r in rows)
    if method == "local-vpt":
        assert rows[-1].params_round_total == 0
    else:
        assert rows[-1].params_round_total > 0


@pytest.mark.parametrize("method", ["fedd2p", "fedd2p-agg", "fedd2p-gt"])
def test_fedd2p_and_baselines_exchange_only_per_class_knowledge(method):
    rows = in_process(method, **{"client-models": "vgg-2,vgg-3,vgg-4", "d2p-steps": 5})
    per_class = 10 * 10 + 10  # knowledge (classes x classes) and a class mask or counts
    for row in rows:
        assert row.clients_fit == 4 and row.clients_failed == 0
        assert row.params_round_total == 4 * 2 * per_class
        assert row.bytes_down_per_client < 4 * per_class + 300  # float32 arrays plus .npy headers
        assert (row.extra.get("generator_loss") is None) == (method == "fedd2p-agg")


@pytest.mark.parametrize("method", ["pfedlora", "sdfed"])
def test_personal_state_on_disk_computes_what_it_computes_in_memory(method, tmp_path):
    """``state`` says where a client's own model (pFedLoRA) or prompt (SDFed) lives between rounds,
    not what a run computes: on disk it round-trips exactly, every figure of every round the same
    (so a run can be made resumable with ``state="disk"`` without changing its results)."""
    overrides = {"method": method, **HELD_OUT, **METHOD_SETTINGS[method], "num-rounds": 3}
    runs = [
        simulate(tmp_path / "memory", **overrides, state="memory"),
        simulate(tmp_path / "disk", **overrides, state="disk", **{"state-dir": str(tmp_path / "state")}),
    ]
    assert list((tmp_path / "state").rglob("*.safetensors")), "the disk run kept no state on disk"
    memory, disk = ([{k: row[k] for k in COMPARED} for row in read_metrics(run / "metrics.jsonl")] for run in runs)
    assert disk == memory
