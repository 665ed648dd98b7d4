"""SecAgg+ end to end: Ray simulations whose secure aggregate is checked against the plain
example-weighted average of the clients' (captured, unmasked) uploads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.client import ClientApp
from flwr.common import FitIns, FitRes, parameters_to_ndarrays

from fedapp.checkpoint import FILENAME as CHECKPOINT_FILE
from fedapp.checkpoint import load_checkpoint
from fedapp.client_app import make_client_fn
from fedapp.flower.client_mods import secagg_client_mod
from fedapp.metrics import read_metrics
from fedapp.secagg import error_bound
from fedapp.server_app import make_server_app
from tests.simulation import BACKEND, simulate
from tests.unit.test_secagg import CLIENTS


def capturing_client_app(overrides: dict, out_dir: Path) -> ClientApp:
    """Our ClientApp (client_fn and SecAgg+ mod), with every client's unmasked
    upload saved before the mod masks it."""
    inner = make_client_fn(overrides)

    def client_fn(context):
        client = inner(context)
        fit = client.fit

        def capturing_fit(ins: FitIns) -> FitRes:
            res = fit(ins)
            name = f"round{ins.config['server-round']}-partition{res.metrics['partition_id']}.npz"
            np.savez(out_dir / name, *parameters_to_ndarrays(res.parameters), num_examples=res.num_examples)
            return res

        client.fit = capturing_fit
        return client

    return ClientApp(client_fn=client_fn, mods=[secagg_client_mod(overrides)])


def run_secure(tmp_path: Path, **extra) -> tuple[list[dict], list[np.ndarray], list[tuple[list[np.ndarray], int]]]:
    """One SecAgg+ round: (metrics rows, the strategy's aggregate, every client's (upload, examples))."""
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    overrides = {
        "results-dir": str(tmp_path / "results"),
        "run-name": "run",
        "num-partitions": CLIENTS,
        "num-rounds": 1,
        "batch-size": 32,
        "device": "cpu",
        "secagg": True,
        **extra,
    }
    simulate(
        make_server_app(overrides),
        capturing_client_app(overrides, uploads),
        num_supernodes=CLIENTS,
        backend_config=BACKEND,
    )
    run_dir = tmp_path / "results" / "run"
    rows = read_metrics(run_dir / "metrics.jsonl")
    aggregate = load_checkpoint(run_dir / CHECKPOINT_FILE).global_arrays
    captured = []
    for path in sorted(uploads.glob("round1-*.npz")):
        with np.load(path) as data:
            arrays = [data[f"arr_{i}"] for i in range(len(data.files) - 1)]
            captured.append((arrays, int(data["num_examples"])))
    return rows, aggregate, captured


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("promptfl", {"shots-per-class": 8}),
        ("pfedlora", {"client-models": "cnn-1,cnn-3"}),
    ],
)
def test_secure_aggregate_equals_the_plain_weighted_average(tmp_path, method, extra):
    rows, aggregate, captured = run_secure(tmp_path, method=method, **extra)
    assert len(captured) == CLIENTS, "every client trained once"
    [row] = rows
    assert row["clients_fit"] == CLIENTS and row["clients_failed"] == 0 and not row["round_skipped"]
    assert math.isfinite(row["train_loss"]) and row["bytes_up_per_client"] > row["bytes_down_per_client"]
    counts = [n for _, n in captured]
    total = sum(counts)
    plain = [sum(arrays[i].astype(np.float64) * n for arrays, n in captured) / total for i in range(len(aggregate))]
    peak = max(float(np.abs(a).max()) for arrays, _ in captured for a in arrays if a.size)
    bound = error_bound(counts, peak, 8.0, 2**22, 1000.0)
    assert bound < 1e-3
    for got, want in zip(aggregate, plain, strict=True):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    # Quantization noise shows the server never averaged the plain uploads itself.
    assert max(float(np.abs(got - want).max()) for got, want in zip(aggregate, plain, strict=True) if got.size) > 0
    # The clients disagree by far more than the tolerance, so the check can tell the average apart.
    spread = max(float(np.abs(arrays[0] - plain[0]).max()) for arrays, _ in captured)
    assert spread > 20 * bound
    summary = json.loads((tmp_path / "results" / "run" / "summary.json").read_text())
    assert summary["rounds"] == 1
