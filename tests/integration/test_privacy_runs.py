"""Client-level differential privacy in a Ray simulation: epsilon per round and in the summary."""

from __future__ import annotations

import json

import pytest

from fedapp.dp import epsilon


def test_simulation_reports_epsilon_per_round_and_in_the_summary(tmp_path):
    from fedapp.client_app import make_client_app  # noqa: PLC0415
    from fedapp.metrics import read_metrics  # noqa: PLC0415
    from fedapp.server_app import make_server_app  # noqa: PLC0415
    from tests.simulation import BACKEND, simulate  # noqa: PLC0415

    overrides = {
        "method": "fedavg",
        "model": "cnn-5",
        "results-dir": str(tmp_path),
        "run-name": "dp",
        "num-partitions": 2,
        "num-rounds": 2,
        "dp": "client",
        "dp-noise-multiplier": 0.3,
        "dp-clipping-norm": 0.2,
    }
    simulate(
        make_server_app(overrides),
        make_client_app(overrides),
        num_supernodes=2,
        backend_config=BACKEND,
    )
    rows = read_metrics(tmp_path / "dp" / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2]
    # The clients clipped their own updates (an unclipped one would have been left out). With two
    # clients the noise (std sigma C / 2 per weight) can make a client's round-2 training diverge, so
    # only round 1 must have both.
    assert rows[0]["clients_fit"] == 2
    assert not any("exceeds the clipping norm" in reason for r in rows for reason in r["left_out_reasons"])
    expected = [epsilon(1.0, 0.3, t, 1e-5) for t in (1, 2)]
    assert [r["dp_epsilon"] for r in rows] == pytest.approx(expected)
    summary = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert summary["dp_epsilon"] == pytest.approx(expected[1])
    assert summary["dp"] == "client" and summary["dp_delta"] == 1e-5 and summary["dp_rounds"] == 2
    assert summary["dp_noise_multiplier"] == 0.3 and summary["dp_clipping_norm"] == 0.2
    assert summary["dp_sampling_rate"] == 1.0
    assert "client-level" in summary["dp_guarantee"]
