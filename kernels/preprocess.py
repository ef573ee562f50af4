"""Fused image preprocessing: uint8 HWC images at their decoded sizes to the model's input ``[B, 3, crop_h, crop_w]``
in one launch (antialiased bilinear / bicubic resize as PIL and torchvision compute it, centre crop, ``/ 255``, mean
and std): the kernel, the launcher :func:`launch_preprocess`, the ``torch.library`` op, the public :func:`preprocess`
and the eager reference :func:`preprocess_ref`. Taps and packing in :mod:`.preprocess_weights`; design:
docs/kernels.md, section "Fused preprocessing"."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from vit_fast.base.cards import tensor_arch
from vit_fast.base.interpret import interpreter_enabled

from ._launch import SelfCheck, cdiv, check_device, define_op, interpret_bf16
from ._tl import to_bf16_rtne
from .autotune import autotune_cache_enabled, tune_key, tuning_requested
from .launches import SUPPORTED_DTYPES, ResolvedLaunches
from .preprocess_weights import CROP_ROUNDING, SUPPORT, PackedBatch, pack

#: the no-autotune pick: 8 output rows share each source row's horizontal pass; 64 columns per program
_PICK = {"BLOCK_Y": 8, "BLOCK_X": 64}


def preprocess_configs() -> list[triton.Config]:
    """Autotune candidates (output rows x columns per program), from the environment only; one under the
    interpreter, which cannot time configs."""
    if interpreter_enabled():
        return [triton.Config({"BLOCK_Y": 32, "BLOCK_X": 32}, num_warps=1)]
    # 4 warps each: at most 1024 outputs x 3 channels of accumulators per program (24 fp32 registers a thread)
    return [
        triton.Config({"BLOCK_Y": by, "BLOCK_X": bx}, num_warps=4)
        for by in (4, 8, 16)
        for bx in (64, 128)
        if by * bx <= 1024
    ]


def prune_preprocess_configs(configs, named_args, **kwargs):
    """Every candidate while tuning (``TUNE``), else the one heuristic pick :data:`_PICK` on 4 warps."""
    if tuning_requested(named_args) or len(configs) == 1:
        return configs
    return [next(c for c in configs if c.kwargs == _PICK and c.num_warps == 4)]


@triton.autotune(
    configs=preprocess_configs(),
    key=["crop_h", "crop_w", "taps_y", "taps_x", "ARCH", "TUNE", "ROUND_BF16"],
    prune_configs_by={"early_config_prune": prune_preprocess_configs},
    cache_results=autotune_cache_enabled(),
)
@triton.jit(do_not_specialize=["ARCH", "TUNE"])  # key-only: one compile whatever their values
def _preprocess_kernel(
    src_ptr,  # uint8 pixels of every image, each [H_i, W_i, 3] contiguous, one after another
    images_ptr,  # [B, 3] int64: offset of image b in src, its height, its width
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
    scale0,  # 1 / (255 * std[0]): the red channel's scale; likewise below
    scale1,
    scale2,
    shift0,  # -mean[0] / std[0]: the red channel's shift; likewise below
    shift1,
    shift2,
    ARCH,  # compute capability of the tensors' device (cards.tensor_arch), never read: an autotune key
    TUNE,  # autotune.tune_key(): 1 while tuning, never read: a heuristic pick never answers a tuned request
    ROUND_BF16: tl.constexpr,  # round bf16 stores by hand (interpreter: its fp32 -> bf16 cast truncates)
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
    base = tl.load(images_ptr + b * 3)
    row_stride = tl.load(images_ptr + b * 3 + 2) * 3
    acc0 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float32)
    for r in range(lo, hi):
        row = src_ptr + base + r * row_stride  # row_stride is int64 (loaded from images)
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


# ---------------------------------------------------------------------------------- checks
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


# ---------------------------------------------------------------------------------- launcher
def launch_packed(
    batch: PackedBatch, crop: tuple[int, int], mean, std, out_dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Run the kernel once on a :class:`~.preprocess_weights.PackedBatch` (fp32 weights); returns
    ``[B, 3, crop_h, crop_w]`` in ``out_dtype`` (into ``out`` when given: tests pass a NaN-filled one)."""
    B, (ch, cw) = batch.images.shape[0], crop
    shape = (B, 3, ch, cw)
    if out is None:
        out = torch.empty(shape, dtype=out_dtype, device=batch.pixels.device)
    elif tuple(out.shape) != shape or out.dtype != out_dtype or out.device != batch.pixels.device:
        raise ValueError(f"preprocess: out must be {list(shape)} {out_dtype} on {batch.pixels.device}")
    elif not out.is_contiguous():
        raise ValueError("preprocess: out must be contiguous")
    taps_y, taps_x = batch.row_weight.shape[1], batch.col_weight.shape[1]

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
        *(1.0 / (255.0 * s) for s in std),
        *(-m / s for m, s in zip(mean, std, strict=True)),
        tensor_arch(batch.pixels),
        tune_key(),
        ROUND_BF16=interpret_bf16(out_dtype),
    )
    return out


