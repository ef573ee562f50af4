"""Host side of the fused preprocessing kernel: the antialiased resampling taps (PIL's and torchvision's
``antialias=True`` filters, support scaled by ``max(1, in / out)``, weights normalised per output pixel) for only the
rows and columns the centre crop keeps, packed for a batch of images of different sizes. Design: docs/kernels.md,
section "Fused preprocessing"."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch

#: interpolation -> the filter's support (in source pixels, before scaling) for PIL / torchvision's antialiased resize
SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}
#: the cubic convolution coefficient of PIL's BICUBIC and torchvision's antialiased bicubic
CUBIC_A = -0.5
#: PIL's 8-bit resize: weights in fixed point with this many fraction bits (Resample.c, ``PRECISION_BITS``)
PRECISION_BITS = 22


def _filter(x: torch.Tensor, interpolation: str) -> torch.Tensor:
    x = x.abs()
    if interpolation == "bilinear":
        return (1.0 - x).clamp(min=0.0)
    a = CUBIC_A
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))


class Taps(NamedTuple):
    """The taps of ``count`` output pixels along one axis: ``start [count]`` the first source pixel, ``taps [count]``
    how many follow, ``weight [count, K]`` float64, normalised to sum 1, zero past each pixel's taps."""

    start: torch.Tensor
    taps: torch.Tensor
    weight: torch.Tensor


def axis_taps(in_size: int, out_size: int, first: int, count: int, interpolation: str) -> Taps:
    """Output pixels ``first .. first + count - 1`` of a resize from ``in_size`` to ``out_size`` pixels, as PIL's
    ``precompute_coeffs`` and aten's ``_compute_indices_min_size_weights_aa`` compute them (centre
    ``(i + 0.5) * in / out``, support ``SUPPORT * max(1, in / out)``, taps clipped to the image, then normalised)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = SUPPORT[interpolation] * filterscale
    centre = (torch.arange(first, first + count, dtype=torch.float64) + 0.5) * scale
    # C's (int) truncates toward zero, as torch.trunc does
    start = torch.trunc(centre - support + 0.5).clamp(min=0).long()
    stop = torch.trunc(centre + support + 0.5).clamp(max=in_size).long()
    taps = stop - start
    k = torch.arange(int(taps.max()), dtype=torch.float64)
    weight = _filter((k[None, :] + start[:, None] - centre[:, None] + 0.5) / filterscale, interpolation)
    weight = torch.where(k[None, :] < taps[:, None], weight, 0.0)
    weight = weight / weight.sum(1, keepdim=True)
    return Taps(start, taps, weight)


def fixed_point(weight: torch.Tensor) -> torch.Tensor:
    """Weights as PIL's 8-bit resize holds them (``normalize_coeffs_8bpc``): ``w * 2**22`` rounded half away from
    zero, as float64 integers (each below 2**24: exact in float32 too)."""
    scaled = weight * float(1 << PRECISION_BITS)
    return torch.trunc(scaled + torch.where(scaled < 0, -0.5, 0.5))


def pillow_vertical_first(source: tuple[int, int], size: tuple[int, int]) -> bool:
    """Whether Pillow (13) resizes ``source`` (H, W) to ``size`` (H, W) height first: where the height shrinks by
    more than twice as many pixels as the width does. Older Pillows take the width first. docs/usage.md, "Images in:
    image_transform"."""
    (h, w), (oh, ow) = source, size
    return oh < h and 2 * (w - ow) < h - oh


#: how a centre crop's offset is rounded: torchvision's ``round`` (timm) or transformers' ``floor``
CROP_ROUNDING = ("round", "floor")


def crop_start(size: int, crop: int, rounding: str = "round") -> int:
    """The centre crop's offset: torchvision's ``int(round((size - crop) / 2.0))``, or ``(size - crop) // 2``
    (``rounding="floor"``, transformers' image processors)."""
    return (size - crop) // 2 if rounding == "floor" else int(round((size - crop) / 2.0))


@functools.lru_cache(maxsize=256)
def image_taps(
    height: int,
    width: int,
    resize: tuple[int, int],
    crop: tuple[int, int],
    interpolation: str,
    crop_rounding: str = "round",
) -> tuple[Taps, Taps]:
    """Row and column taps of one ``height x width`` image resized to ``resize`` (H, W) and centre-cropped to
    ``crop`` (H, W): only the kept rows and columns. Cached per size (CPU tensors; never modified)."""
    rows = axis_taps(height, resize[0], crop_start(resize[0], crop[0], crop_rounding), crop[0], interpolation)
    cols = axis_taps(width, resize[1], crop_start(resize[1], crop[1], crop_rounding), crop[1], interpolation)
    return rows, cols


