"""Fused image preprocessing: uint8 HWC images at their decoded sizes to the model's input ``[B, 3, crop_h, crop_w]``
in one launch (antialiased bilinear / bicubic resize as PIL and torchvision compute it, centre crop, ``/ 255``, mean
and std): the kernel, the launcher :func:`launch_preprocess`, the ``torch.library`` op, the public :func:`preprocess`
and the eager reference :func:`preprocess_ref`. Taps and packing in :mod:`.preprocess_weights`, checks in
:mod:`.preprocess_checks`, tiles in :mod:`.preprocess_tiles`; design: docs/kernels.md, "Fused preprocessing"."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from vit_fast.base.cards import tensor_arch

from ._launch import SelfCheck, cdiv, check_device, define_op, interpret_bf16
from ._tl import to_bf16_rtne
from .autotune import autotune_cache_enabled, tune_key
from .launches import ResolvedLaunches
from .preprocess_checks import check_preprocess_inputs
from .preprocess_tiles import preprocess_configs, prune_preprocess_configs
from .preprocess_weights import PRECISION_BITS, PackedBatch, pack


@triton.jit
def _clip8(acc):
    """A PIL 8-bit pass's store: fixed-point ``acc`` (int32, 22 fraction bits) rounded half up and clipped to
    0..255 (Resample.c's ``clip8``), as float32."""
    return tl.minimum(tl.maximum(acc + (1 << 21), 0) >> 22, 255).to(tl.float32)  # >> on a non-negative: any shift


@triton.autotune(
    configs=preprocess_configs(),
    key=["crop_h", "crop_w", "taps_y", "taps_x", "ARCH", "TUNE", "ROUND_BF16", "UINT8_PASSES"],
    prune_configs_by={"early_config_prune": prune_preprocess_configs},
    cache_results=autotune_cache_enabled(),
)
@triton.jit(do_not_specialize=["ARCH", "TUNE"])  # key-only: one compile whatever their values
def _preprocess_kernel(
    src_ptr,  # uint8 pixels of every image, each [H_i, W_i, 3] contiguous, one after another
    images_ptr,  # [B, 4] int64: offset of image b in src, its height, its width, 1: height pass first
    row_start_ptr,  # [B * crop_h] int32: first source row of output row oy of image b (index b * crop_h + oy)
    row_stop_ptr,  # [B * crop_h] int32: one past its last source row
    row_weight_ptr,  # [B * crop_h, taps_y] fp32: weight of source row row_start + k, 0 past the row's taps
    col_index_ptr,  # [B * crop_w, taps_x] int32: source column of each tap (padded taps: a valid column)
    col_weight_ptr,  # [B * crop_w, taps_x] fp32: its weight (padded taps: 0)
    out_ptr,  # [B, 3, crop_h, crop_w] out, contiguous
    crop_h,  # output rows per image
    crop_w,  # output columns per image
    taps_y,  # row taps per output row (the batch's most)
    taps_x,  # column taps per output column (the batch's most)
    plane,  # crop_h * crop_w: elements between output channels
    scale0,  # 1 / (255 * std[0]) (/ 2**22 with UINT8_PASSES): the red channel's scale; likewise below
    scale1,
    scale2,
    shift0,  # -mean[0] / std[0]: the red channel's shift; likewise below
    shift1,
    shift2,
    ARCH,  # compute capability of the tensors' device (cards.tensor_arch), never read: an autotune key
    TUNE,  # autotune.tune_key(): 1 while tuning, never read: a heuristic pick never answers a tuned request
    ROUND_BF16: tl.constexpr,  # round bf16 stores by hand (interpreter: its fp32 -> bf16 cast truncates)
    UINT8_PASSES: tl.constexpr,  # PIL's uint8 resize: weights in fixed point, first pass clip8-ed, Pillow's order
    BLOCK_Y: tl.constexpr,  # output rows per program
    BLOCK_X: tl.constexpr,  # output columns per program
):
    pid_x = tl.program_id(0)
    pid_y = tl.program_id(1)
    b = tl.program_id(2)
    oy = pid_y * BLOCK_Y + tl.arange(0, BLOCK_Y)
    ox = pid_x * BLOCK_X + tl.arange(0, BLOCK_X)
    row_ok = oy < crop_h
    col_ok = ox < crop_w
    ty = b * crop_h + oy
    tx = b * crop_w + ox
    y0 = tl.load(row_start_ptr + ty, mask=row_ok, other=2147483647)
    y1 = tl.load(row_stop_ptr + ty, mask=row_ok, other=0)
    # the source rows any of this block's output rows reads: each is filtered horizontally once, for all of them
    lo = tl.min(y0, axis=0)
    hi = tl.max(y1, axis=0)
    base = tl.load(images_ptr + b * 4)
    row_stride = tl.load(images_ptr + b * 4 + 2) * 3
    if UINT8_PASSES:
        height_first = tl.load(images_ptr + b * 4 + 3)
    else:  # a float resize: the order does not matter, and the float kernel compiles without that branch
        height_first = 0
    acc0 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float32)
    if height_first != 0:
        # Pillow's height pass first: per column tap, the block's rows filtered vertically in exact integers and
        # clip8-ed, then weighted into the output (Pillow takes this order only where the width shrinks little)
        for j in range(0, taps_x):
            xi = tl.load(col_index_ptr + tx * taps_x + j, mask=col_ok, other=0)
            wx = tl.load(col_weight_ptr + tx * taps_x + j, mask=col_ok, other=0.0)
            v0 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.int32)
            v1 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.int32)
            v2 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.int32)
            for r in range(lo, hi):
                pixel = src_ptr + base + r * row_stride + xi * 3
                k = r - y0
                wy = tl.load(row_weight_ptr + ty * taps_y + k, mask=row_ok & (k >= 0) & (k < taps_y), other=0.0)
                wy = wy.to(tl.int32)[:, None]
                v0 += wy * tl.load(pixel, mask=col_ok, other=0).to(tl.int32)[None, :]
                v1 += wy * tl.load(pixel + 1, mask=col_ok, other=0).to(tl.int32)[None, :]
                v2 += wy * tl.load(pixel + 2, mask=col_ok, other=0).to(tl.int32)[None, :]
            acc0 += wx[None, :] * _clip8(v0)
            acc1 += wx[None, :] * _clip8(v1)
            acc2 += wx[None, :] * _clip8(v2)
    else:
        for r in range(lo, hi):
            row = src_ptr + base + r * row_stride  # row_stride is int64 (loaded from images)
            if UINT8_PASSES:  # the width pass in PIL's exact integers, clip8-ed as Pillow stores it
                n0 = tl.zeros((BLOCK_X,), dtype=tl.int32)
                n1 = tl.zeros((BLOCK_X,), dtype=tl.int32)
                n2 = tl.zeros((BLOCK_X,), dtype=tl.int32)
                for j in range(0, taps_x):
                    xi = tl.load(col_index_ptr + tx * taps_x + j, mask=col_ok, other=0)
                    wx = tl.load(col_weight_ptr + tx * taps_x + j, mask=col_ok, other=0.0).to(tl.int32)
                    pixel = row + xi * 3
                    n0 += wx * tl.load(pixel, mask=col_ok, other=0).to(tl.int32)
                    n1 += wx * tl.load(pixel + 1, mask=col_ok, other=0).to(tl.int32)
                    n2 += wx * tl.load(pixel + 2, mask=col_ok, other=0).to(tl.int32)
                h0 = _clip8(n0)
                h1 = _clip8(n1)
                h2 = _clip8(n2)
            else:
                h0 = tl.zeros((BLOCK_X,), dtype=tl.float32)
                h1 = tl.zeros((BLOCK_X,), dtype=tl.float32)
                h2 = tl.zeros((BLOCK_X,), dtype=tl.float32)
                for j in range(0, taps_x):
                    xi = tl.load(col_index_ptr + tx * taps_x + j, mask=col_ok, other=0)
                    wx = tl.load(col_weight_ptr + tx * taps_x + j, mask=col_ok, other=0.0)
                    pixel = row + xi * 3
                    h0 += wx * tl.load(pixel, mask=col_ok, other=0).to(tl.float32)
                    h1 += wx * tl.load(pixel + 1, mask=col_ok, other=0).to(tl.float32)
                    h2 += wx * tl.load(pixel + 2, mask=col_ok, other=0).to(tl.float32)
            # this source row's weight in each output row: 0 where it is not among that row's taps
            k = r - y0
            wy = tl.load(row_weight_ptr + ty * taps_y + k, mask=row_ok & (k >= 0) & (k < taps_y), other=0.0)
            acc0 += wy[:, None] * h0[None, :]
            acc1 += wy[:, None] * h1[None, :]
            acc2 += wy[:, None] * h2[None, :]
    if UINT8_PASSES:  # the second pass clipped to 0..255 (in fixed point), as Pillow's uint8 store clips it
        acc0 = tl.minimum(tl.maximum(acc0, 0.0), 255.0 * 4194304.0)
        acc1 = tl.minimum(tl.maximum(acc1, 0.0), 255.0 * 4194304.0)
        acc2 = tl.minimum(tl.maximum(acc2, 0.0), 255.0 * 4194304.0)
    out_mask = row_ok[:, None] & col_ok[None, :]
    at = out_ptr + (b * 3).to(tl.int64) * plane + oy[:, None] * crop_w + ox[None, :]
    red = acc0 * scale0 + shift0
    green = acc1 * scale1 + shift1
    blue = acc2 * scale2 + shift2
    if ROUND_BF16:
        tl.store(at, to_bf16_rtne(red), mask=out_mask)
        tl.store(at + plane, to_bf16_rtne(green), mask=out_mask)
        tl.store(at + 2 * plane, to_bf16_rtne(blue), mask=out_mask)
    else:
        tl.store(at, red.to(out_ptr.dtype.element_ty), mask=out_mask)
        tl.store(at + plane, green.to(out_ptr.dtype.element_ty), mask=out_mask)
        tl.store(at + 2 * plane, blue.to(out_ptr.dtype.element_ty), mask=out_mask)