def _pack_for_kernel(images, resize, crop, interpolation, crop_rounding="round") -> PackedBatch:
    batch = pack(images, resize, crop, interpolation, crop_rounding)
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
) -> torch.Tensor:
    """Check, pack (:func:`~.preprocess_weights.pack`) and launch once (no custom op); ``out`` as
    :func:`launch_packed`. ``checked=True`` skips the checks (``tools/compile_check.py``'s recorded launches)."""
    if not checked:
        resize, crop, mean, std = check_preprocess_inputs(
            images, resize, crop, interpolation, mean, std, out_dtype, crop_rounding
        )
        check_device("preprocess", images[0])
    batch = _pack_for_kernel(images, resize, crop, interpolation, crop_rounding)
    return launch_packed(batch, crop, mean, std, out_dtype, out)


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
    if images.shape[1] != 3 or rows != (B * crop_h,) * 3 or cols != (col_weight.shape, B * crop_w):
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
) -> torch.Tensor:
    batch = PackedBatch(pixels, images, row_start, row_stop, row_weight, col_index, col_weight)
    return launch_packed(batch, (crop_h, crop_w), mean, std, out_dtype)


def _packed_ref(*args) -> torch.Tensor:
    *tables, crop_h, crop_w, mean, std, out_dtype = args
    return packed_ref(PackedBatch(*tables), (crop_h, crop_w), mean, std, out_dtype)


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
    empty=lambda pixels, images, *rest: pixels.new_empty((images.shape[0], 3, rest[5], rest[6]), dtype=rest[-1]),
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
) -> torch.Tensor:
    """uint8 ``[H_i, W_i, 3]`` images (sizes may differ) to ``[B, 3, crop_h, crop_w]`` in ``out_dtype``: resized to
    ``resize`` (H, W; or a list, one per image) with PIL's antialiased ``interpolation`` ("bilinear" | "bicubic"),
    centre crop ``crop`` (H, W; offsets ``crop_rounding`` "round" | "floor"), ``(x / 255 - mean) / std``; one
    launch (op ``vit_fast::preprocess``)."""
    resize, crop, mean, std = check_preprocess_inputs(
        images, resize, crop, interpolation, mean, std, out_dtype, crop_rounding
    )
    check_device("preprocess", images[0])
    batch = _pack_for_kernel(images, resize, crop, interpolation, crop_rounding)
    return _preprocess(*batch, crop[0], crop[1], list(mean), list(std), out_dtype)


