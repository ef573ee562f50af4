"""Flash-style differential attention forward (timm's ``DiffAttention``), reading the qkv GEMM output in place: two
online softmaxes over the same k / v tiles, their difference, then the RmsNorm and ``(1 - lambda_init)`` in the
epilogue, written as ``[B, T, H * 2 Dh]``. Top to bottom: the tiles, the kernel, the launcher
:func:`launch_diff_attention`, the ``torch.library`` op, :func:`diff_attention` and the eager reference
:func:`diff_attention_ref`. Design: docs/kernels.md, "Differential attention"."""

from __future__ import annotations

import itertools
import math

import torch
import triton
import triton.language as tl

from vit_fast.base.cards import tensor_arch
from vit_fast.base.interpret import interpreter_enabled

from ._launch import (
    SelfCheck,
    cdiv,
    check_device,
    define_op,
    next_power_of_2,
    output_buffer,
)
from ._tl import attend_tile, head_tile, online_softmax_start, store_rounded
from .attention_checks import check_projection
from .attention_tiles import dtype_flags, head_split, row_strides
from .autotune import autotune_cache_enabled, closest_config, prune_target, tune_key, tuning_requested
from .launches import ResolvedLaunches

#: q / k head dims (``Dh``; v heads and output heads are ``2 * Dh``): 8..128 gives output heads of 16..256, the
#: range of the plain attention kernel (``attention_checks.MIN_HEAD_DIM``, ``MAX_HEAD_DIM``)
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 128
LOG2E = math.log2(math.e)
#: num_stages of the configs meant for cards without tensor cores (sm_75): every other config has more
FMA_STAGES = 1


def _diff_attention_configs() -> list[triton.Config]:
    """Autotune candidates, from the environment only (no device query). The interpreter gets one."""
    if interpreter_enabled():
        # BLOCK_M != BLOCK_N on purpose: a query-tail mask swapped with a key-tail mask fails tests
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=num_warps, num_stages=num_stages)
        for block_m in (32, 64)
        for block_n in (32, 64)
        for num_stages in (2, 3)
        for num_warps in (4, 8)
    ] + [
        # cards without tensor cores (sm_75): small tiles, 4 warps, no pipelining
        triton.Config({"BLOCK_M": block_m, "BLOCK_N": 32}, num_warps=4, num_stages=FMA_STAGES)
        for block_m in (16, 32)
    ]


def block_d_for(head_dim: int) -> int:
    """The kernel's ``BLOCK_D`` for q / k heads of ``head_dim``: a power of two, at least 16 (the dot's minimum);
    v and output heads use ``2 * BLOCK_D``."""
    return max(16, next_power_of_2(head_dim))


def _diff_shared_bytes(config: triton.Config, block_d: int, elem_bytes: int, fma: bool) -> int:
    """An upper estimate of a config's shared memory: every pipeline stage of the k1, k2 and v tiles
    (``4 * BLOCK_N * BLOCK_D`` elements), the two q tiles and the two p tiles (layout conversions into the dots'
    operands). Without tensor cores every tile counts as fp32, as the plain attention kernel's estimate does."""
    block_m, block_n, stages = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], max(config.num_stages, 1)
    elem = 4 if fma else elem_bytes
    return (stages * 4 * block_n * block_d + 2 * block_m * block_d + 2 * block_m * block_n) * elem


def _diff_registers_fit(config: triton.Config, block_d: int) -> bool:
    """Whether the two fp32 accumulators (``2 * BLOCK_M * 2 * BLOCK_D``) fit in at most 128 registers a thread."""
    threads = 32 * config.num_warps
    return 4 * config.kwargs["BLOCK_M"] * block_d <= 128 * threads


