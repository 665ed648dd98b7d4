"""Every catalogued method, server and clients, on a stand-in GPU that refuses mixed devices.

CI has no GPU. Run on ``tests/fake_device.py``'s stand-in, the in-process driver
(the same strategies and clients a Flower run uses) takes every method through two
rounds with ``device = "cuda"``: a tensor that our code makes on the CPU and feeds to
a model, a loss or an optimiser on the GPU fails the run here as it would on a GPU
(pFedLoRA's FLOP count did, on every client of every round, before issue 40). What
the stand-in cannot see is in its module docstring; tests/gpu runs the real thing.
"""

from __future__ import annotations

import logging

import pytest
import torch

from fedapp import inprocess, training
from fedapp.catalog import CATALOG
from fedapp.inprocess import run_in_process
from fedapp.state import MemoryStateStore
from tests.fake_device import fake_accelerator

BRIEF = {"num-partitions": 3, "num-rounds": 2, "batch-size": 16, "shots-per-class": 3, "min-clients": 2}
BACKBONES = {"clip-vision": {"clip-model": "fedapp-tiny-vit"}}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("method", sorted(CATALOG))
def test_every_method_runs_on_the_stand_in_gpu_and_counts_its_flops(method, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="flwr.fedapp")
    training._log_once.cache_clear()
    overrides = {"method": method, "device": "cuda", **BRIEF, **BACKBONES.get(CATALOG[method].backbone, {})}
    with fake_accelerator(monkeypatch):
        history = run_in_process(overrides).history
    training._log_once.cache_clear()
    assert "device = cuda: using cuda:0 (fake accelerator (CPU))" in caplog.text
    assert [record.round for record in history] == [1, 2]
    for record in history:
        assert record.clients_failed == 0 and record.clients_evaluated == BRIEF["num-partitions"]
        # Every method's training FLOPs come from the one counter (fedapp/flops.py).
        assert record.train_flops_round > 0, f"{method} reported no training FLOPs in round {record.round}"
    assert "not counted" not in caplog.text


EXPORTED = {
    "pfedlora": {"client-models": "cnn-4,cnn-5"},
    "sdfed": {"local-prompt-lengths": "2,3,4"},
    "pep-fedpt": {"clip-model": "fedapp-tiny-vit"},
    "fedd2p": {"client-models": "vgg-2,vgg-3"},
}


@pytest.mark.parametrize("method", EXPORTED)
def test_an_exported_model_loads_and_predicts_on_the_stand_in_gpu(method, monkeypatch, tmp_path):
    """fedapp.load_model(..., device="cuda"): the model, and a CLIP backbone under it, where asked;
    its input from prepare_images (on the CPU) moved there, as docs/results.md shows."""
    import fedapp  # noqa: PLC0415
    from fedapp.clientdata import load_client_data  # noqa: PLC0415
    from fedapp.config import resolve_run_config  # noqa: PLC0415
    from fedapp.inference import prepare_images  # noqa: PLC0415

    overrides = {"method": method, **BRIEF, **EXPORTED[method], "results-dir": str(tmp_path), "run-name": "run"}
    run_in_process(overrides, record=True)
    data = load_client_data(resolve_run_config(overrides), 0, BRIEF["num-partitions"])
    test = data.splits["test"]
    with fake_accelerator(monkeypatch) as gpu:
        model = fedapp.load_model(tmp_path / "run", client=0, device="cuda")
        with torch.no_grad():
            logits = model(prepare_images(tmp_path / "run", test.images, client=0).to(gpu))
        assert logits.device == gpu and tuple(logits.shape) == (len(test.labels), data.num_classes)


@pytest.mark.parametrize("method", sorted(CATALOG))
def test_a_methods_clients_keep_personal_state_exactly_when_its_catalog_entry_says(method, monkeypatch):
    """``personal_state`` decides whether a run can resume with ``state = "memory"``
    (fedapp.config.rules): a method whose clients stored anything, uncatalogued, would resume
    with clients that start again from scratch."""
    stores: list[dict] = []

    class RecordedStore(MemoryStateStore):
        def __init__(self, mapping: dict) -> None:
            super().__init__(mapping)
            stores.append(mapping)

    monkeypatch.setattr(inprocess, "MemoryStateStore", RecordedStore)
    run_in_process({"method": method, **BRIEF, "num-rounds": 1, **BACKBONES.get(CATALOG[method].backbone, {})})
    assert len(stores) == BRIEF["num-partitions"]
    assert all(bool(store) == CATALOG[method].personal_state for store in stores), [sorted(s) for s in stores]
