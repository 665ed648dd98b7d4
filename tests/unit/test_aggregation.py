"""Aggregation math, update validation and byte accounting."""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from fedapp.aggregation import metrics_problem, update_problem, weighted_average
from fedapp.metrics import AccuracyStats, payload_bytes
from fedapp.params import decode_parameters


def test_weighted_average_weights_by_examples():
    a = [np.array([0.0, 0.0]), np.array([1], dtype=np.int64)]
    b = [np.array([4.0, 8.0]), np.array([3], dtype=np.int64)]
    out = weighted_average([(a, 1), (b, 3)])
    np.testing.assert_allclose(out[0], [3.0, 6.0])
    assert out[1].dtype == np.int64 and out[1][0] == 2  # integer buffers stay integers
    assert out[0].dtype == a[0].dtype


def test_update_problem_names_each_defect():
    ref = [np.zeros((2, 3), dtype=np.float32)]
    assert update_problem([np.ones((2, 3), np.float32)], 5, ref) is None
    assert "shape" in update_problem([np.ones((3, 2), np.float32)], 5, ref)
    assert "dtype" in update_problem([np.ones((2, 3), np.float64)], 5, ref)
    assert "NaN or Inf" in update_problem([np.full((2, 3), np.inf, np.float32)], 5, ref)
    assert "non-positive" in update_problem([np.ones((2, 3), np.float32)], 0, ref)
    assert "arrays, expected" in update_problem([], 5, ref)
    assert "non-positive" in update_problem([np.ones((2, 3), np.float32)], -4, ref)
    assert "not an integer" in update_problem([np.ones((2, 3), np.float32)], 2.5, ref)


def test_update_problem_refuses_negative_counts_and_non_finite_values_without_a_layout():
    # Per-class uploads end in integer class counts; a negative one would subtract from other clients'.
    counts = np.array([3, -1, 0], dtype=np.int64)
    assert "negative counts" in update_problem([np.zeros((3, 2), np.float32), counts], 5, None)
    assert update_problem([np.zeros((3, 2), np.float32), np.abs(counts)], 5, None) is None
    assert "NaN or Inf" in update_problem([np.array([1.0, np.nan])], 5, None)


def test_metrics_problem_checks_what_the_server_aggregates():
    assert metrics_problem({"train_loss": 0.3, "train_flops": 10, "note": "anything"}) is None
    assert metrics_problem({}) is None  # a method that reports no loss is fine
    assert "NaN or Inf" in metrics_problem({"train_loss": float("nan")})
    assert "NaN or Inf" in metrics_problem({"train_flops": float("inf")})
    assert "not a number" in metrics_problem({"train_loss": "low"})
    assert "negative" in metrics_problem({"train_flops": -1})


def test_payload_bytes_is_the_serialized_size_of_the_arrays():
    arrays = [np.zeros((10, 20), dtype=np.float32), np.zeros(7, dtype=np.float64)]
    params = ndarrays_to_parameters(arrays)
    counted = payload_bytes(params.tensors)
    assert counted == sum(len(t) for t in params.tensors)
    raw = sum(a.nbytes for a in arrays)
    # .npy framing adds one small header per array and nothing else.
    assert raw < counted <= raw + 128 * len(arrays)


def test_accuracy_stats_ignore_clients_without_a_test_set():
    stats = AccuracyStats.of([0.5, 1.0, float("nan")])
    assert stats.clients == 2 and stats.mean == 0.75 and stats.worst == 0.5


def test_decode_parameters_is_a_zero_copy_view_equal_to_flowers_decoder() -> None:
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        np.array(5, dtype=np.int64),
        np.zeros((0, 3), dtype=np.float16),
        np.array([True, False]),
    ]
    params = ndarrays_to_parameters(arrays)
    decoded = decode_parameters(params.tensors)
    for ours, flowers, original in zip(decoded, parameters_to_ndarrays(params), arrays, strict=True):
        assert ours.dtype == flowers.dtype == original.dtype
        assert ours.shape == flowers.shape == original.shape
        np.testing.assert_array_equal(ours, original)
        assert not ours.flags.writeable  # a view of the received bytes, not a copy
    assert np.shares_memory(decoded[0], np.frombuffer(params.tensors[0], dtype=np.uint8))
