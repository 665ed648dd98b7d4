"""Tests for fedapp.models: the CNN zoo, the factory and offline open_clip loading."""

from __future__ import annotations

import socket

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from fedapp.errors import ModelError
from fedapp.models import (
    MODEL_NAMES,
    TINY_CLIP,
    TINY_VIT_B,
    ZOO,
    build_model,
    clear_clip_cache,
    count_parameters,
    load_open_clip,
    register_tiny_configs,
    seeded_model,
)
from fedapp.models.clip import TINY_CONFIG_DIR
from fedapp.models.cnn import CNN_CONFIGS

CNN_NAMES = [n for n in MODEL_NAMES if n.startswith("cnn-")]
NUM_CLASSES = 7


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that tries to open a connection: everything here is offline."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def no_download(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace every open_clip download entry point; records what was asked for."""
    calls: list[str] = []

    def fake_download(*args: object, **kwargs: object) -> str:
        calls.append(repr(args))
        raise OSError("download attempted (offline test)")

    # factory.py imports download_pretrained by name, so patch both modules.
    for module in (open_clip.pretrained, open_clip.factory):
        for attr in ("download_pretrained", "download_pretrained_from_url", "download_pretrained_from_hf"):
            if hasattr(module, attr):
                monkeypatch.setattr(module, attr, fake_download)
    return calls


# --------------------------------------------------------------------------- zoo


def test_zoo_lists_all_models() -> None:
    expected = {"cnn-1", "cnn-2", "cnn-3", "cnn-4", "cnn-5", "fedavg-cnn", "vgg-2", "vgg-3", "vgg-4"}
    assert set(MODEL_NAMES) == expected == set(ZOO)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_zoo_forward_and_features(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, NUM_CLASSES).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        logits = model(x)
        feats = model.features(x)
    assert logits.shape == (4, NUM_CLASSES)
    assert feats.shape == (4, model.feature_dim)
    assert isinstance(model.head, torch.nn.Linear)
    assert (model.head.in_features, model.head.out_features) == (model.feature_dim, NUM_CLASSES)
    # forward must be exactly head(features): methods rely on that split.
    torch.testing.assert_close(logits, model.head(feats))
    if name.startswith("cnn-"):
        assert model.feature_dim == 500
        assert (feats >= 0).all()  # R = ReLU(FC2(...))


def test_zoo_trains() -> None:
    torch.manual_seed(0)
    for name in ("cnn-2", "vgg-2"):
        model = build_model(name, NUM_CLASSES)
        model(torch.randn(4, 3, 32, 32)).sum().backward()
        assert all(p.grad is not None for p in model.parameters())


def test_cnn_family_matches_table_and_is_heterogeneous() -> None:
    table = {  # name: (conv2 channels, fc1 in, fc1 out)
        "cnn-1": (32, 800, 2000),
        "cnn-2": (16, 400, 2000),
        "cnn-3": (32, 800, 1000),
        "cnn-4": (32, 800, 800),
        "cnn-5": (32, 800, 500),
    }
    counts = {}
    for name, (c2, fc1_in, fc1_out) in table.items():
        model = build_model(name, 10)
        assert model.conv1.in_channels == 3 and model.conv1.out_channels == 16
        assert model.conv2.out_channels == c2
        assert model.fc1.weight.shape == (fc1_out, fc1_in)
        assert model.fc2.weight.shape == (500, fc1_out)
        counts[name] = count_parameters(model)
    assert len(set(counts.values())) == 5, counts
    # cnn-1 by hand: conv1 + conv2 + fc1 + fc2 + fc3.
    by_hand = (3 * 16 * 25 + 16) + (16 * 32 * 25 + 32) + (800 * 2000 + 2000) + (2000 * 500 + 500) + (500 * 10 + 10)
    assert counts["cnn-1"] == by_hand


