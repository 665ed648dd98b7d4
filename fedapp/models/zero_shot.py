"""Zero-shot classification with a CLIP model: a class is the mean of its captions' features.

The caption templates are CLIP's CIFAR-10 prompt set; the contrastive pretraining
(:mod:`fedapp.pretrain`) captions its images with them and reports its result's accuracy here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedapp.errors import DataError
from fedapp.models.clip import LoadedClip
from fedapp.models.image_features import encode_images
from fedapp.models.text_prompt import class_phrase

__all__ = ["CAPTION_TEMPLATES", "caption_tokens", "class_text_features", "zero_shot_accuracy"]

CAPTION_TEMPLATES: tuple[str, ...] = (
    "a photo of a {c}.",
    "a blurry photo of a {c}.",
    "a black and white photo of a {c}.",
    "a low contrast photo of a {c}.",
    "a high contrast photo of a {c}.",
    "a bad photo of a {c}.",
    "a good photo of a {c}.",
    "a photo of a small {c}.",
    "a photo of a big {c}.",
    "a photo of the {c}.",
    "a pixelated photo of a {c}.",
    "a cropped photo of a {c}.",
)
"""Caption templates, from CLIP's CIFAR-10 prompt set; zero-shot uses their ensemble."""


def caption_tokens(clip: LoadedClip, class_names: Sequence[str], templates: Sequence[str]) -> torch.Tensor:
    """Token ids of every caption, template-major: row ``t * C + c``."""
    captions = [t.format(c=class_phrase(name)) for t in templates for name in class_names]
    return clip.tokenizer(captions)


@torch.no_grad()
def class_text_features(
    clip: LoadedClip, class_names: Sequence[str], templates: Sequence[str] = CAPTION_TEMPLATES
) -> torch.Tensor:
    """One unit vector per class: the normalised mean of its captions' features (CLIP's ensemble)."""
    tokens = caption_tokens(clip, class_names, templates).to(clip.model.positional_embedding.device)
    features = F.normalize(clip.model.encode_text(tokens).float(), dim=-1)
    per_class = features.view(len(templates), len(class_names), -1).mean(dim=0)
    return F.normalize(per_class, dim=-1)


@torch.no_grad()
def zero_shot_accuracy(
    clip: LoadedClip,
    images: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    templates: Sequence[str] = CAPTION_TEMPLATES,
) -> float:
    """Top-1 accuracy of classifying ``images`` by their nearest class caption ensemble."""
    if len(labels) == 0:
        raise DataError("zero-shot accuracy needs at least one image")
    was_training = clip.model.training
    clip.model.eval()
    try:
        text = class_text_features(clip, class_names, templates)
        predicted = (encode_images(clip, images) @ text.T).argmax(dim=1).cpu().numpy()
    finally:
        clip.model.train(was_training)
    return float(np.mean(predicted == labels))