def _prune_diff_configs(configs, named_args, **kwargs):
    """The candidates for one launch, read only from its autotune key (T, the head dim, ``ARCH``, the dtype,
    ``TUNE``): the configs for this kind of card that fit its shared memory and whose accumulators fit in
    registers. Without tuning one: the fitting config nearest 64x32, 8 warps, 2 stages (fp32: 32x32, with 4 warps
    up to BLOCK_D 32; a card without tensor cores: 16x32, 4 warps, 1 stage)."""
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    if block_d is None:
        return configs
    card, elem_bytes = prune_target(named_args, "qkv_ptr")
    fma = not card.tensor_cores

    def shared(config: triton.Config) -> int:
        return _diff_shared_bytes(config, block_d, elem_bytes, fma)

    same_kind = [c for c in configs if (c.num_stages > FMA_STAGES) == card.tensor_cores] or configs
    kept = [c for c in same_kind if shared(c) <= card.shared_memory and _diff_registers_fit(c, block_d)]
    kept = kept or [min(same_kind, key=shared)]
    if tuning_requested(named_args) or len(kept) == 1:
        return kept
    if fma:
        return [closest_config(kept, {"BLOCK_M": 16, "BLOCK_N": 32}, 4, FMA_STAGES)]
    if elem_bytes == 4:
        # fp32 (its dots on FMA on every card), triton 3.9, T 257, 32x32 2 stages: with 8 warps it spilled 24 B per
        # thread on sm_80 at Dh 32 (8 B at Dh 16), 4 warps none on sm_80 and sm_90; at Dh 64 it is the other way
        # round on sm_90 (4 warps 124 B, 8 none), so 4 warps up to BLOCK_D 32 only
        return [closest_config(kept, {"BLOCK_M": 32, "BLOCK_N": 32}, 4 if block_d <= 32 else 8, 2)]
    return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_N": 32}, 8, 2)]