_preprocess_launches = ResolvedLaunches(_preprocess_kernel)


# ---------------------------------------------------------------------------------- launcher
def launch_packed(
    batch: PackedBatch,
    crop: tuple[int, int],
    mean,
    std,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
    uint8_passes: bool = False,
) -> torch.Tensor:
    """Run the kernel once on a :class:`~.preprocess_weights.PackedBatch` (fp32 weights; packed with the same
    ``uint8_passes``); returns ``[B, 3, crop_h, crop_w]`` in ``out_dtype`` (into ``out``: tests pass a NaN-filled one)."""
    B, (ch, cw) = batch.images.shape[0], crop
    shape = (B, 3, ch, cw)
    if out is None:
        out = torch.empty(shape, dtype=out_dtype, device=batch.pixels.device)
    elif tuple(out.shape) != shape or out.dtype != out_dtype or out.device != batch.pixels.device:
        raise ValueError(f"preprocess: out must be {list(shape)} {out_dtype} on {batch.pixels.device}")
    elif not out.is_contiguous():
        raise ValueError("preprocess: out must be contiguous")
    taps_y, taps_x = batch.row_weight.shape[1], batch.col_weight.shape[1]
    unit = 255.0 * (1 << PRECISION_BITS) if uint8_passes else 255.0  # fixed-point weights carry 2**22

    def grid(meta):
        return (cdiv(cw, meta["BLOCK_X"]), cdiv(ch, meta["BLOCK_Y"]), B)

    _preprocess_launches(
        grid,
        (B,),
        *batch,
        out,
        ch,
        cw,
        taps_y,
        taps_x,
        ch * cw,
        *(1.0 / (unit * s) for s in std),
        *(-m / s for m, s in zip(mean, std, strict=True)),
        tensor_arch(batch.pixels),
        tune_key(),
        ROUND_BF16=interpret_bf16(out_dtype),
        UINT8_PASSES=bool(uint8_passes),
    )
    return out