class PackedBatch(NamedTuple):
    """A batch of images as the kernel reads it (all int tables int32 but ``images``; weights float64 here, the
    launcher casts them; PIL's fixed point with ``uint8_passes``): pixels of every image, flat; ``images [B, 4]``
    int64 (offset in ``pixels``, height, width, 1 where the height pass comes first); ``row_start``, ``row_stop [B * crop_h]``; ``row_weight [B * crop_h, KY]`` (tap k reads row
    ``row_start + k``); ``col_index``, ``col_weight [B * crop_w, KX]`` (padded taps: a valid column, weight 0)."""

    pixels: torch.Tensor
    images: torch.Tensor
    row_start: torch.Tensor
    row_stop: torch.Tensor
    row_weight: torch.Tensor
    col_index: torch.Tensor
    col_weight: torch.Tensor


def _pad(weight: torch.Tensor, k: int) -> torch.Tensor:
    return torch.nn.functional.pad(weight, (0, k - weight.shape[1]))


def per_image(resize, count: int) -> list[tuple[int, int]]:
    """``resize`` as one (H, W) per image: a single (H, W) pair is every image's."""
    if len(resize) == 2 and all(isinstance(v, int) for v in resize):
        return [(int(resize[0]), int(resize[1]))] * count
    return [(int(h), int(w)) for h, w in resize]


def pack(
    images: Sequence[torch.Tensor],
    resize,
    crop: tuple[int, int],
    interpolation: str,
    crop_rounding: str = "round",
    uint8_passes: bool = False,
) -> PackedBatch:
    """The :class:`PackedBatch` of ``images`` (uint8 ``[H_i, W_i, 3]``, checked by the caller), its tables on the
    images' device; ``resize``: one (H, W) for all, or one per image; ``uint8_passes``: weights in PIL's fixed point,
    each image's pass order Pillow's. The pixels are copied once into one flat buffer (one launch for any sizes)."""
    device = images[0].device
    resizes = per_image(resize, len(images))
    taps = [
        image_taps(int(im.shape[0]), int(im.shape[1]), size, crop, interpolation, crop_rounding)
        for im, size in zip(images, resizes, strict=True)
    ]
    ky = max(int(r.weight.shape[1]) for r, _ in taps)
    kx = max(int(c.weight.shape[1]) for _, c in taps)
    sizes = [im.numel() for im in images]
    offsets = [0, *itertools.accumulate(sizes)][:-1]
    rows_table = []
    for o, im, size in zip(offsets, images, resizes, strict=True):
        source = (int(im.shape[0]), int(im.shape[1]))
        rows_table.append([o, *source, int(uint8_passes and pillow_vertical_first(source, size))])
    table = torch.tensor(rows_table, dtype=torch.int64)
    row_start = torch.cat([r.start for r, _ in taps])
    row_stop = torch.cat([r.start + r.taps for r, _ in taps])
    row_weight = torch.cat([_pad(r.weight, ky) for r, _ in taps])
    j = torch.arange(kx)
    col_index = torch.cat([torch.where(j < c.taps[:, None], c.start[:, None] + j, c.start[:, None]) for _, c in taps])
    col_weight = torch.cat([_pad(c.weight, kx) for _, c in taps])
    if uint8_passes:
        row_weight, col_weight = fixed_point(row_weight), fixed_point(col_weight)
    pixels = torch.cat([im.reshape(-1) for im in images]) if len(images) > 1 else images[0].reshape(-1)
    ints = (table, row_start.int(), row_stop.int())
    return PackedBatch(
        pixels,
        *(t.to(device) for t in ints),
        row_weight.to(device),
        col_index.int().to(device),
        col_weight.to(device),
    )


__all__ = [
    "CROP_ROUNDING",
    "CUBIC_A",
    "PRECISION_BITS",
    "SUPPORT",
    "PackedBatch",
    "Taps",
    "axis_taps",
    "crop_start",
    "fixed_point",
    "image_taps",
    "pack",
    "per_image",
    "pillow_vertical_first",
]
