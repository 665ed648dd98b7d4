"""Personal client state persists across rounds, in memory and on disk."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from safetensors.numpy import load_file

from fedapp.client_app import flower_state_store
from fedapp.errors import StateError
from fedapp.models import MODEL_NAMES, build_model, seeded_model
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
    assert (tmp_path / "run-a" / "partition-3" / "model.safetensors").exists()
    # Keyed by run and partition: other keys see nothing.
    assert DiskStateStore(tmp_path, "run-b", 3).load("model") is None
    assert DiskStateStore(tmp_path, "run-a", 4).load("model") is None


def test_disk_store_refuses_a_corrupt_file(tmp_path):
    store = DiskStateStore(tmp_path, "run", 0)
    store.save("model", _arrays(0))
    store.path("model").write_bytes(b"not a safetensors file")
    with pytest.raises(StateError, match="unreadable"):
        store.load("model")


def test_a_disk_store_reads_state_an_earlier_release_wrote_as_npz_and_replaces_it(tmp_path):
    store = DiskStateStore(tmp_path, "run", 0)
    store.directory.mkdir(parents=True)
    np.savez(store.directory / "model.npz", **_arrays(5))  # what releases before safetensors wrote
    np.testing.assert_array_equal(store.load("model")["w"], _arrays(5)["w"])
    store.save("model", _arrays(6))
    assert sorted(p.name for p in store.directory.iterdir()) == ["model.safetensors"]
    np.testing.assert_array_equal(store.load("model")["w"], _arrays(6)["w"])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_model_built_without_weights_and_given_stored_ones_is_the_model_that_was_stored(name):
    from fedapp.params import named_arrays_to_state, state_to_named_arrays  # noqa: PLC0415

    torch.manual_seed(7)
    trained = build_model(name, 10)
    stored = state_to_named_arrays(trained)
    rng_before = torch.get_rng_state()
    skeleton = seeded_model(name, 10, seed=3, materialise=False)
    assert all(t.is_meta for t in skeleton.state_dict().values())
    rng_skeleton = torch.get_rng_state()
    torch.set_rng_state(rng_before)
    seeded_model(name, 10, seed=3)
    assert torch.equal(rng_skeleton, torch.get_rng_state())  # the RNG ends where building leaves it
    named_arrays_to_state(skeleton, stored, assign=True)
    trained.eval()
    skeleton.eval()
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(trained(x), skeleton(x))
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in skeleton.parameters())
    before = {k: v.copy() for k, v in stored.items()}
    skeleton(x).sum().backward()
    torch.optim.SGD(skeleton.parameters(), lr=1.0).step()
    assert all(np.array_equal(before[k], stored[k]) for k in stored)  # the model owns copies


def test_stored_state_that_lacks_a_tensor_is_refused_when_assigned():
    from fedapp.params import PayloadError, named_arrays_to_state, state_to_named_arrays  # noqa: PLC0415

    stored = state_to_named_arrays(build_model("cnn-5", 10))
    stored.pop(next(iter(stored)))
    with pytest.raises(PayloadError, match="stored state lacks"):
        named_arrays_to_state(seeded_model("cnn-5", 10, seed=0, materialise=False), stored, assign=True)


def test_a_scalar_buffer_stored_as_a_one_element_array_loads_back():
    # Flower's ArrayRecord hands 0-d tensors (BatchNorm's num_batches_tracked) back as shape (1,).
    from fedapp.models import build_model  # noqa: PLC0415
    from fedapp.params import named_arrays_to_state, state_to_named_arrays  # noqa: PLC0415

    model = build_model("vgg-2", 10)
    stored = {k: (v.reshape(1) if v.ndim == 0 else v) for k, v in state_to_named_arrays(model).items()}
    assert any(k.endswith("num_batches_tracked") for k in stored)
    named_arrays_to_state(build_model("vgg-2", 10), stored)


def test_a_disk_store_loads_only_its_own_runs_state_and_sets_another_runs_aside_whole(tmp_path):
    first = DiskStateStore(tmp_path, "run", 0)
    first.join_run("token-a")
    first.save("model", _arrays(2))
    again = DiskStateStore(tmp_path, "run", 0)  # the same run: a later round, or a resume
    again.join_run("token-a")
    np.testing.assert_array_equal(again.load("model")["w"], _arrays(2)["w"])

    rerun = DiskStateStore(tmp_path, "run", 0)  # a new run under the same name
    rerun.join_run("token-b")
    assert rerun.load("model") is None
    assert rerun.owner() == {"run-token": "token-b"}
    aside = tmp_path / "run" / "partition-0.run-token-a"
    np.testing.assert_array_equal(load_file(aside / "model.safetensors")["w"], _arrays(2)["w"])  # nothing lost


def test_state_of_no_recorded_run_is_set_aside_and_repeated_names_do_not_collide(tmp_path):
    for _ in range(2):
        DiskStateStore(tmp_path, "run", 1).save("model", _arrays(1))  # written without a run (older versions)
        DiskStateStore(tmp_path, "run", 1).join_run("token")
        (tmp_path / "run" / "partition-1" / "run.json").unlink()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "partition-1",
        "partition-1.run-unknown",
        "partition-1.run-unknown-1",
    ]


def test_a_new_run_continues_an_earlier_runs_personal_state_only_when_asked_and_copies_it(tmp_path):
    earlier = DiskStateStore(tmp_path, "first", 0)
    earlier.join_run("token-a")
    earlier.save("model", _arrays(3))
    plain = DiskStateStore(tmp_path, "second", 0)
    plain.join_run("token-b")
    assert plain.load("model") is None

    continued = DiskStateStore(tmp_path, "third", 0)
    continued.join_run("token-c", continue_from="first")
    np.testing.assert_array_equal(continued.load("model")["w"], _arrays(3)["w"])
    assert continued.owner() == {"run-token": "token-c", "continued-from": "first"}
    assert earlier.owner() == {"run-token": "token-a"} and earlier.load("model") is not None  # copied, not moved


def test_a_server_that_sends_no_token_checks_nothing(tmp_path):
    DiskStateStore(tmp_path, "run", 0).save("model", _arrays(1))
    store = DiskStateStore(tmp_path, "run", 0)
    store.join_run(None)
    assert store.load("model") is not None and store.owner() is None
