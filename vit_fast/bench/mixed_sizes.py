"""A batch of images of different sizes timed two ways on one model: ``packed`` (``model.forward_packed``) against
``padded`` (every image zero-padded to the largest, one ordinary forward).

The packed outputs are checked against each image's forward alone before anything is timed. ``run_mixed_sizes``
returns the result and writes nothing; ``benchmarks/mixed_sizes.py`` is its command line. More: docs/benchmarks.md."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from vit_fast.util.numerics import agreement_bound, max_err, scale_of

from .settings import BenchError
from .timing import Sampling, sample, summarize

if TYPE_CHECKING:
    from vit_fast.model.vit import VisionTransformer

#: a mix of common photo shapes at ViT-B/16's scale (landscape, portrait, square, small): 8 images
DEFAULT_SIZES: tuple[tuple[int, int], ...] = (
    (224, 224),
    (160, 224),
    (224, 160),
    (128, 128),
    (224, 112),
    (96, 160),
    (192, 144),
    (64, 96),
)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"224x224,160x256"`` -> ``[(224, 224), (160, 256)]`` (height x width in pixels)."""
    sizes = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)x(\d+)\s*", part)
        if not match:
            raise BenchError(f"image sizes are HxW pairs, comma-separated (e.g. 224x224,160x256), got {part!r}")
        sizes.append((int(match.group(1)), int(match.group(2))))
    return sizes


def random_sizes(count: int, patch: int, low: int, high: int, seed: int) -> list[tuple[int, int]]:
    """``count`` sizes with each side a multiple of ``patch`` in ``low..high`` pixels, seeded."""
    if count < 1 or not patch <= low <= high:
        raise BenchError(f"need count >= 1 and patch <= low <= high, got {count}, {patch}, {low}, {high}")
    rng = random.Random(seed)
    sides = list(range(-(-low // patch) * patch, high + 1, patch))
    if not sides:
        raise BenchError(f"no multiple of the patch size {patch} lies in {low}..{high} pixels")
    return [(rng.choice(sides), rng.choice(sides)) for _ in range(count)]


def token_counts(model: VisionTransformer, sizes: Sequence[tuple[int, int]]) -> dict[str, int]:
    """Tokens and attention (query, key) pairs per block, packed and padded, of images of ``sizes``."""
    p, prefix = model.cfg.patch_size, model.num_prefix_tokens
    tokens = [prefix + (h // p) * (w // p) for h, w in sizes]
    longest = prefix + (max(h for h, _ in sizes) // p) * (max(w for _, w in sizes) // p)
    return {
        "packed_tokens": sum(tokens),
        "padded_tokens": len(sizes) * longest,
        "packed_attention_pairs": sum(t * t for t in tokens),
        "padded_attention_pairs": len(sizes) * longest * longest,
    }


def padded_batch(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[N, C, H_max, W_max]``: each image at the top left, zeros elsewhere."""
    height, width = max(image.shape[1] for image in images), max(image.shape[2] for image in images)
    first = images[0]
    batch = first.new_zeros(len(images), first.shape[0], height, width)
    for i, image in enumerate(images):
        batch[i, :, : image.shape[1], : image.shape[2]] = image
    return batch


def run_mixed_sizes(
    model: VisionTransformer,
    sizes: Sequence[tuple[int, int]],
    *,
    sampling: Sampling,
    seed: int = 0,
) -> dict[str, Any]:
    """Time the packed and the padded forward of random images of ``sizes`` on ``model`` (its device, dtype and
    backend); returns ``{"rows": [packed, padded], "ratios": ..., ...}``. Each row: median / p10 / p90 ms per
    forward, images/s and tokens/s from the median, tokens and attention pairs computed, the sample count."""
    if not model.cfg.dynamic_img_size and any(tuple(s) != model.cfg.img_hw for s in sizes):
        raise BenchError(
            "images of different sizes need a model built with dynamic_img_size=True (or a preset's config with "
            "that override)"
        )
    device, dtype = model.device, model.dtype
    gen = torch.Generator().manual_seed(seed)
    images = [torch.randn(model.cfg.in_chans, h, w, generator=gen).to(device, dtype) for h, w in sizes]
    padded = padded_batch(images)
    counts = token_counts(model, sizes)
    with torch.no_grad():
        packed_out = model.forward_packed(images)  # checks the images before any timing
        alone = torch.cat([model(image[None]) for image in images])
    err, limit = max_err(packed_out, alone), agreement_bound(dtype, scale_of(alone))
    if not err <= limit:
        raise BenchError(
            f"the packed forward differs from each image's forward alone by {err:.3g} (at most {limit:.3g} allowed): "
            "not timed"
        )
    calls = {"packed": lambda: model.forward_packed(images), "padded": lambda: model(padded)}
    rows = []
    with torch.no_grad():
        for mode, call in calls.items():
            start = time.perf_counter()
            times, why = sample(call, device, sampling)
            stats = summarize(times)
            tokens = counts[f"{mode}_tokens"]
            rows.append(
                {
                    "mode": mode,
                    "images": len(sizes),
                    "tokens": tokens,
                    "attention_pairs_per_block": counts[f"{mode}_attention_pairs"],
                    **stats,
                    "images_per_s": len(sizes) / (stats["median_ms"] / 1e3),
                    "tokens_per_s": tokens / (stats["median_ms"] / 1e3),
                    "stopped_by": why,
                    "wall_s": time.perf_counter() - start,
                }
            )
    packed, padded_row = rows
    return {
        "sizes": [f"{h}x{w}" for h, w in sizes],
        "padded_to": f"{padded.shape[2]}x{padded.shape[3]}",
        "max_abs_err_vs_alone": err,
        "rows": rows,
        "ratios": {
            "padded_over_packed_tokens": padded_row["tokens"] / packed["tokens"],
            "padded_over_packed_attention_pairs": padded_row["attention_pairs_per_block"]
            / packed["attention_pairs_per_block"],
            "packed_speedup_median": padded_row["median_ms"] / packed["median_ms"],
        },
    }


def format_result(result: dict[str, Any]) -> str:
    """The result as a small text table."""
    lines = [
        f"images: {', '.join(result['sizes'])} (padded to {result['padded_to']}); packed vs each image alone: "
        f"max|err| {result['max_abs_err_vs_alone']:.2e}",
        f"{'mode':<8} {'tokens':>8} {'attn pairs':>11} {'median ms':>10} {'p10':>8} {'p90':>8} {'img/s':>8} {'n':>5}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['mode']:<8} {r['tokens']:>8} {r['attention_pairs_per_block']:>11} {r['median_ms']:>10.2f} "
            f"{r['p10_ms']:>8.2f} {r['p90_ms']:>8.2f} {r['images_per_s']:>8.1f} {r['n']:>5}"
        )
    ratios = result["ratios"]
    lines.append(
        f"padded / packed: tokens {ratios['padded_over_packed_tokens']:.2f}x, attention pairs "
        f"{ratios['padded_over_packed_attention_pairs']:.2f}x, median time {ratios['packed_speedup_median']:.2f}x"
    )
    return "\n".join(lines)


__all__ = ["DEFAULT_SIZES", "format_result", "padded_batch", "parse_sizes", "random_sizes", "run_mixed_sizes"]
