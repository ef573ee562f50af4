"""The fused preprocessing kernel's input checks (:mod:`.preprocess`): a clear error, before any launch, for what the
kernel cannot take."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .launches import SUPPORTED_DTYPES
from .preprocess_weights import CROP_ROUNDING, SUPPORT


def _pair(name: str, value) -> tuple[int, int]:
    if (
        not isinstance(value, Sequence)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ValueError(f"preprocess: {name} must be (height, width), two positive ints, got {value!r}")
    return int(value[0]), int(value[1])


def _channel_stats(name: str, value) -> tuple[float, float, float]:
    if not isinstance(value, Sequence) or len(value) != 3 or not all(isinstance(v, (int, float)) for v in value):
        raise ValueError(f"preprocess: {name} must be 3 numbers (one per channel, in 0..1 units), got {value!r}")
    return float(value[0]), float(value[1]), float(value[2])


def _resizes(value, count: int) -> list[tuple[int, int]]:
    """``resize``: one (H, W) for every image, or a list of ``count`` of them (one per image)."""
    if isinstance(value, Sequence) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return [_pair("resize", value)] * count
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != count:
        raise ValueError(
            f"preprocess: resize must be one (height, width) for all images or a list of {count} (one per image), "
            f"got {value!r}"
        )
    return [_pair(f"resize[{i}]", v) for i, v in enumerate(value)]


def check_preprocess_inputs(
    images, resize, crop, interpolation: str, mean, std, out_dtype: torch.dtype, crop_rounding: str = "round"
) -> tuple[list[tuple[int, int]], tuple[int, int], tuple[float, ...], tuple[float, ...]]:
    """Raise a clear error, before any launch, for inputs the kernel cannot take (the device aside: the reference
    runs anywhere); returns ``(resizes, crop, mean, std)``: one (H, W) per image, then plain tuples."""
    if isinstance(images, torch.Tensor) or not isinstance(images, Sequence):
        raise TypeError(
            f"preprocess: images must be a list of uint8 [H, W, 3] tensors, got {type(images).__name__}: "
            "pass list(batch) for a stacked batch"
        )
    if not images:
        raise ValueError("preprocess: images is empty: pass at least one uint8 [H, W, 3] image")
    for i, im in enumerate(images):
        if not isinstance(im, torch.Tensor):
            raise TypeError(f"preprocess: images[{i}] is a {type(im).__name__}, not a torch.Tensor")
        if im.dtype != torch.uint8:
            raise TypeError(
                f"preprocess: images[{i}] has dtype {im.dtype}; the kernel takes decoded uint8 pixels (0..255)"
            )
        if im.dim() != 3 or im.shape[2] != 3:
            raise ValueError(
                f"preprocess: images[{i}] has shape {tuple(im.shape)}; it must be HWC with 3 channels, [H, W, 3] "
                "(convert grayscale / RGBA to RGB, and permute(1, 2, 0) a CHW image)"
            )
        if im.shape[0] == 0 or im.shape[1] == 0:
            raise ValueError(f"preprocess: images[{i}] is empty ({tuple(im.shape)})")
        if im.device != images[0].device:
            raise ValueError(f"preprocess: images[{i}] is on {im.device} but images[0] on {images[0].device}")
    resizes, crop = _resizes(resize, len(images)), _pair("crop", crop)
    for i, size in enumerate(resizes):
        if crop[0] > size[0] or crop[1] > size[1]:
            which = "" if len(set(resizes)) == 1 else f" (image {i})"
            raise ValueError(f"preprocess: crop {crop} is larger than resize {size}{which}: the crop must fit in it")
    if crop_rounding not in CROP_ROUNDING:
        raise ValueError(f"preprocess: crop_rounding {crop_rounding!r}: choose one of {', '.join(CROP_ROUNDING)}")
    if interpolation not in SUPPORT:
        raise ValueError(f"preprocess: unknown interpolation {interpolation!r}; choose one of {sorted(SUPPORT)}")
    mean, std = _channel_stats("mean", mean), _channel_stats("std", std)
    if not all(s > 0 for s in std):
        raise ValueError(f"preprocess: std must be positive, got {std}")
    if out_dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"preprocess: out_dtype {out_dtype} is not one of float32, float16, bfloat16")
    return resizes, crop, mean, std