# ---------------------------------------------------------------------------------- reference
def packed_ref(
    batch: PackedBatch, crop: tuple[int, int], mean, std, out_dtype: torch.dtype, compute_dtype=torch.float32
) -> torch.Tensor:
    """Eager PyTorch on a packed batch: each image's dense row and column weight matrices (from the tap tables) on
    both sides of its pixels in ``compute_dtype``, then ``/ 255``, mean and std; cast to ``out_dtype``."""
    ch, cw = crop
    outs = []
    for b, (offset, height, width) in enumerate(batch.images.tolist()):
        img = batch.pixels[offset : offset + height * width * 3].view(height, width, 3).to(compute_dtype)
        rows = slice(b * ch, (b + 1) * ch)
        k = torch.arange(batch.row_weight.shape[1], device=img.device)
        index = (batch.row_start[rows, None].long() + k).clamp(max=height - 1)
        wy = img.new_zeros(ch, height).scatter_add_(1, index, batch.row_weight[rows].to(compute_dtype))
        cols = slice(b * cw, (b + 1) * cw)
        wx = img.new_zeros(cw, width).scatter_add_(
            1, batch.col_index[cols].long(), batch.col_weight[cols].to(compute_dtype)
        )
        outs.append(torch.einsum("yh,hwc,xw->cyx", wy, img, wx))
    x = torch.stack(outs) / 255.0
    m = torch.tensor(mean, dtype=compute_dtype, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=compute_dtype, device=x.device).view(1, 3, 1, 1)
    return ((x - m) / s).to(out_dtype)


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
) -> torch.Tensor:
    """:func:`preprocess` in eager PyTorch, from the same taps; ``compute_dtype=torch.float64`` with
    ``out_dtype=torch.float64`` gives the float64 truth the kernel is judged against."""
    resize, crop, mean, std = check_preprocess_inputs(
        images, resize, crop, interpolation, mean, std, torch.float32, crop_rounding
    )
    batch = pack(images, resize, crop, interpolation, crop_rounding)
    return packed_ref(batch, crop, mean, std, out_dtype, compute_dtype)


# ---------------------------------------------------------------------------------- compile-check variants
# what tools/compile_check.py compiles of this kernel (KERNELS[name].compile_variants / .compile_launch): its
# cases (kernel, label, params, which configs) per variant set, and one launch per case recorded through v.record;
# ``v`` is the tool's vocabulary (DTYPES, PICK_MODELS, PICK_BATCHES, EVERY_CONFIG_DTYPES, which, empty, torch_dtype)
#: preprocessing cases: (label, decoded image sizes in one launch, resize, crop, interpolation). vit-b16: photos
#: of two sizes to timm's eval input at 224 (short side to 248, centre 224); sweep: a 1080p frame downscaled 8x
#: (the most taps), the digits model's 8x8 upscaled to 32x32
_PREPROCESS_VARIANTS = {
    "vit-b16": (("photos 500x375+640x480 -> 248x330 / 224", ((375, 500), (480, 640)), (248, 330), (224, 224)),),
    "sweep": (
        ("1080p -> 224", ((1080, 1920),), (224, 398), (224, 224)),
        ("digits 8x8 -> 32", ((8, 8),), (32, 32), (32, 32)),
    ),
}


def compile_variants(v, variant_set: str, full: bool) -> list[tuple]:
    """Not in a ViT forward, so not in the picks set; every config it keeps for fp32 / fp16 (--every-config-dtypes),
    the pick for bf16, per interpolation."""
    cases = []
    for (name, sizes, resize, crop), dtype, interpolation in itertools.product(
        _PREPROCESS_VARIANTS.get(variant_set, ()), v.DTYPES, ("bicubic", "bilinear")
    ):
        params = {"dtype": dtype, "sizes": sizes, "resize": resize, "crop": crop, "interpolation": interpolation}
        which = "all" if full else v.which(dtype)
        cases.append(("preprocess", f"{dtype} {interpolation} {name}", params, which))
    return cases


def compile_launch(v, params: dict) -> tuple:
    import torch

    # the launcher packs the images' pixels (a copy of up to a MB) with torch on the CPU: on one thread, or the
    # forked compile workers hang in an OpenMP pool the parent started (seen: every worker asleep on a futex)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return v.record(
            launch_preprocess,
            [v.empty((h, w, 3), "u8") for h, w in params["sizes"]],
            resize=tuple(params["resize"]),
            crop=tuple(params["crop"]),
            interpolation=params["interpolation"],
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            out_dtype=v.torch_dtype(params["dtype"]),
        )
    finally:
        torch.set_num_threads(threads)


__all__ = ["launch_preprocess", "packed_ref", "preprocess", "preprocess_configs", "preprocess_ref"]