def _pack_for_kernel(images, resize, crop, interpolation, crop_rounding="round", uint8_passes=False) -> PackedBatch:
    batch = pack(images, resize, crop, interpolation, crop_rounding, uint8_passes)
    return batch._replace(row_weight=batch.row_weight.float(), col_weight=batch.col_weight.float())


def launch_preprocess(
    images: Sequence[torch.Tensor],
    *,
    resize: tuple[int, int],
    crop: tuple[int, int],
    interpolation: str,
    mean: Sequence[float],
    std: Sequence[float],
    out_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    checked: bool = False,
    crop_rounding: str = "round",
    uint8_passes: bool = False,
) -> torch.Tensor:
    """Check, pack (:func:`~.preprocess_weights.pack`) and launch once (no custom op); ``out`` as
    :func:`launch_packed`. ``checked=True`` skips the checks (``tools/compile_check.py``'s recorded launches)."""
    if not checked:
        resize, crop, mean, std = check_preprocess_inputs(
            images, resize, crop, interpolation, mean, std, out_dtype, crop_rounding
        )
        check_device("preprocess", images[0])
    batch = _pack_for_kernel(images, resize, crop, interpolation, crop_rounding, uint8_passes)
    return launch_packed(batch, crop, mean, std, out_dtype, out, uint8_passes)


