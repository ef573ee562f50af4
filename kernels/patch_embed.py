"""Fused patch embedding: image ``[B, C, H, W]`` to tokens ``[B, T, D]`` in one pass (im2col, GEMM, bias, position
embedding, class and register tokens; a uint8 image normalised on the fly): the kernel, the launcher
:func:`launch_patch_embed`, the ``torch.library`` op and the eager reference :func:`patch_embed_ref`. Tiles in
:mod:`.patch_embed_tiles`, input checks in :mod:`.patch_embed_checks`; design: docs/kernels.md, "Patch embedding"."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from vit_fast.base.cards import tensor_arch, tensor_sm_count

from ._launch import SelfCheck, case_rows, cdiv, define_op, dot_in_fp32, interpret_bf16
from ._tl import dot, to_bf16_rtne
from .autotune import autotune_cache_enabled, m_class, tune_key
from .launches import ResolvedLaunches
from .patch_embed_checks import as_channel_stats, check_patch_embed_inputs, no_empty, token_counts
from .patch_embed_tiles import patch_embed_configs, prune_patch_embed_configs


@triton.autotune(
    configs=patch_embed_configs(),
    key=[
        # everything prune_patch_embed_configs reads (the autotuner adds the tensors' dtypes itself)
        *("M_CLASS", "D", "K", "ARCH", "TUNE", "SM_COUNT"),
        # every constexpr the configs do not set: the epilogue (bias, class token) and the pixel normalisation are
        # code of their own, each with its own tuning (tests/kernels/test_autotune_mode.py)
        *("HAS_BIAS", "HAS_CLS", "NORMALIZE", "IS_UINT8", "DOT_IN_FP32", "ROUND_BF16"),
    ],
    prune_configs_by={"early_config_prune": prune_patch_embed_configs},
    cache_results=autotune_cache_enabled(),
)
@triton.jit(do_not_specialize=["M_CLASS", "ARCH", "TUNE", "SM_COUNT"])  # key-only: one compile whatever their values
def _patch_embed_kernel(
    x_ptr,  # image [B, C, H, W], any strides; uint8 or the weight's float dtype
    w_ptr,  # [D, K] conv weight, K = C*p*p in (c, i, j) order, unit stride along K
    bias_ptr,  # [D] conv bias, read only when HAS_BIAS
    pos_ptr,  # [L, D] position embedding, unit stride along D; token t reads row t - pos_offset when that is >= 0
    cls_ptr,  # [D] class token, read only when HAS_CLS
    reg_ptr,  # [R, D] register tokens, contiguous, read only when num_reg > 0
    mean_ptr,  # [C] per-channel mean, 0..1 units, read only when NORMALIZE
    std_ptr,  # [C] per-channel std, 0..1 units, read only when NORMALIZE
    out_ptr,  # [B*T, D] tokens out, contiguous, in the weight's dtype
    stride_x_b,  # elements between images of x
    stride_x_c,  # elements between channels of x
    stride_x_h,  # elements between pixel rows of x
    stride_x_w,  # elements between pixel columns of x
    stride_w_d,  # elements between rows (output features) of w
    stride_pos_t,  # elements between rows of pos
    M,  # B*T: output rows (tokens of all images)
    T,  # tokens per image: num_prefix + grid_h*grid_w
    D,  # embedding dim
    K,  # C*p*p: the GEMM reduction length
    patch,  # p: patch size in pixels
    grid_w,  # patches per image row (W / p)
    num_prefix,  # class + register tokens before the patches
    num_reg,  # register tokens
    pos_offset,  # 0 if the position embedding covers the prefix tokens, else num_prefix
    M_CLASS,  # autotune.m_class(M), never read: the autotune key, so a new batch size reuses its class's pick
    ARCH,  # compute capability of the tensors' device (cards.tensor_arch), never read: the prune's card
    TUNE,  # autotune.tune_key(): 1 while tuning, never read: a heuristic pick never answers a tuned request
    SM_COUNT,  # SMs of the tensors' device (cards.tensor_sm_count), never read: the programs the heuristic fills
    HAS_BIAS: tl.constexpr,  # bias_ptr is given
    HAS_CLS: tl.constexpr,  # token 0 is the class token
    NORMALIZE: tl.constexpr,  # apply (x [/ 255] - mean[c]) / std[c] to the pixels
    IS_UINT8: tl.constexpr,  # x is uint8 pixels in 0..255 (divide by 255 before mean/std)
    DOT_IN_FP32: tl.constexpr,  # dot operands as fp32 at IEEE precision (fp32, or bf16 under the interpreter)
    ROUND_BF16: tl.constexpr,  # round bf16 conversions by hand (interpreter: its fp32 -> bf16 cast truncates)
    BLOCK_M: tl.constexpr,  # tokens per program
    BLOCK_D: tl.constexpr,  # output features per program
    BLOCK_K: tl.constexpr,  # reduction step
):
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)
    # rows run over all images' tokens at once, so T = 197 does not waste most of a 64-row tile
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    feats = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < M
    feat_ok = feats < D
    img = rows // T
    tok = (rows - img * T).to(tl.int32)
    patch_idx = tok - num_prefix  # negative for prefix tokens
    is_patch = row_ok & (patch_idx >= 0)
    patch_idx = tl.maximum(patch_idx, 0)
    gy = patch_idx // grid_w
    gx = patch_idx - gy * grid_w
    # top-left pixel of each row's patch: the im2col "row" is an address, never a tensor
    row_base = img * stride_x_b + (gy * patch).to(tl.int64) * stride_x_h + (gx * patch).to(tl.int64) * stride_x_w
    pp = patch * patch

    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        ch = ks // pp
        rem = ks - ch * pp
        di = rem // patch
        dj = rem - di * patch
        col_off = ch.to(tl.int64) * stride_x_c + di.to(tl.int64) * stride_x_h + dj.to(tl.int64) * stride_x_w
        a_mask = is_patch[:, None] & k_ok[None, :]
        a = tl.load(x_ptr + row_base[:, None] + col_off[None, :], mask=a_mask, other=0)
        if NORMALIZE:
            a = a.to(tl.float32)
            if IS_UINT8:
                a = a / 255.0
            mu = tl.load(mean_ptr + ch, mask=k_ok, other=0.0).to(tl.float32)
            sd = tl.load(std_ptr + ch, mask=k_ok, other=1.0).to(tl.float32)
            # masked pixels must stay 0 after the shift, or prefix rows and K tails pick up -mean/std
            a = tl.where(a_mask, (a - mu[None, :]) / sd[None, :], 0.0)
        if NORMALIZE and ROUND_BF16:  # normalised pixels are fp32 here; bf16 as the reference rounds them
            a = to_bf16_rtne(a)
        else:
            a = a.to(w_ptr.dtype.element_ty)
        w = tl.load(
            w_ptr + feats[None, :].to(tl.int64) * stride_w_d + ks[:, None],
            mask=k_ok[:, None] & feat_ok[None, :],
            other=0.0,
        )
        acc = dot(a, w, acc, DOT_IN_FP32)

    if HAS_BIAS:
        bias = tl.load(bias_ptr + feats, mask=feat_ok, other=0.0).to(tl.float32)
        acc += tl.where(is_patch[:, None], bias[None, :], 0.0)
    # prefix rows: the GEMM left them 0, so they become cls / reg (+ pos below when it covers them)
    if HAS_CLS:
        cls = tl.load(cls_ptr + feats, mask=feat_ok, other=0.0).to(tl.float32)
        acc += tl.where((row_ok & (tok == 0))[:, None], cls[None, :], 0.0)
        reg_idx = tok - 1
    else:
        reg_idx = tok
    is_reg = row_ok & (reg_idx >= 0) & (reg_idx < num_reg)
    reg = tl.load(
        reg_ptr + tl.maximum(reg_idx, 0)[:, None] * D + feats[None, :],
        mask=is_reg[:, None] & feat_ok[None, :],
        other=0.0,
    )
    acc += reg.to(tl.float32)
    pos_row = tok - pos_offset
    has_pos = row_ok & (pos_row >= 0)
    pos = tl.load(
        pos_ptr + tl.maximum(pos_row, 0).to(tl.int64)[:, None] * stride_pos_t + feats[None, :],
        mask=has_pos[:, None] & feat_ok[None, :],
        other=0.0,
    )
    acc += pos.to(tl.float32)
    out = to_bf16_rtne(acc) if ROUND_BF16 else acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * D + feats[None, :], out, mask=row_ok[:, None] & feat_ok[None, :])


_patch_embed_launches = ResolvedLaunches(_patch_embed_kernel)


# ---------------------------------------------------------------------------------- launcher
def launch_patch_embed(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pos_embed: torch.Tensor,
    cls_token: torch.Tensor | None = None,
    reg_token: torch.Tensor | None = None,
    *,
    no_embed_class: bool = False,
    mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """Check the inputs, then run the kernel once (no autograd, no custom op); returns ``[B, T, D]``.
    ``checked=True`` skips the checks: only for the custom op, whose one caller (:func:`patch_embed`) has just run
    them. ``out``, if given, must be a contiguous ``[B, T, D]`` tensor in weight's dtype on x's device; tests pass a
    NaN-filled one so an element the kernel leaves unwritten is caught."""
    reg_token = no_empty(reg_token)
    if not checked:
        check_patch_embed_inputs(x, weight, bias, pos_embed, cls_token, reg_token, mean, std, no_embed_class)
    num_prefix, num_reg, T = token_counts(x, weight, cls_token, reg_token)
    B, D, p = x.shape[0], weight.shape[0], weight.shape[-1]
    K = weight.shape[1] * p * p
    if out is None:
        out = torch.empty((B, T, D), dtype=weight.dtype, device=x.device)
    elif out.shape != (B, T, D) or out.dtype != weight.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {weight.dtype} tensor of shape {(B, T, D)} on {x.device}")
    if out.numel() == 0:
        return out
    w2 = weight.reshape(D, K)
    if w2.stride(1) != 1:
        w2 = w2.contiguous()
    pos2 = pos_embed[0]
    if pos2.stride(1) != 1:
        pos2 = pos2.contiguous()
    cls = cls_token.reshape(D).contiguous() if cls_token is not None else w2
    reg = reg_token.reshape(num_reg, D).contiguous() if reg_token is not None else w2
    M = B * T

    def grid(meta):
        return (cdiv(M, meta["BLOCK_M"]), cdiv(D, meta["BLOCK_D"]))

    # unused pointers get w2: any valid tensor does, the constexpr flags keep the kernel off them
    _patch_embed_launches(
        grid,
        (),
        x,
        w2,
        bias if bias is not None else w2,
        pos2,
        cls,
        reg,
        mean if mean is not None else w2,
        std if std is not None else w2,
        out,
        *x.stride(),
        w2.stride(0),
        pos2.stride(0),
        M,
        T,
        D,
        K,
        p,
        x.shape[3] // p,
        num_prefix,
        num_reg,
        num_prefix if no_embed_class else 0,
        m_class(M),
        tensor_arch(x),
        tune_key(),
        tensor_sm_count(x),
        HAS_BIAS=bias is not None,
        HAS_CLS=cls_token is not None,
        NORMALIZE=mean is not None,
        IS_UINT8=x.dtype == torch.uint8,
        DOT_IN_FP32=dot_in_fp32(weight.dtype),
        ROUND_BF16=interpret_bf16(weight.dtype),
    )
    return out


# ---------------------------------------------------------------------------------- custom op
def _patch_embed_op(*args) -> torch.Tensor:
    *inputs, mean, std, no_embed_class = args  # inputs: x, weight, bias, pos_embed, cls_token, reg_token
    return launch_patch_embed(*inputs, no_embed_class=no_embed_class, mean=mean, std=std, checked=True)


# the schema torch.library reads: the checks' typed arguments, as the op takes them
_patch_embed_op.__signature__ = inspect.signature(check_patch_embed_inputs).replace(return_annotation="torch.Tensor")


def _check(x, weight, bias, pos_embed, cls_token, reg_token, mean, std, no_embed_class) -> None:
    check_patch_embed_inputs(x, weight, bias, pos_embed, cls_token, no_empty(reg_token), mean, std, no_embed_class)


def _empty(x, weight, bias, pos_embed, cls_token, reg_token, *_) -> torch.Tensor:
    tokens = token_counts(x, weight, cls_token, no_empty(reg_token))[2]
    return x.new_empty((x.shape[0], tokens, weight.shape[0]), dtype=weight.dtype)


#: what a self-check case of the patch embedding reads of the model besides its rows
_IMAGE = ("chans", "height", "width", "patch", "class_token", "reg_tokens", "no_embed_class")


def _selfcheck_inputs(d: dict, rnd, *_) -> tuple[tuple, dict]:
    B, C, p, D = d["batch"], d["chans"], d["patch"], d["dim"]
    patches = (d["height"] // p) * (d["width"] // p)
    L = patches + (0 if d["no_embed_class"] else int(d["class_token"]) + d["reg_tokens"])
    args = (rnd(B, C, d["height"], d["width"]), rnd(D, C, p, p, scale=(C * p * p) ** -0.5), rnd(D), rnd(1, L, D))
    tokens = dict(
        cls_token=rnd(1, 1, D) if d["class_token"] else None,
        reg_token=rnd(1, d["reg_tokens"], D) if d["reg_tokens"] else None,
        no_embed_class=d["no_embed_class"],
    )
    return args, tokens


_patch_embed = define_op(
    _patch_embed_op,
    check=_check,
    empty=_empty,
    reference=lambda x, weight, bias, pos_embed, cls_token, reg_token, mean, std, no_embed_class: patch_embed_ref(
        x, weight, bias, pos_embed, cls_token, reg_token, no_embed_class=no_embed_class, mean=mean, std=std
    ),
    selfcheck=SelfCheck(
        cases=lambda m: [("patch embedding", {**case_rows(m), **{k: m[k] for k in _IMAGE}})],
        inputs=_selfcheck_inputs,
        launch=lambda d, args, kwargs, poisoned: launch_patch_embed(
            *args, **kwargs, out=poisoned(d["batch"], d["tokens"], d["dim"])
        ),
        shape=lambda d: (
            f"[{d['batch']}, {d['chans']}, {d['height']}, {d['width']}] -> [{d['batch']}, {d['tokens']}, {d['dim']}]"
        ),
    ),
)


def patch_embed(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pos_embed: torch.Tensor,
    cls_token: torch.Tensor | None = None,
    reg_token: torch.Tensor | None = None,
    *,
    no_embed_class: bool = False,
    mean: torch.Tensor | Sequence[float] | None = None,
    std: torch.Tensor | Sequence[float] | None = None,
) -> torch.Tensor:
    """Tokens ``[B, T, D]`` = ``[cls, reg_0..reg_{R-1}, patches row-major]`` + position embedding, in ``weight``'s
    dtype; ``T = [cls] + R + (H/p)*(W/p)``. ``x``: images ``[B, C, H, W]`` in ``weight``'s dtype, or uint8 pixels
    (0..255) normalised in the kernel by ``mean`` / ``std`` ``[C]`` (0..1 units). ``weight [D, C, p, p]`` and
    ``bias [D]``: the Conv2d's; ``pos_embed [1, L, D]`` resampled to this grid; ``cls_token [1, 1, D]``,
    ``reg_token [1, R, D]`` optional. Normalisation, ``L`` and backward: docs/kernels.md, section Patch embedding."""
    mean = as_channel_stats(mean, "mean", x)
    std = as_channel_stats(std, "std", x)
    return _patch_embed(x, weight, bias, pos_embed, cls_token, no_empty(reg_token), mean, std, no_embed_class)


# ---------------------------------------------------------------------------------- reference
def patch_embed_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pos_embed: torch.Tensor,
    cls_token: torch.Tensor | None = None,
    reg_token: torch.Tensor | None = None,
    *,
    no_embed_class: bool = False,
    mean: torch.Tensor | Sequence[float] | None = None,
    std: torch.Tensor | Sequence[float] | None = None,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager PyTorch, timm's way: Conv2d, flatten, transpose, cat prefix tokens, add pos_embed.

    With ``upcast=True`` the math runs in float32 and the result is cast back to ``weight``'s dtype;
    pass float64 tensors for a float64 reference.
    """
    mean = as_channel_stats(mean, "mean", x)
    std = as_channel_stats(std, "std", x)
    out_dtype = weight.dtype
    dtype = torch.float32 if upcast and weight.dtype != torch.float64 else weight.dtype
    if mean is not None:
        norm_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        v = x.to(norm_dtype)
        if x.dtype == torch.uint8:
            v = v / 255
        v = (v - mean.to(norm_dtype).view(-1, 1, 1)) / std.to(norm_dtype).view(-1, 1, 1)
        # rounded to the weight's dtype first, as the kernel's GEMM sees it
        x = v.to(weight.dtype).to(dtype)
    else:
        x = x.to(dtype)
    p = weight.shape[-1]
    cast = lambda t: t.to(dtype) if t is not None else None  # noqa: E731
    tokens = torch.nn.functional.conv2d(x, cast(weight), cast(bias), stride=p).flatten(2).transpose(1, 2)
    prefix = [t.to(dtype).expand(x.shape[0], -1, -1) for t in (cls_token, reg_token) if t is not None]
    if no_embed_class:
        tokens = tokens + cast(pos_embed)
        tokens = torch.cat([*prefix, tokens], dim=1) if prefix else tokens
    else:
        tokens = torch.cat([*prefix, tokens], dim=1) if prefix else tokens
        tokens = tokens + cast(pos_embed)
    return tokens.to(out_dtype)