@triton.autotune(
    configs=_diff_attention_configs(),
    key=[
        # everything _prune_diff_configs reads (the autotuner adds the dtypes itself)
        *("T", "HEAD_DIM", "ARCH", "TUNE"),
        # every constexpr the configs do not set (tests/kernels/test_autotune_mode.py); these follow the dtype and head dim
        *("DOT_IN_FP32", "ROUND_BF16", "BLOCK_D"),
    ],
    prune_configs_by={"early_config_prune": _prune_diff_configs},
    cache_results=autotune_cache_enabled(),
)
@triton.jit(do_not_specialize=["ARCH", "TUNE"])
def _diff_attention_kernel(
    qkv_ptr,  # [B, T, 3 * D] fused q|k|v: q, k as [2H, Dh] (q1 = head 2h, q2 = 2h + 1), v as [H, 2 Dh]; unit stride
    lambda_ptr,  # 0-dim lambda (any float dtype), read on the device: no host sync
    norm_weight_ptr,  # [2 * Dh] sub_norm (RmsNorm) weight
    out_ptr,  # [B, T, H * 2 Dh] output, unit stride along its last dim
    qk_scale,  # softmax scale * log2(e)
    norm_eps,  # sub_norm's eps
    out_scale,  # 1 - lambda_init, applied after the RmsNorm
    T,  # tokens per image
    H,  # number of (output) heads
    HEAD_DIM,  # Dh, the q / k head dim; v and output heads are 2 * Dh
    stride_qkv_b,  # elements between images in qkv
    stride_qkv_t,  # elements between tokens in qkv
    stride_out_b,  # elements between images in out
    stride_out_t,  # elements between tokens in out
    ARCH,  # compute capability of the tensors' device, never read: the prune's card
    TUNE,  # autotune.tune_key(), never read: a heuristic pick never answers a tuned request
    DOT_IN_FP32: tl.constexpr,  # dot operands as fp32 at IEEE precision (fp32, or bf16 under the interpreter)
    ROUND_BF16: tl.constexpr,  # round the bf16 store by hand (interpreter)
    BLOCK_D: tl.constexpr,  # Dh padded to a power of two >= 16; v and output tiles are 2 * BLOCK_D wide
    BLOCK_M: tl.constexpr,  # query rows per program
    BLOCK_N: tl.constexpr,  # key/value rows per inner step
):
    # one flat grid axis over (query block, image * head), query blocks fastest (k and v shared in L2)
    num_m_blocks = tl.cdiv(T, BLOCK_M)
    pid_m = tl.program_id(0) % num_m_blocks
    pid_bh = tl.program_id(0) // num_m_blocks
    off_b = pid_bh // H
    off_h = pid_bh % H
    head_width = 2 * HEAD_DIM  # q1|q2 of one head, k1|k2 of one head, its v, its output: all 2 Dh wide
    embed_dim = H * head_width
    q_base = qkv_ptr + off_b.to(tl.int64) * stride_qkv_b + off_h * head_width
    k_base = q_base + embed_dim
    v_base = q_base + 2 * embed_dim

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, 2 * BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    v_mask = offs_v < head_width
    row_mask = offs_m < T

    q_offsets = offs_m[:, None] * stride_qkv_t + offs_d[None, :]
    q_mask = row_mask[:, None] & d_mask[None, :]
    q1 = tl.load(q_base + q_offsets, mask=q_mask, other=0.0)
    q2 = tl.load(q_base + HEAD_DIM + q_offsets, mask=q_mask, other=0.0)
    if DOT_IN_FP32:
        q1 = q1.to(tl.float32)
        q2 = q2.to(tl.float32)

    m1, l1, acc1 = online_softmax_start(BLOCK_M, 2 * BLOCK_D)
    m2, l2, acc2 = online_softmax_start(BLOCK_M, 2 * BLOCK_D)
    for start_n in range(0, T, BLOCK_N):
        cols = start_n + offs_n
        col_mask = cols < T
        k_offsets = cols[:, None] * stride_qkv_t + offs_d[None, :]
        k_mask = col_mask[:, None] & d_mask[None, :]
        k1 = tl.load(k_base + k_offsets, mask=k_mask, other=0.0)
        k2 = tl.load(k_base + HEAD_DIM + k_offsets, mask=k_mask, other=0.0)
        v = tl.load(
            v_base + cols[:, None] * stride_qkv_t + offs_v[None, :],
            mask=col_mask[:, None] & v_mask[None, :],
            other=0.0,
        )
        if DOT_IN_FP32:  # v once for both softmaxes
            v = v.to(tl.float32)
        m1, l1, acc1 = attend_tile(q1, k1, v, col_mask, qk_scale, m1, l1, acc1, DOT_IN_FP32)  # key tail -> -inf
        m2, l2, acc2 = attend_tile(q2, k2, v, col_mask, qk_scale, m2, l2, acc2, DOT_IN_FP32)

    lam = tl.load(lambda_ptr).to(tl.float32)
    o = acc1 / l1[:, None] - lam * (acc2 / l2[:, None])  # padding lanes are 0 (v's were), so the mean below is exact
    mean_square = tl.sum(o * o, 1) / head_width
    weight = tl.load(norm_weight_ptr + offs_v, mask=v_mask, other=0.0).to(tl.float32)
    o = o * (1.0 / tl.sqrt(mean_square + norm_eps))[:, None] * weight[None, :] * out_scale

    out_ptrs = head_tile(out_ptr, off_b, stride_out_b, offs_m, stride_out_t, off_h * head_width, offs_v)
    store_rounded(out_ptrs, o, row_mask[:, None] & v_mask[None, :], ROUND_BF16)


_diff_attention_launches = ResolvedLaunches(_diff_attention_kernel)


