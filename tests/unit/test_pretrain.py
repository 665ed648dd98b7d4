"""Contrastive pretraining: a tiny config on generated images, loaded back through open_clip."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedapp import pretrain as pretrain_module
from fedapp.data.arrays import ArrayDataset
from fedapp.data.reserve import reserve_parts
from fedapp.errors import ModelError
from fedapp.models.clip import TINY_CLIP, clear_clip_cache, load_open_clip
from fedapp.pretrain import PretrainResult, PretrainSettings, default_checkpoint, pretrain_clip, zero_shot_accuracy

CLASSES = ("red thing", "green thing", "blue thing")


def _coloured_images(per_class: int = 30) -> ArrayDataset:
    rng = np.random.default_rng(0)
    images, labels = [], []
    for cls in range(len(CLASSES)):
        batch = rng.integers(0, 80, (per_class, 32, 32, 3), dtype=np.uint8)
        batch[..., cls] += 150
        images.append(batch)
        labels += [cls] * per_class
    return ArrayDataset(images=np.concatenate(images), labels=np.array(labels, dtype=np.int64), class_names=CLASSES)


SETTINGS = PretrainSettings(
    model_name=TINY_CLIP, epochs=2, batch_size=8, lr=2e-3, warmup_epochs=0.5, reserve_pretrain=0.6, reserve_test=0.2
)


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArrayDataset, PretrainResult]:
    source = _coloured_images()
    return source, pretrain_clip(source, SETTINGS, tmp_path_factory.mktemp("pretrain") / "clip.pt")


def test_pretrained_checkpoint_loads_through_open_clip_and_beats_random_init(finished) -> None:
    source, result = finished
    assert not result.cached and [row["epoch"] for row in result.curve] == [1, 2]
    assert result.curve[-1]["loss"] < result.curve[0]["loss"]
    meta = json.loads(result.checkpoint.with_name("clip.pt.json").read_text())
    assert meta["key"] == result.key and meta["data"]["test"] == 18
    assert meta["zero_shot_accuracy"] == result.zero_shot_accuracy
    assert not result.checkpoint.with_name("clip.pt.partial").exists()

    clear_clip_cache()
    loaded = load_open_clip(TINY_CLIP, pretrained=str(result.checkpoint))
    saved = torch.load(result.checkpoint, weights_only=True)["state_dict"]
    for name, tensor in loaded.model.state_dict().items():
        torch.testing.assert_close(tensor, saved[name], msg=name)
    random_init = load_open_clip(TINY_CLIP)
    images, labels = source.images, source.labels
    assert (
        zero_shot_accuracy(loaded, images, labels, CLASSES)
        > 0.9
        > zero_shot_accuracy(random_init, images, labels, CLASSES)
    )


def test_an_interrupted_run_resumes_to_the_same_weights_and_a_finished_one_is_reused(finished, tmp_path: Path) -> None:
    source, straight = finished

    def stop_after_first(row: dict[str, float]) -> None:
        if row["epoch"] == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        pretrain_clip(source, SETTINGS, tmp_path / "resumed.pt", on_epoch=stop_after_first)
    assert (tmp_path / "resumed.pt.partial").exists() and not (tmp_path / "resumed.pt").exists()
    epochs_run: list[float] = []
    resumed = pretrain_clip(
        source, SETTINGS, tmp_path / "resumed.pt", on_epoch=lambda row: epochs_run.append(row["epoch"])
    )
    assert epochs_run == [2] and resumed.key == straight.key
    a = torch.load(straight.checkpoint, weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "resumed.pt", weights_only=True)["state_dict"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name)

    again = pretrain_clip(source, SETTINGS, straight.checkpoint, on_epoch=lambda row: pytest.fail("retrained"))
    assert again.cached and again.zero_shot_accuracy == straight.zero_shot_accuracy


def test_a_checkpoint_from_other_settings_is_never_overwritten(finished, tmp_path: Path) -> None:
    source, result = finished
    before = result.checkpoint.read_bytes()
    other = PretrainSettings(**{**SETTINGS.__dict__, "seed": 1})
    with pytest.raises(ModelError, match="not made from these settings"):
        pretrain_clip(source, other, result.checkpoint, on_epoch=lambda row: pytest.fail("trained"))
    assert result.checkpoint.read_bytes() == before

    # Without --out, the checkpoint's place is a function of its key: a second call finds it.
    default = default_checkpoint(tmp_path, TINY_CLIP, result.key)
    default.parent.mkdir(parents=True)
    for suffix in ("", ".json"):
        shutil.copy(f"{result.checkpoint}{suffix}", f"{default}{suffix}")
    assert pretrain_clip(source, SETTINGS, cache_dir=tmp_path).checkpoint == default


def test_pretraining_trains_only_on_the_reserved_pretraining_images(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = _coloured_images()
    ids = np.arange(len(source))
    source.images[:, 0, 0, 0], source.images[:, 0, 1, 0] = ids // 256, ids % 256  # every image names itself
    parts = reserve_parts(source.labels, pretrain=0.6, test=0.2, seed=SETTINGS.reserve_seed)
    trained_on: set[int] = set()
    real = pretrain_module.clip_image_batch

    def recording(images: np.ndarray, clip, **options):
        trained_on.update(int(a) * 256 + int(b) for a, b in zip(images[:, 0, 0, 0], images[:, 0, 1, 0], strict=True))
        return real(images, clip, **options)

    monkeypatch.setattr(pretrain_module, "clip_image_batch", recording)
    pretrain_clip(source, PretrainSettings(**{**SETTINGS.__dict__, "epochs": 1}), cache_dir=tmp_path)
    # Everything it trained on is pretraining data; the 5% curve slice of that part is held back.
    assert trained_on <= set(parts.pretrain.tolist())
    assert len(trained_on) >= 0.9 * len(parts.pretrain)


def test_augmentation_is_the_per_image_crop_and_flip_gathered_in_one_op() -> None:
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    gathered = pretrain_module._augment(x, torch.Generator().manual_seed(2))
    # The recipe as it was written image by image, with the same draws.
    generator = torch.Generator().manual_seed(2)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
    offsets = torch.randint(0, 9, (6, 2), generator=generator).tolist()
    expected = torch.stack([padded[i, :, r : r + 8, c : c + 8] for i, (r, c) in enumerate(offsets)])
    flip = torch.rand(6, generator=generator) < 0.5
    expected[flip] = expected[flip].flip(-1)
    assert torch.equal(gathered, expected)


def test_bf16_is_part_of_the_recipe_and_fp32_keeps_the_keys_it_had() -> None:
    config, digest = {"embed_dim": 8}, "d" * 64
    bf16 = PretrainSettings(**{**SETTINGS.__dict__, "precision": "bf16"})
    before_bf16 = {key: value for key, value in SETTINGS.__dict__.items() if key != "precision"}
    payload = {"format": 1, "config": config, "data": digest, "settings": before_bf16}
    old_key = pretrain_module.hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    assert pretrain_module.cache_key(SETTINGS, config, digest) == old_key
    assert pretrain_module.cache_key(bf16, config, digest) != old_key
    with pytest.raises(ModelError, match="precision 'fp16' is not one of fp32, bf16"):
        PretrainSettings(model_name=TINY_CLIP, precision="fp16")


def test_pretraining_on_a_gpu_keeps_every_tensor_on_it_and_writes_a_cpu_checkpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.fake_device import fake_accelerator  # noqa: PLC0415 - the stand-in GPU of the placement checks

    settings = PretrainSettings(**{**SETTINGS.__dict__, "epochs": 1})
    with fake_accelerator(monkeypatch) as gpu:
        result = pretrain_clip(_coloured_images(10), settings, tmp_path / "clip.pt", device=gpu)
    state = torch.load(result.checkpoint, weights_only=True)["state_dict"]
    assert all(tensor.device.type == "cpu" and tensor.dtype == torch.float32 for tensor in state.values())
    clear_clip_cache()
    assert load_open_clip(TINY_CLIP, str(result.checkpoint)).model.logit_scale.device.type == "cpu"


def test_bf16_pretraining_runs_and_keeps_fp32_weights(tmp_path: Path) -> None:
    settings = PretrainSettings(**{**SETTINGS.__dict__, "epochs": 1, "precision": "bf16"})
    result = pretrain_clip(_coloured_images(10), settings, tmp_path / "clip.pt")
    assert np.isfinite(result.curve[0]["loss"])
    state = torch.load(result.checkpoint, weights_only=True)["state_dict"]
    assert {tensor.dtype for tensor in state.values() if tensor.is_floating_point()} == {torch.float32}
