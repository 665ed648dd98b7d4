"""Personal client state persists across rounds, in memory and on disk."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import RecordDict

from fedapp.client_app import flower_state_store
from fedapp.errors import StateError
from fedapp.state import DiskStateStore, MemoryStateStore


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=4)}


def test_memory_store_round_trips_through_a_flower_recorddict():
    state = RecordDict()
    store = flower_state_store(state)
    assert store.load("model") is None
    saved = _arrays(0)
    store.save("model", saved)
    # A new store over the same Context.state (a later round) sees the arrays.
    again = flower_state_store(state)
    loaded = again.load("model")
    assert set(loaded) == {"w", "b"}
    np.testing.assert_array_equal(loaded["w"], saved["w"])


def test_memory_store_copies_so_later_mutation_does_not_leak():
    store = MemoryStateStore({})
    arrays = _arrays(1)
    store.save("m", arrays)
    arrays["w"][:] = 0
    assert np.any(store.load("m")["w"] != 0)


def test_disk_store_survives_a_new_process_view(tmp_path):
    DiskStateStore(tmp_path, "run-a", 3).save("model", _arrays(2))
    # A fresh store object (as after a restart) reads what was written.
    loaded = DiskStateStore(tmp_path, "run-a", 3).load("model")
    np.testing.assert_array_equal(loaded["b"], _arrays(2)["b"])
    assert (tmp_path / "run-a" / "partition-3" / "model.npz").exists()
    # Keyed by run and partition: other keys see nothing.
    assert DiskStateStore(tmp_path, "run-b", 3).load("model") is None
    assert DiskStateStore(tmp_path, "run-a", 4).load("model") is None


def test_disk_store_refuses_a_corrupt_file(tmp_path):
    store = DiskStateStore(tmp_path, "run", 0)
    store.save("model", _arrays(0))
    store.path("model").write_bytes(b"not an npz")
    with pytest.raises(StateError, match="unreadable"):
        store.load("model")


def test_a_scalar_buffer_stored_as_a_one_element_array_loads_back():
    # Flower's ArrayRecord hands 0-d tensors (BatchNorm's num_batches_tracked) back as shape (1,).
    from fedapp.models import build_model  # noqa: PLC0415
    from fedapp.params import named_arrays_to_state, state_to_named_arrays  # noqa: PLC0415

    model = build_model("vgg-2", 10)
    stored = {k: (v.reshape(1) if v.ndim == 0 else v) for k, v in state_to_named_arrays(model).items()}
    assert any(k.endswith("num_batches_tracked") for k in stored)
    named_arrays_to_state(build_model("vgg-2", 10), stored)
