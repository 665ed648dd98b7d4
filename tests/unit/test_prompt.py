"""Prompt learning over the frozen tiny CLIP: equivalence with encode_text, freezing, feature cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedapp.errors import DataError, ModelError
from fedapp.models import TINY_CLIP, LoadedClip
from fedapp.models.image_features import ImageFeatureCache, clip_image_batch, encode_images
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder, clip_logits
from fedapp.models.text_tower import text_tower

CLASS_NAMES = ("cat", "dog", "sea lion", "hot air balloon")


@pytest.fixture(scope="module")
def encoder(clip: LoadedClip) -> PromptTextEncoder:
    return PromptTextEncoder(clip, CLASS_NAMES)


def _images(n: int, height: int = 20, width: int = 24, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, height, width, 3), dtype=np.uint8)


def test_shapes_and_properties(clip: LoadedClip, encoder: PromptTextEncoder) -> None:
    assert encoder.token_width == clip.text_width == 64
    assert encoder.embed_dim == clip.embed_dim == 32
    assert encoder.context_length == 32
    assert encoder.num_classes == len(CLASS_NAMES)
    # "hot air balloon." is 4 class tokens; SOS and EOT take two more.
    assert encoder.max_context_tokens(4) == 26
    assert encoder.max_context_tokens() == 26
    assert encoder.max_context_tokens(0) == 30


def test_encode_classes_matches_encode_text(clip: LoadedClip, encoder: PromptTextEncoder) -> None:
    ids = clip.tokenizer(["a photo of a"])
    context = clip.model.token_embedding(ids)[0, 1:5]
    assert torch.equal(context, encoder.word_embeddings("a photo of a"))
    with torch.no_grad():
        ours = encoder.encode_classes(context)
        ref = clip.model.encode_text(clip.tokenizer([f"a photo of a {n}." for n in CLASS_NAMES]), normalize=True)
    assert ours.shape == (len(CLASS_NAMES), 32)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(CLASS_NAMES)))


def test_encode_bare_matches_encode_text(clip: LoadedClip, encoder: PromptTextEncoder) -> None:
    context = encoder.word_embeddings("a photo of a")
    with torch.no_grad():
        ours = encoder.encode_bare(context)
        ref = clip.model.encode_text(clip.tokenizer(["a photo of a"]), normalize=True)[0]
    assert ours.shape == (32,)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_gradients_reach_context_not_encoder(clip: LoadedClip, encoder: PromptTextEncoder) -> None:
    before = {name: p.detach().clone() for name, p in clip.model.named_parameters()}
    prompt = PromptContext(8, encoder.token_width, generator=0)
    loss = encoder.encode_classes(prompt()).sum() + encoder.encode_bare(prompt()).sum()
    loss.backward()
    assert prompt.context.grad is not None and prompt.context.grad.abs().sum() > 0
    assert all(not p.requires_grad and p.grad is None for p in encoder.parameters())
    for name, p in clip.model.named_parameters():
        assert torch.equal(p, before[name]), name
    encoder.train()  # must not put the shared tower in train mode
    assert not clip.model.training and not encoder.transformer.training
    encoder.eval()


def test_two_context_lengths_on_one_encoder(encoder: PromptTextEncoder) -> None:
    short = PromptContext(4, encoder.token_width, generator=1)
    long = PromptContext(16, encoder.token_width, generator=2)
    with torch.no_grad():
        a, b = encoder.encode_classes(short()), encoder.encode_classes(long())
        c = encoder.encode_classes(short())
    assert a.shape == b.shape == (len(CLASS_NAMES), encoder.embed_dim)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(a, c)  # nothing about the first call leaked into the encoder


def test_context_limits_and_width(encoder: PromptTextEncoder) -> None:
    fits = torch.zeros(encoder.max_context_tokens(), encoder.token_width)
    encoder.encode_classes(fits)
    with pytest.raises(ModelError, match=r"too long.*'hot air balloon'.*context length is 32"):
        encoder.encode_classes(torch.zeros(encoder.max_context_tokens() + 1, encoder.token_width))
    encoder.encode_bare(torch.zeros(30, encoder.token_width))
    with pytest.raises(ModelError, match="too long"):
        encoder.encode_bare(torch.zeros(31, encoder.token_width))
    with pytest.raises(ModelError, match="width 32 does not match the text encoder's token width 64"):
        encoder.encode_classes(torch.zeros(4, 32))
    with pytest.raises(ModelError, match="2-D"):
        encoder.encode_classes(torch.zeros(1, 4, 64))


def test_bad_construction(clip: LoadedClip) -> None:
    with pytest.raises(ModelError, match="non-empty"):
        PromptTextEncoder(clip, [])
    with pytest.raises(ModelError, match="placeholder"):
        PromptTextEncoder(clip, ["cat"], template="a photo.")


def test_text_tower_is_found_on_clip_and_refused_where_encode_text_cannot_be_reproduced(clip: LoadedClip) -> None:
    tower, pool_type, _ = text_tower(clip.model)
    assert tower is clip.model and pool_type == clip.model.text_pool_type
    with pytest.raises(ModelError, match="no open_clip token-embedding text tower"):
        text_tower(torch.nn.Linear(2, 2))

    class CustomText(torch.nn.Module):  # CustomTextCLIP keeps its TextTransformer in .text
        def __init__(self, **tower: object) -> None:
            super().__init__()
            self.text = torch.nn.Module()
            self.text.token_embedding = torch.nn.Embedding(4, 2)
            for name, value in {"pool_type": "argmax", **tower}.items():
                setattr(self.text, name, value)

    custom = CustomText(eos_id=3)
    assert text_tower(custom) == (custom.text, "argmax", 3)
    with pytest.raises(ModelError, match="class token or padding mask"):
        text_tower(CustomText(use_pad_mask=True))
    with pytest.raises(ModelError, match="pool type 'mean' is not supported"):
        text_tower(CustomText(pool_type="mean"))
    with pytest.raises(ModelError, match="needs the model's EOS token id"):
        text_tower(CustomText(pool_type="eos"))


def test_prompt_context_init() -> None:
    a, b = PromptContext(8, 64, generator=3), PromptContext(8, 64, generator=3)
    assert (a.length, a.width) == (8, 64)
    assert torch.equal(a.context, b.context) and a.context.requires_grad
    assert 0.01 < float(PromptContext(64, 64, generator=4).context.detach().std()) < 0.03
    with pytest.raises(ModelError):
        PromptContext(0, 64)


def test_image_batch_preprocessing(clip: LoadedClip) -> None:
    x = clip_image_batch(_images(2), clip)
    assert x.shape == (2, 3, 32, 32) and x.dtype == torch.float32
    white = clip_image_batch(np.full((1, 32, 32, 3), 255, dtype=np.uint8), clip)
    expected = (1 - torch.tensor((0.48145466, 0.4578275, 0.40821073))) / torch.tensor(
        (0.26862954, 0.26130258, 0.27577711)
    )
    torch.testing.assert_close(white[0, :, 0, 0], expected)
    with pytest.raises(DataError, match="uint8"):
        clip_image_batch(np.zeros((2, 8, 8, 3), dtype=np.float32), clip)
    with pytest.raises(DataError, match="shape"):
        clip_image_batch(np.zeros((2, 8, 8), dtype=np.uint8), clip)


def test_feature_cache_encodes_once_and_keeps_logits(clip: LoadedClip, encoder: PromptTextEncoder) -> None:
    images = _images(7)
    cache = ImageFeatureCache()
    key = (TINY_CLIP, "", 0, "train")
    first = cache.get_or_encode(key, clip, images, batch_size=3)
    second = cache.get_or_encode(key, clip, images, batch_size=3)
    assert cache.encode_count == 1 and first is second and key in cache and len(cache) == 1
    cache.get_or_encode((TINY_CLIP, "", 1, "train"), clip, images[:2])
    assert cache.encode_count == 2

    context = PromptContext(8, encoder.token_width, generator=5)()
    with torch.no_grad():
        text = encoder.encode_classes(context)
        cached = clip_logits(second, text, clip.model.logit_scale)
        direct_features = clip.model.encode_image(clip_image_batch(images, clip), normalize=True)
        direct = clip.model.logit_scale.exp() * direct_features @ text.T
    assert cached.shape == (7, len(CLASS_NAMES))
    torch.testing.assert_close(cached, direct, atol=1e-5, rtol=0)
    torch.testing.assert_close(first.norm(dim=-1), torch.ones(7))
    assert encode_images(clip, images[:0]).shape == (0, clip.embed_dim)
    cache.clear()
    assert len(cache) == 0