# ---------------------------------------------------------------------------------- custom op
def _check_packed(pixels, images, row_start, row_stop, row_weight, col_index, col_weight, crop_h, crop_w, *_) -> None:
    """The op's own inputs (the tables :func:`preprocess` packed): dtypes, shapes and one device."""
    tables = (("images", images, torch.int64, 2), ("row_start", row_start, torch.int32, 1))
    tables += (("row_stop", row_stop, torch.int32, 1), ("row_weight", row_weight, torch.float32, 2))
    tables += (("col_index", col_index, torch.int32, 2), ("col_weight", col_weight, torch.float32, 2))
    if pixels.dtype != torch.uint8 or pixels.dim() != 1:
        raise TypeError(f"preprocess: pixels must be flat uint8, got {pixels.dtype} {tuple(pixels.shape)}")
    for name, t, dtype, dim in tables:
        if t.dtype != dtype or t.dim() != dim or t.device != pixels.device:
            raise ValueError(
                f"preprocess: {name} must be {dim}-d {dtype} on {pixels.device}, got {t.dtype} {t.dim()}-d"
            )
    B = images.shape[0]
    rows = (row_start.shape[0], row_stop.shape[0], row_weight.shape[0])
    cols = (col_index.shape, col_weight.shape[0])
    if images.shape[1] != 4 or rows != (B * crop_h,) * 3 or cols != (col_weight.shape, B * crop_w):
        raise ValueError(f"preprocess: tables do not match {B} images cropped to {crop_h}x{crop_w}")
    check_device("preprocess", pixels)


def _preprocess_op(
    pixels: torch.Tensor,
    images: torch.Tensor,
    row_start: torch.Tensor,
    row_stop: torch.Tensor,
    row_weight: torch.Tensor,
    col_index: torch.Tensor,
    col_weight: torch.Tensor,
    crop_h: int,
    crop_w: int,
    mean: list[float],
    std: list[float],
    out_dtype: torch.dtype,
    uint8_passes: bool,
) -> torch.Tensor:
    batch = PackedBatch(pixels, images, row_start, row_stop, row_weight, col_index, col_weight)
    return launch_packed(batch, (crop_h, crop_w), mean, std, out_dtype, uint8_passes=uint8_passes)