def test_fedavg_cnn_is_the_fedavg_papers_cifar_cnn() -> None:
    model = build_model("fedavg-cnn", 10)
    # Two unpadded 5x5 convs (32, 64 channels), each max-pooled: 32 -> 28 -> 14 -> 10 -> 5; FC 1600 -> 512 -> 10.
    by_hand = (3 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (1600 * 512 + 512) + (512 * 10 + 10)
    assert count_parameters(model) == by_hand == 878_538
    assert model.feature_dim == 512 and model.fc2 is None
    x = torch.randn(4, 3, 32, 32)
    assert model.features(x).shape == (4, 512) and torch.equal(model(x), model.head(model.features(x)))


def test_vgg_feature_dims_and_blocks() -> None:
    for name, dim in (("vgg-2", 64), ("vgg-3", 128), ("vgg-4", 256)):
        model = build_model(name, NUM_CLASSES)
        assert model.feature_dim == dim
        assert len(model.blocks) == int(name[-1])
        n_bn = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
        assert n_bn == 2 * len(model.blocks)


def test_other_image_sizes_and_channels() -> None:
    cnn = build_model("cnn-1", 3, image_size=64, in_channels=1)
    assert cnn.fc1.in_features == 32 * 13 * 13  # 64 -> 60 -> 30 -> 26 -> 13
    assert cnn(torch.randn(2, 1, 64, 64)).shape == (2, 3)
    vgg = build_model("vgg-3", 3, image_size=28, in_channels=1)
    assert vgg(torch.randn(2, 1, 28, 28)).shape == (2, 3)


def test_same_seed_same_model() -> None:
    torch.manual_seed(3)
    a = build_model("cnn-3", 10)
    torch.manual_seed(3)
    b = build_model("cnn-3", 10)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb
        assert torch.equal(va, vb)


def test_unknown_model_name() -> None:
    with pytest.raises(ModelError, match="unknown model 'resnet-18'") as info:
        build_model("resnet-18", 10)
    for name in MODEL_NAMES:
        assert name in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("name", "kwargs", "pattern"),
    [
        ("cnn-1", {"num_classes": 0}, "num_classes"),
        ("cnn-1", {"num_classes": 10, "image_size": 12}, "too small"),
        ("vgg-4", {"num_classes": 10, "image_size": 8}, "too small"),
        ("vgg-2", {"num_classes": 10, "in_channels": -1}, "in_channels"),
    ],
)
def test_invalid_sizes(name: str, kwargs: dict[str, int], pattern: str) -> None:
    with pytest.raises(ModelError, match=pattern):
        build_model(name, **kwargs)


