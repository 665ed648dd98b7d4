"""What caching the frozen image features saves in prompt learning.

Trains one PromptFL context for a few epochs two ways on the same images:
encoding every batch through the frozen image encoder (what a naive loop does),
and encoding the images once and training on the cached features (what the
clients do). Prints both times, the speed-up and the largest logit difference::

    python benchmarks/prompt_feature_cache.py --model fedapp-tiny-vit-b --images 512 --epochs 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedapp.models import load_open_clip
from fedapp.models.image_features import clip_image_batch, encode_images
from fedapp.models.text_prompt import PromptContext, PromptTextEncoder, clip_logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="fedapp-tiny-vit-b", help="open_clip model (ViT-B widths, 2 layers)")
    parser.add_argument("--pretrained", default="")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    clip = load_open_clip(args.model, args.pretrained)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.images, 32, 32, 3), dtype=np.uint8)
    labels = torch.as_tensor(rng.integers(0, args.classes, args.images))
    encoder = PromptTextEncoder(clip, [f"class {i}" for i in range(args.classes)])
    scale = clip.model.logit_scale.detach()

    def run(cached: bool) -> tuple[float, torch.Tensor]:
        context = PromptContext(8, encoder.token_width, generator=0)
        optimizer = torch.optim.SGD(context.parameters(), lr=0.01)
        started = time.perf_counter()
        features = encode_images(clip, images, batch_size=args.batch_size) if cached else None
        for _ in range(args.epochs):
            for start in range(0, args.images, args.batch_size):
                batch = slice(start, start + args.batch_size)
                if cached:
                    feats = features[batch]
                else:
                    with torch.no_grad():
                        feats = F.normalize(clip.model.encode_image(clip_image_batch(images[batch], clip)), dim=-1)
                loss = F.cross_entropy(
                    clip_logits(feats, encoder.encode_classes(context.context), scale), labels[batch]
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            final = clip_logits(encode_images(clip, images[:64]), encoder.encode_classes(context.context), scale)
        return time.perf_counter() - started, final

    uncached_s, uncached_logits = run(cached=False)
    cached_s, cached_logits = run(cached=True)
    print(f"model {args.model}, {args.images} images, {args.epochs} epochs, batch {args.batch_size}")
    print(f"re-encoding every batch: {uncached_s:.2f}s")
    print(f"encoding once (cached):  {cached_s:.2f}s")
    print(f"speed-up:                {uncached_s / cached_s:.2f}x")
    print(f"max |logit difference| after training: {float((uncached_logits - cached_logits).abs().max()):.2e}")


if __name__ == "__main__":
    main()