def _packed_ref(*args) -> torch.Tensor:
    *tables, crop_h, crop_w, mean, std, out_dtype, uint8_passes = args
    return packed_ref(PackedBatch(*tables), (crop_h, crop_w), mean, std, out_dtype, uint8_passes=uint8_passes)


def _selfcheck_cases(m: dict) -> list[tuple[str, dict]]:
    """What predict and serve run before a 3-channel model's forward: decoded images of odd sizes, downscaled
    (antialiased) and centre-cropped to the model's input."""
    if m["chans"] != 3:
        return []
    height, width = m["height"], m["width"]
    src = (height * 9 // 7 + 1, width * 4 // 3 + 3)
    resize = (height * 8 // 7, width * 8 // 7)
    pre = dict(batch=m["batch"], src=src, resize=resize, crop=(height, width), interpolation="bicubic")
    return [("image preprocessing", pre)]


def _selfcheck_inputs(d: dict, rnd, gen: torch.Generator, device, dtype: torch.dtype) -> tuple[tuple, dict]:
    h, w = d["src"]  # each image a little larger than the last: sizes differ within one launch
    images = [
        torch.randint(0, 256, (h + i, w + 2 * i, 3), generator=gen, dtype=torch.uint8).to(device)
        for i in range(d["batch"])
    ]
    norm = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    crop = dict(resize=d["resize"], crop=d["crop"], interpolation=d["interpolation"])
    return (images,), dict(**crop, **norm, out_dtype=dtype)


_preprocess = define_op(
    _preprocess_op,
    check=_check_packed,
    empty=lambda pixels, images, *rest: pixels.new_empty((images.shape[0], 3, rest[5], rest[6]), dtype=rest[9]),
    reference=_packed_ref,
    selfcheck=SelfCheck(
        cases=_selfcheck_cases,
        inputs=_selfcheck_inputs,
        launch=lambda d, args, kwargs, poisoned: launch_preprocess(
            args[0], **kwargs, out=poisoned(len(args[0]), 3, *d["crop"])
        ),
        shape=lambda d: (
            f"{d['batch']} uint8 images from [{d['src'][0]}, {d['src'][1]}, 3] -> "
            f"[{d['batch']}, 3, {d['crop'][0]}, {d['crop'][1]}]"
        ),
    ),
)


def preprocess(
    images: list[torch.Tensor],
    *,
    resize: tuple[int, int] | Sequence[tuple[int, int]],
    crop: tuple[int, int],
    interpolation: str,
    mean: Sequence[float],
    std: Sequence[float],
    out_dtype: torch.dtype = torch.float32,
    crop_rounding: str = "round",
    uint8_passes: bool = False,
) -> torch.Tensor:
    """uint8 ``[H_i, W_i, 3]`` images (sizes may differ) to ``[B, 3, crop_h, crop_w]``: resized to ``resize`` (H, W;
    or one per image) with PIL's antialiased ``interpolation`` ("bilinear" | "bicubic"; ``uint8_passes``: as PIL's
    uint8 resize, in its pass order), centre ``crop`` (offsets ``crop_rounding`` "round" | "floor"), ``(x / 255 -
    mean) / std``; one launch (op ``vit_fast::preprocess``). docs/kernels.md, "Fused preprocessing"."""
    resize, crop, mean, std = check_preprocess_inputs(
        images, resize, crop, interpolation, mean, std, out_dtype, crop_rounding
    )
    check_device("preprocess", images[0])
    batch = _pack_for_kernel(images, resize, crop, interpolation, crop_rounding, uint8_passes)
    return _preprocess(*batch, crop[0], crop[1], list(mean), list(std), out_dtype, bool(uint8_passes))


# ---------------------------------------------------------------------------------- reference
def packed_ref(
    batch: PackedBatch,
    crop: tuple[int, int],
    mean,
    std,
    out_dtype: torch.dtype,
    compute_dtype=torch.float32,
    uint8_passes: bool = False,
) -> torch.Tensor:
    """Eager PyTorch on a packed batch: each image's dense row and column weight matrices (from the tap tables) on
    both sides of its pixels in ``compute_dtype`` (``uint8_passes``: :func:`_uint8_passes`), then ``/ 255``, mean
    and std; cast to ``out_dtype``."""
    ch, cw = crop
    outs = []
    for b, (offset, height, width, height_first) in enumerate(batch.images.tolist()):
        img = batch.pixels[offset : offset + height * width * 3].view(height, width, 3).to(compute_dtype)
        rows = slice(b * ch, (b + 1) * ch)
        k = torch.arange(batch.row_weight.shape[1], device=img.device)
        index = (batch.row_start[rows, None].long() + k).clamp(max=height - 1)
        wy = img.new_zeros(ch, height).scatter_add_(1, index, batch.row_weight[rows].to(compute_dtype))
        cols = slice(b * cw, (b + 1) * cw)
        wx = img.new_zeros(cw, width).scatter_add_(
            1, batch.col_index[cols].long(), batch.col_weight[cols].to(compute_dtype)
        )
        if uint8_passes:
            pixels = batch.pixels[offset : offset + height * width * 3].view(height, width, 3)
            outs.append(_uint8_passes(pixels, wy, wx, bool(height_first)))
        else:
            outs.append(torch.einsum("yh,hwc,xw->cyx", wy, img, wx))
    x = torch.stack(outs) / 255.0
    m = torch.tensor(mean, dtype=compute_dtype, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=compute_dtype, device=x.device).view(1, 3, 1, 1)
    return ((x - m) / s).to(out_dtype)


def _uint8_passes(pixels: torch.Tensor, wy: torch.Tensor, wx: torch.Tensor, height_first: bool) -> torch.Tensor:
    """PIL's uint8 resize of ``pixels [H, W, 3]`` by fixed-point weights ``wy [h, H]``, ``wx [w, W]`` (integers in
    their float dtype): the first pass in exact integers, clip8-ed (Resample.c), the second in ``wy``'s dtype,
    clipped to 0..255; ``[3, h, w]`` in pixel units."""
    exact = pixels.to(torch.int64)
    one = 1 << PRECISION_BITS
    if height_first:
        first = torch.einsum("yh,hwc->ywc", wy.to(torch.int64), exact)
    else:
        first = torch.einsum("hwc,xw->hxc", exact, wx.to(torch.int64))
    first = ((first + one // 2) >> PRECISION_BITS).clamp(0, 255).to(wy.dtype)
    second = torch.einsum("ywc,xw->cyx", first, wx) if height_first else torch.einsum("yh,hxc->cyx", wy, first)
    return second.clamp(0.0, 255.0 * one) / one


def preprocess_ref(
    images: list[torch.Tensor],
    *,
    resize: tuple[int, int] | Sequence[tuple[int, int]],
    crop: tuple[int, int],
    interpolation: str,
    mean: Sequence[float],
    std: Sequence[float],
    out_dtype: torch.dtype = torch.float32,
    compute_dtype: torch.dtype = torch.float32,
    crop_rounding: str = "round",
    uint8_passes: bool = False,
) -> torch.Tensor:
    """:func:`preprocess` in eager PyTorch, from the same taps and the same ``uint8_passes``;
    ``compute_dtype=torch.float64`` with ``out_dtype=torch.float64`` gives the float64 truth the kernel is judged
    against."""
    resize, crop, mean, std = check_preprocess_inputs(
        images, resize, crop, interpolation, mean, std, torch.float32, crop_rounding
    )
    batch = pack(images, resize, crop, interpolation, crop_rounding, uint8_passes)
    return packed_ref(batch, crop, mean, std, out_dtype, compute_dtype, uint8_passes)


__all__ = ["launch_preprocess", "packed_ref", "preprocess", "preprocess_configs", "preprocess_ref"]