def test_count_parameters_trainable_only() -> None:
    model = build_model("cnn-5", 10)
    total = count_parameters(model)
    assert total == sum(p.numel() for p in model.parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    model.head.requires_grad_(True)
    assert count_parameters(model, trainable_only=True) == 500 * 10 + 10
    assert count_parameters(model) == total


def test_cnn_configs_are_data() -> None:
    cfg = CNN_CONFIGS["cnn-3"]
    with pytest.raises(AttributeError):
        cfg.fc1_out = 5  # type: ignore[misc]  # frozen: configs are shared


# -------------------------------------------------------------------- open_clip


def test_tiny_clip_loads_offline_and_runs() -> None:
    clip = load_open_clip(TINY_CLIP, "")
    assert clip.model_name == TINY_CLIP and clip.pretrained == ""
    assert (clip.embed_dim, clip.text_width, clip.vision_width) == (32, 64, 64)
    tokens = clip.tokenizer(["a photo of a cat", "a photo of a dog"])
    assert tokens.shape == (2, 32)  # the tiny config's context length
    with torch.no_grad():
        img = clip.model.encode_image(torch.randn(2, 3, 32, 32))
        txt = clip.model.encode_text(tokens)
    assert img.shape == txt.shape == (2, clip.embed_dim)
    pil = Image.fromarray(np.zeros((48, 40, 3), dtype=np.uint8))
    assert clip.preprocess(pil).shape == (3, 32, 32)


def test_tiny_clip_frozen_and_cached() -> None:
    clip = load_open_clip(TINY_CLIP)
    assert not clip.model.training
    assert all(not p.requires_grad for p in clip.model.parameters())
    assert load_open_clip(TINY_CLIP, "") is clip
    assert load_open_clip(TINY_CLIP, "none") is clip  # same normalised key


def test_register_tiny_configs_idempotent() -> None:
    register_tiny_configs()
    register_tiny_configs()
    assert open_clip.factory._MODEL_CONFIG_PATHS.count(TINY_CONFIG_DIR) == 1
    assert {TINY_CLIP, TINY_VIT_B} <= set(open_clip.list_models())
    assert open_clip.get_tokenizer(TINY_CLIP).context_length == 32
    model, _, _ = open_clip.create_model_and_transforms(TINY_CLIP)
    assert model.visual.transformer.width == 64


def test_tiny_vit_b_has_vit_b_widths() -> None:
    clip = load_open_clip(TINY_VIT_B)
    assert (clip.embed_dim, clip.text_width, clip.vision_width) == (512, 512, 768)


def test_checkpoint_roundtrip(tmp_path, no_download: list[str]) -> None:
    register_tiny_configs()
    torch.manual_seed(1)
    source = open_clip.create_model(TINY_CLIP)
    saved = {k: v.clone() for k, v in source.state_dict().items()}
    ckpt = tmp_path / "ckpt.pt"
    torch.save(saved, ckpt)

    # A different seed: if the checkpoint were ignored, weights would differ.
    torch.manual_seed(2)
    clip = load_open_clip(TINY_CLIP, str(ckpt))
    assert clip.pretrained == str(ckpt.resolve())
    loaded = clip.model.state_dict()
    assert loaded.keys() == saved.keys()
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key
    assert not torch.equal(loaded["token_embedding.weight"], load_open_clip(TINY_CLIP).model.token_embedding.weight)
    assert all(not p.requires_grad for p in clip.model.parameters())
    assert no_download == []


@pytest.mark.parametrize("name", ["nope.pt", "sub/dir/weights", "w.safetensors"])
def test_missing_checkpoint(tmp_path, name: str) -> None:
    path = str(tmp_path / name)
    with pytest.raises(ModelError, match="checkpoint not found") as info:
        load_open_clip(TINY_CLIP, path)
    assert path in str(info.value)


def test_corrupt_checkpoint(tmp_path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="could not be loaded") as info:
        load_open_clip(TINY_CLIP, str(bad))
    assert str(bad) in str(info.value)


def test_unknown_tag_rejected_before_download(no_download: list[str]) -> None:
    with pytest.raises(ModelError, match="unknown pretrained tag 'no-such-tag'") as info:
        load_open_clip("ViT-B-32", "no-such-tag")
    assert "openai" in str(info.value)  # lists the valid tags
    assert no_download == []


def test_valid_tag_goes_to_open_clip_download(no_download: list[str]) -> None:
    # Tags match case-insensitively with "-" for "_", as in open_clip.
    with pytest.raises(ModelError, match="could not fetch pretrained weights ViT-B-32:laion400m_e31"):
        load_open_clip("ViT-B-32", "LAION400M-E31")
    assert len(no_download) == 1


def test_tiny_clip_has_no_tags() -> None:
    with pytest.raises(ModelError, match="no pretrained tags"):
        load_open_clip(TINY_CLIP, "openai")


def test_unknown_clip_model() -> None:
    with pytest.raises(ModelError, match="unknown open_clip model 'ViT-Q-99'") as info:
        load_open_clip("ViT-Q-99")
    assert TINY_CLIP in str(info.value) and "ViT-B-32" in str(info.value)


def test_unknown_precision() -> None:
    with pytest.raises(ModelError, match="unknown precision 'fp8'"):
        load_open_clip(TINY_CLIP, precision="fp8")


@pytest.mark.parametrize("name", ["cnn-1", "cnn-5", "vgg-2"])
def test_seeded_model_equals_a_fresh_build_and_leaves_the_same_rng(name: str) -> None:
    torch.manual_seed(7)
    fresh = build_model(name, 10, image_size=32)
    after_fresh = torch.rand(3)
    for _ in range(2):  # the second call copies the cached template
        copied = seeded_model(name, 10, seed=7, image_size=32)
        after_copied = torch.rand(3)
        assert torch.equal(after_copied, after_fresh)
        for (key, a), b in zip(fresh.state_dict().items(), copied.state_dict().values(), strict=True):
            assert torch.equal(a, b), key
    # Each call owns its model: training one does not touch the next.
    with torch.no_grad():
        next(copied.parameters()).add_(1.0)
    again = seeded_model(name, 10, seed=7, image_size=32)
    assert torch.equal(next(again.parameters()), next(fresh.parameters()))
    assert not torch.equal(next(seeded_model(name, 10, seed=8).parameters()), next(fresh.parameters()))


def test_a_random_init_backbone_is_the_same_in_every_process_and_leaves_the_rng_alone() -> None:
    # Simulation workers and the server each load the backbone themselves, after different
    # histories of the global RNG; without weights they must still hold the very same one.
    loaded = []
    for history in (1, 1000):
        clear_clip_cache()
        torch.manual_seed(history)
        torch.rand(history)
        before = torch.get_rng_state()
        loaded.append([p.detach().clone() for p in load_open_clip(TINY_CLIP).model.parameters()])
        assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is where it was
    clear_clip_cache()
    assert all(torch.equal(a, b) for a, b in zip(*loaded, strict=True))
    # Another architecture is another draw, not the same numbers reshaped.
    vit = load_open_clip(TINY_VIT_B).model.visual.conv1.weight.flatten()
    assert not torch.equal(vit[:8], loaded[0][0].flatten()[:8])


def test_the_zoo_s_names_are_the_factory_s_own():
    from fedapp.models import MODEL_NAMES, ZOO  # noqa: PLC0415

    assert tuple(ZOO) == MODEL_NAMES