# ---------------------------------------------------------------------------------- launcher
def _check_diff_attention_inputs(
    qkv: torch.Tensor,
    lambda_full: torch.Tensor,
    norm_weight: torch.Tensor,
    num_heads: int,
    lambda_init: float,
    scale: float | None,
    norm_eps: float,
) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    what = "diff_attention"
    layout, hint = "3 * num_heads * 2 * head_dim", "check num_heads (the output heads, half the q / k heads)"
    head_dim = check_projection(
        what, "qkv", qkv, num_heads, 6, layout, hint, (MIN_HEAD_DIM, MAX_HEAD_DIM), "q/k head_dim"
    )
    if not isinstance(lambda_full, torch.Tensor) or lambda_full.numel() != 1 or not lambda_full.is_floating_point():
        raise ValueError(
            f"{what}: lambda_full must be a one-element float tensor (timm's lambda, e.g. a 0-dim tensor), got "
            f"{lambda_full!r:.80}"
        )
    if lambda_full.device != qkv.device:
        raise ValueError(
            f"{what}: lambda_full is on {lambda_full.device}, qkv on {qkv.device}: move it to qkv's device"
        )
    if not isinstance(norm_weight, torch.Tensor) or tuple(norm_weight.shape) != (2 * head_dim,):
        shape = tuple(norm_weight.shape) if isinstance(norm_weight, torch.Tensor) else type(norm_weight).__name__
        raise ValueError(f"{what}: norm_weight must be the sub_norm weight of shape ({2 * head_dim},), got {shape}")
    if norm_weight.dtype != qkv.dtype or norm_weight.device != qkv.device or norm_weight.stride(-1) != 1:
        raise ValueError(
            f"{what}: norm_weight is {norm_weight.dtype} on {norm_weight.device}, qkv {qkv.dtype} on {qkv.device}: "
            "give it qkv's dtype and device, contiguous"
        )
    # not while compiling: floats that changed between compiled calls arrive symbolic
    if not torch.compiler.is_compiling():
        for name, value in (("scale", scale), ("norm_eps", norm_eps), ("lambda_init", lambda_init)):
            if value is None and name == "scale":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{what}: {name} must be a finite float, got {value!r}")
        if norm_eps < 0:
            raise ValueError(f"{what}: norm_eps must be >= 0, got {norm_eps!r}")
    check_device(what, qkv)