# ---------------------------------------------------------------------------------- compile-check variants
# what tools/compile_check.py compiles of this kernel (KERNELS[name].compile_variants / .compile_launch): its
# cases (kernel, label, params, which configs) per variant set, and one launch per case recorded through v.record;
# ``v`` is the tool's vocabulary (DTYPES, PICK_MODELS, PICK_BATCHES, EVERY_CONFIG_DTYPES, which, empty, torch_dtype)
def _pe_variant(dtype, image, shape, bias, prefix, which, tag=""):
    C, p, D, B, _ = shape
    label = (
        f"{dtype} {image} C{C} p{p} D{D} b{B} | bias={int(bias)} cls={int(prefix[0])} reg={prefix[1]} "
        f"nec={int(prefix[2])}{tag}"
    )
    params = {"dtype": dtype, "image": image, "shape": shape, "bias": bias, "prefix": prefix}
    return ("patch_embed", label, params, which)


_PE_PREFIXES = (  # (HAS_CLS, num_reg, no_embed_class)
    (False, 0, False),
    (True, 0, False),
    (True, 0, True),
    (True, 4, False),
    (True, 4, True),
    (False, 4, True),
)


def compile_variants(v, variant_set: str, full: bool) -> list[tuple]:
    if variant_set == "picks":  # ViT-S/16 and ViT-B/16: the heuristic's pick per dtype and batch
        return [
            _pe_variant(dtype, "float", (3, 16, D, b, 224), True, (True, 0, False), "pick")
            for dtype, (_, D, _), b in itertools.product(v.DTYPES, v.PICK_MODELS, v.PICK_BATCHES)
        ]
    if variant_set == "vit-b16":
        # ViT-B/16 at 224 px, batch 1 and 8: a float image, conv bias, the class token
        return [
            _pe_variant(dtype, "float", (3, 16, 768, b, 224), True, (True, 0, False), v.which(dtype))
            for dtype, b in itertools.product(v.DTYPES, (1, 8))
        ]
    # (C, p, D, B, H): ViT-B/16 at 224 px; the embedded digits model (8x8 grey, p=4, D=64)
    shapes = ((3, 16, 768, 8, 224), (1, 4, 64, 32, 8))
    cases = []
    for dtype, image, shape in itertools.product(v.DTYPES, ("float", "float+norm", "uint8+norm"), shapes):
        # every config: the heaviest flag set (bias, class + 4 register tokens) ...
        cases.append(_pe_variant(dtype, image, shape, True, (True, 4, False), "all" if full else "kept"))
        # ... and the flag sweep (bias x prefix tokens x no_embed_class): with --full on every config and
        # shape, else on the largest tile (the most registers) at ViT-B/16's shape
        if full or shape is shapes[0]:
            for bias, prefix in itertools.product((False, True), _PE_PREFIXES):
                if (bias, prefix) != (True, (True, 4, False)):
                    cases.append(_pe_variant(dtype, image, shape, bias, prefix, "all" if full else "largest"))
    return cases


def compile_launch(v, params: dict) -> tuple:
    C, p, D, B, H = params["shape"]
    dtype, image = params["dtype"], params["image"]
    has_cls, num_reg, no_embed_class = params["prefix"]
    num_patches = (H // p) ** 2
    num_prefix = int(has_cls) + num_reg
    normalize = image.endswith("+norm")
    return v.record(
        launch_patch_embed,
        v.empty((B, C, H, H), "u8" if image.startswith("uint8") else dtype),
        v.empty((D, C, p, p), dtype),
        v.empty((D,), dtype) if params["bias"] else None,
        v.empty((1, num_patches + (0 if no_embed_class else num_prefix), D), dtype),
        v.empty((1, 1, D), dtype) if has_cls else None,
        v.empty((1, num_reg, D), dtype) if num_reg else None,
        no_embed_class=no_embed_class,
        mean=v.empty((C,), "fp32") if normalize else None,
        std=v.empty((C,), "fp32") if normalize else None,
    )


__all__ = ["launch_patch_embed", "patch_embed", "patch_embed_ref"]