def launch_diff_attention(
    qkv: torch.Tensor,
    lambda_full: torch.Tensor,
    norm_weight: torch.Tensor,
    num_heads: int,
    lambda_init: float,
    scale: float | None = None,
    norm_eps: float = 1e-5,
    *,
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """Check the inputs, then run the kernel once (no autograd, no custom op); returns ``[B, T, H * 2 Dh]``.

    ``checked=True`` skips the checks (the custom op, whose caller has run them). ``out``, if given, must be
    ``[B, T, H * 2 Dh]`` in qkv's dtype and device with a unit-stride last dim (tests pass a NaN-filled one).
    """
    if not checked:
        _check_diff_attention_inputs(qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, norm_eps)
    batch, tokens, _ = qkv.shape
    embed_dim, head_dim, scale = head_split(qkv, 3, 2 * num_heads, scale)  # q and k: two heads per output head
    out = output_buffer("diff_attention", out, (batch, tokens, embed_dim), qkv)
    if batch == 0:
        return out

    def grid(meta):
        return (cdiv(tokens, meta["BLOCK_M"]) * batch * num_heads,)

    _diff_attention_launches(
        grid,
        (batch,),
        qkv,
        lambda_full,
        norm_weight,
        out,
        scale * LOG2E,
        float(norm_eps),
        1.0 - float(lambda_init),
        tokens,
        num_heads,
        head_dim,
        *row_strides(qkv, out),
        tensor_arch(qkv),
        tune_key(),
        **dtype_flags(qkv.dtype),
        BLOCK_D=block_d_for(head_dim),
    )
    return out


# ---------------------------------------------------------------------------------- custom op
def _diff_attention_op(
    qkv: torch.Tensor,
    lambda_full: torch.Tensor,
    norm_weight: torch.Tensor,
    num_heads: int,
    lambda_init: float,
    scale: float,
    norm_eps: float,
) -> torch.Tensor:
    return launch_diff_attention(qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, norm_eps, checked=True)


def _defaults(qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, norm_eps) -> tuple:
    head_dim = qkv.shape[-1] // (6 * num_heads)
    scale = head_dim**-0.5 if scale is None else float(scale)
    return qkv, lambda_full, norm_weight, num_heads, float(lambda_init), scale, float(norm_eps)


def _selfcheck_inputs(d: dict, rnd) -> tuple[tuple, dict]:
    """timm's lambda, exp(q1 . k1) - exp(q2 . k2) + lambda_init, lies near lambda_init (its vectors start at std
    0.1): drawn as lambda_init + 0.1 N(0, 1), a 0-dim tensor in qkv's dtype as timm_blocks passes it; the sub_norm
    weight is over 2 * Dh."""
    lambda_full = d["lambda_init"] + rnd(scale=0.1)
    B, T, D = d["batch"], d["tokens"], d["dim"]
    return (rnd(B, T, 3 * D), lambda_full, rnd(D // d["heads"]), d["heads"], d["lambda_init"]), {}


_diff_attention = define_op(
    _diff_attention_op,
    check=_check_diff_attention_inputs,
    empty=lambda qkv, *_: qkv.new_empty((*qkv.shape[:2], qkv.shape[2] // 3)),
    reference=lambda qkv, lam, weight, heads, lambda_init, scale, eps: diff_attention_ref(
        qkv, lam, weight, heads, lambda_init, scale, eps, upcast=True
    ),
    prepare=_defaults,
    selfcheck=SelfCheck(  # v and the output: 2 * Dh per head
        cases=lambda m: [
            (
                f"attention, {m['model']}",
                dict(
                    batch=m["batch"],
                    tokens=m["tokens"],
                    dim=2 * m["heads"] * m["head_dim"],
                    heads=m["heads"],
                    lambda_init=m["lambda_init"],
                ),  # fmt: skip
            )
        ],
        inputs=lambda d, rnd, *_: _selfcheck_inputs(d, rnd),
        launch=lambda d, args, _, poisoned: launch_diff_attention(
            *args, out=poisoned(d["batch"], d["tokens"], d["dim"])
        ),
        shape=lambda d: (
            f"[{d['batch']}, {d['tokens']}, {3 * d['dim']}] -> [{d['batch']}, {d['tokens']}, {d['dim']}] "
            f"({d['heads']} heads: q, k {2 * d['heads']} of {d['dim'] // (2 * d['heads'])}, v {d['heads']} of "
            f"{d['dim'] // d['heads']})"
        ),
    ),
)


def diff_attention(
    qkv: torch.Tensor,
    lambda_full: torch.Tensor,
    norm_weight: torch.Tensor,
    num_heads: int,
    lambda_init: float,
    scale: float | None = None,
    norm_eps: float = 1e-5,
) -> torch.Tensor:
    """Differential attention (timm's ``DiffAttention`` from the qkv GEMM to before its ``norm`` / proj):
    ``qkv [B, T, 3 * H * 2 * Dh]`` float16 / bfloat16 / float32, last dim stride 1, Dh in 8..128; ``lambda_full`` a
    one-element tensor on qkv's device; ``norm_weight [2 Dh]`` the ``sub_norm`` RmsNorm's weight; ``num_heads`` H
    (the output heads); ``lambda_init``, ``scale`` (``Dh ** -0.5``), ``norm_eps`` (timm: 1e-5). Returns
    ``[B, T, H * 2 Dh]`` in qkv's dtype. More: docs/kernels.md, section Differential attention."""
    return _diff_attention(qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, norm_eps)


# ---------------------------------------------------------------------------------- reference
def diff_attention_ref(
    qkv: torch.Tensor,
    lambda_full: torch.Tensor,
    norm_weight: torch.Tensor,
    num_heads: int,
    lambda_init: float,
    scale: float | None = None,
    norm_eps: float = 1e-5,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager differential attention, written as timm's ``DiffAttention.forward`` (its non-fused path) from the qkv
    output to before ``norm``: ``[B, T, 3 D] -> [B, T, D]``. ``upcast=False`` computes in qkv's dtype (eager
    PyTorch's error, what a kernel is judged against); ``upcast=True`` computes float16 / bfloat16 in float32 and
    casts back. For a float64 reference pass float64 tensors."""
    batch, tokens, width = qkv.shape
    head_dim = width // (6 * num_heads)
    scale = head_dim**-0.5 if scale is None else scale
    dtype = qkv.dtype
    if upcast and dtype in (torch.float16, torch.bfloat16):
        qkv, norm_weight = qkv.float(), norm_weight.float()
    q, k, v = qkv.chunk(3, dim=2)
    q = q.reshape(batch, tokens, 2 * num_heads, head_dim).transpose(1, 2)
    k = k.reshape(batch, tokens, 2 * num_heads, head_dim).transpose(1, 2)
    v = v.reshape(batch, tokens, num_heads, 2 * head_dim).transpose(1, 2)
    lam = lambda_full.reshape(()).to(q.dtype)
    attn = ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1).view(batch, num_heads, 2, tokens, tokens)
    x = (attn[:, :, 0] - lam * attn[:, :, 1]) @ v  # [B, H, T, 2 Dh]
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm_eps) * norm_weight
    x = x * (1 - lambda_init)
    return x.transpose(1, 2).reshape(batch, tokens, width // 3).to(dtype)


# ---------------------------------------------------------------------------------- compile-check variants
# what tools/compile_check.py compiles of this kernel (KERNELS[name].compile_variants / .compile_launch): its
# cases (kernel, label, params, which configs) per variant set, and one launch per case recorded through v.record;
# ``v`` is the tool's vocabulary (DTYPES, PICK_MODELS, PICK_BATCHES, EVERY_CONFIG_DTYPES, which, empty, torch_dtype)
#: q/k head dim -> heads of timm's differential attention (output heads are 2 x head dim wide); 32: vit_dwee /
#: vit_dlittle (4 and 5 heads of 2 x 32), 128: the kernel's MAX_HEAD_DIM (v heads of 256)
_DIFF_HEADS = {16: 2, 32: 4, 64: 6, 128: 2}


def compile_variants(v, variant_set: str, full: bool) -> list[tuple]:
    if variant_set == "picks":  # not in ViT-S/16 or ViT-B/16
        return []
    if variant_set == "vit-b16":  # not in ViT-B/16: vit_dwee_patch16_reg1_gap_256's (4 heads of 2 x 32, T 257)
        return [
            ("diff_attention", f"{dtype} Dh32 T257 b8", {"dtype": dtype, "head_dim": 32, "B": 8}, "pick")
            for dtype in v.DTYPES
        ]
    cases = []
    for head_dim, dtype in itertools.product(_DIFF_HEADS, v.DTYPES):
        which = "all" if full else ("kept" if dtype in v.EVERY_CONFIG_DTYPES else "pick")
        label = f"{dtype} Dh{head_dim} T257 b8"
        cases.append(("diff_attention", label, {"dtype": dtype, "head_dim": head_dim, "B": 8}, which))
    return cases


def compile_launch(v, params: dict) -> tuple:
    B, T, Dh, dtype = params.get("B", 8), 257, params["head_dim"], params["dtype"]
    H = _DIFF_HEADS[Dh]
    return v.record(
        launch_diff_attention,
        v.empty((B, T, 3 * H * 2 * Dh), dtype),
        v.empty((), "fp32"),
        v.empty((2 * Dh,), dtype),
        H,
        0.5,
    )


__all__ = ["diff_attention", "diff_attention_ref", "launch_diff_attention"]
