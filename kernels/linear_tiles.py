"""The GEMM's output tile: which tiles run on which card, and what one tile computes.

The autotune candidates, their prune and the no-autotune heuristic (host side, read by the kernel in
:mod:`.linear`), then the ``@triton.jit`` body of one output tile: the norm prologue, the K loop, the epilogue.
Why these tiles: docs/kernels.md, "GEMM tiles by row count"."""

from __future__ import annotations

import itertools

import triton
import triton.language as tl

from vit_fast.base.cards import CPU_SM_COUNT
from vit_fast.base.interpret import interpreter_enabled

from ._launch import cdiv, next_power_of_2
from ._tl import dot, to_bf16_rtne
from .activations import ACTIVATION_CODES, ACTIVATIONS, GATED, gate_code, gate_split
from .autotune import (
    FMA_STAGES,
    SMALL_M,
    closest_config,
    gemm_prune_target,
    tma_enabled,
    tuning_requested,
)


def linear_configs() -> list[triton.Config]:
    """Autotune candidates. Built from the environment only (never a device query), so importing
    this module touches no GPU driver; the prune keeps those that suit the card of the tensors' device. The
    interpreter cannot time configs: it gets one of each tiling, and the prune's heuristic picks between them
    (the persistent TMA one for many rows, so the tests run both)."""
    if interpreter_enabled():
        return [
            triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "TMA": tma}, num_warps=4)
            for tma in (0, 1)
        ]
    return (
        [
            triton.Config(
                {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 8, "TMA": 0},
                num_warps=8 if block_m * block_n >= 128 * 128 else 4,
                num_stages=num_stages,
            )
            for block_m in (64, 128)
            for block_n in (64, 128, 256)
            for block_k in (32, 64)
            for num_stages in (3, 4)
            # a trim of the search space, not the hardware limit: fp16 tiles of both operands, one per stage,
            # within 160 KB (the card's limit is applied per dtype by prune_linear_configs)
            if (block_m + block_n) * block_k * 2 * num_stages <= 160 * 1024
            # 128x256 spilled in every dtype in the GELU and residual epilogues (16-bit: 88-976 bytes on
            # triton 3.6 and 3.9; tools/compile_check.py)
            and block_m * block_n <= 128 * 128
        ]
        + [
            # narrow tiles for few rows (M <= SMALL_M, batch 1-2 of a ViT): at M = 197 a 64x64 tiling gives the
            # D -> D GEMMs (proj, fc2 of ViT-B/16) only 48 programs for 132 SMs; 64x16 gives 192
            triton.Config(
                {"BLOCK_M": 64, "BLOCK_N": block_n, "BLOCK_K": 64, "GROUP_M": 8, "TMA": 0}, num_warps=4, num_stages=4
            )
            for block_n in (16, 32)
        ]
        + [
            # persistent tiles fed by the tensor-memory accelerator (TMA: cp.async.bulk.tensor on sm_90), as in Triton's
            # persistent-matmul tutorial: one program per SM walks the output tiles; for many rows (M > SMALL_M)
            # (128x256 spilled 0.5-1.1 KB in the GELU and residual epilogues, as the pointer tiles do)
            triton.Config(
                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "TMA": 1},
                num_warps=8,
                num_stages=num_stages,
            )
            for num_stages in (3, 4)
        ]
        + [
            # cards without tensor cores (sm_75: tl.dot is FMA there) get only these, and only they run there: the
            # tiles above spill 1.2-28.8 KB per thread on sm_75 (offline compiles, tools/compile_check.py). Small tiles, 4 warps,
            # 32 deep, 2 stages: 8-16 KB of shared memory on sm_75, and the prune keeps those not expected to
            # spill in the dtype (autotune.fma_tile_fits: 16-bit 64x64 spilled, 32x64 did not)
            triton.Config(
                {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 32, "GROUP_M": 8, "TMA": 0},
                num_warps=4,
                num_stages=FMA_STAGES,
            )
            for block_m in (32, 64)
            for block_n in (32, 64)
        ]
    )


def prune_linear_configs(configs, named_args, **kwargs):
    """The candidates for one launch, read only from its autotune key (row class ``m_class(M)``, N, K, the card
    ``ARCH``, dtype, ``TMA_OK``, ``TUNE``, the device's ``SM_COUNT``), so what the autotuner caches under that key
    holds for every launch with it. Drops configs for the other kind of card, tiles far larger than the problem or
    past its shared memory, narrow tiles past SMALL_M rows, and TMA tiles where TMA cannot run; without tuning, one
    config: :func:`heuristic_linear_config`. Each rule: docs/kernels.md, section Prunes and picks."""
    card, elem_bytes, rows, gemm_fits = gemm_prune_target(named_args, "x_ptr", "BLOCK_N")
    operands_ok = named_args.get("TMA_OK")
    operands_ok = tma_enabled() if operands_ok is None else bool(operands_ok)
    # 16-bit only: fp32 TMA tiles spill tens of KB and overflow shared memory (tools/compile_check.py)
    tma_ok = rows > SMALL_M and elem_bytes == 2 and card.tma and operands_ok

    def fits(config: triton.Config) -> bool:
        kw = config.kwargs
        return (
            gemm_fits(config)
            and (not kw["TMA"] or tma_ok)
            and kw["BLOCK_M"] <= max(64, next_power_of_2(rows))
            and kw["BLOCK_N"] <= max(64, next_power_of_2(named_args["N"]))
            and kw["BLOCK_K"] <= max(32, next_power_of_2(named_args["K"]))
        )

    kept = [c for c in configs if fits(c)] or configs[:1]
    if (tuning_requested(named_args) and not interpreter_enabled()) or len(kept) == 1:
        return kept
    programs = named_args.get("SM_COUNT", CPU_SM_COUNT)
    gated = bool(kwargs.get("GATE", named_args.get("GATE", 0)))
    return [heuristic_linear_config(kept, rows, named_args["N"], elem_bytes, card, programs, gated)]


def heuristic_linear_config(
    configs: list[triton.Config], rows: int, N: int, elem_bytes: int, card, programs: int, gated: bool = False
) -> triton.Config:
    """The no-autotune pick (the default, and the interpreter's), among the prune's survivors for ``rows`` (a row
    class: a multiple of 64 up to SMALL_M), the nearest fitting survivor (:func:`closest_config`) to: few rows,
    64-row tiles as wide as still give ``programs`` programs (the device's SM count); many rows, 128x128 with 8
    warps, persistent with TMA where the operands allow it (``gated``: two accumulators, 64-row tiles, or 4 TMA
    stages); a card without tensor cores, its own small tiles. Each case: docs/kernels.md, Prunes and picks."""
    if not card.tensor_cores:
        block_n = 64 if rows > SMALL_M or cdiv(rows, 64) * cdiv(N, 64) >= programs else 32
        return closest_config(configs, {"BLOCK_M": 64, "BLOCK_N": block_n, "BLOCK_K": 32}, 4, FMA_STAGES)
    if any(c.kwargs["TMA"] for c in configs):
        # gated: 3 stages spilled 8-24 bytes on sm_90 with the LN prologue, 4 none (RMS: 16 at 4 stages; compile_check)
        return closest_config(configs, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1}, 8, 4 if gated else 3)
    block_k = 32 if elem_bytes == 4 else 64
    if rows <= SMALL_M:
        row_tiles = rows // 64
        # fp32 stops at 32 columns: with the LayerNorm prologue and GELU its 64x64 tiles spilled on sm_80/86/90
        # (64 deep: 496-2076 bytes per thread, triton 3.6 and 3.9; 32 deep: 16 on sm_80, 3.9), 64x32x64 and 64x16x64
        # nothing on sm_80/86/89/90/120 (64x32: 72 bytes on sm_100, 3.6) (tools/compile_check.py, ViT-B/16)
        widths = (32,) if elem_bytes == 4 else (64, 32)
        block_n = next((bn for bn in widths if row_tiles * cdiv(N, bn) >= programs), 16)
        # 64 deep whatever the dtype: the narrow tiles come only so (fp32 64x32x64, 4 stages: 72 KB of shared memory)
        return closest_config(configs, {"BLOCK_M": 64, "BLOCK_N": block_n, "BLOCK_K": 64}, 4, 4)
    if gated:
        # two fp32 accumulators: 128x128 spilled 380-548 bytes on sm_80 in every dtype; 64x128x64 (16-bit) and
        # 64x64x64 (fp32) with 4 warps spilled nothing on sm_80 (sm_90 fp32 with LN: 112 B; tools/compile_check.py)
        return closest_config(configs, {"BLOCK_M": 64, "BLOCK_N": 64 if elem_bytes == 4 else 128, "BLOCK_K": 64}, 4, 3)
    return closest_config(configs, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": block_k}, 8, 3)


@triton.jit
def activate(acc, ACTIVATION: tl.constexpr):
    """The epilogue's activation on an fp32 tile (``ACTIVATION_CODES``; 0 leaves it as it is)."""
    if ACTIVATION == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    elif ACTIVATION == 2:
        # 0.5 * (1 + tanh(z)) == sigmoid(2z): no tanh needed. The clamp keeps exp finite (e^80 < fp32 max)
        # where the result is already x / 5e34, i.e. -0 to fp32 rounding at any x that gets there
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc / (1.0 + tl.exp(tl.minimum(-2.0 * inner, 80.0)))
    elif ACTIVATION == 3:  # QuickGELU: y * sigmoid(1.702 y), the same clamp as above
        acc = acc / (1.0 + tl.exp(tl.minimum(-1.702 * acc, 80.0)))
    elif ACTIVATION == 4:  # SiLU: y * sigmoid(y)
        acc = acc / (1.0 + tl.exp(tl.minimum(-acc, 80.0)))
    return acc


@triton.jit
def linear_tile(
    tile,  # which output tile: grouped ordering over [cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)]
    x_desc,  # TMA descriptors of x [M, K] and w [N, K] when USE_TMA, else None
    w_desc,
    x_ptr,
    w_ptr,
    bias_ptr,
    residual_ptr,
    gamma_ptr,
    ln_w_ptr,
    ln_b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_x_m,
    stride_w_n,
    stride_residual_m,
    stride_out_m,
    ln_eps,
    ACTIVATION: tl.constexpr,
    GATE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_GAMMA: tl.constexpr,
    NORM_INPUT: tl.constexpr,
    LN_HAS_WEIGHT: tl.constexpr,
    LN_HAS_BIAS: tl.constexpr,
    LN_RMS: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] output tile: (LayerNorm prologue,) the K loop, the epilogue, the store."""
    # grouped ordering: consecutive tiles share weight columns while they are hot in L2
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile % num_pid_in_group) % group_size_m)
    pid_n = (tile % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # rows/columns past the tail wrap onto valid ones: loads stay in bounds without an M or N
    # mask, and the store below drops them. int64: M * K overflows int32 at large batch.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * stride_x_m + offs_k[None, :]
    w_ptrs = w_ptr + cols[None, :] * stride_w_n + offs_k[:, None]  # W^T tile [BLOCK_K, BLOCK_N]

    if NORM_INPUT:
        # LayerNorm prologue: this program's rows' statistics over all of K, two passes in fp32 as the
        # LayerNorm kernel takes them (not E[x^2] - E[x]^2, which cancels badly). The rows are re-read
        # from L2 by every program along N: cheaper than a LayerNorm launch plus a round trip of LN(x).
        # (RmsNorm: no mean pass; the mean stays 0, so the second pass sums squares and nothing is subtracted)
        row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        if not LN_RMS:
            for k0 in range(0, K, BLOCK_K):
                k_mask = offs_k < K - k0
                row_sum += tl.sum(tl.load(x_ptrs + k0, mask=k_mask[None, :], other=0.0).to(tl.float32), axis=1)
        mean = row_sum / K
        row_var = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = offs_k < K - k0
            xs = tl.load(x_ptrs + k0, mask=k_mask[None, :], other=0.0).to(tl.float32)
            centred = tl.where(k_mask[None, :], xs - mean[:, None], 0.0)
            row_var += tl.sum(centred * centred, axis=1)
        rstd = 1.0 / tl.sqrt(row_var / K + ln_eps)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # GATE: the second half of the stacked weight (rows N..2N) into a second accumulator, the same x tile
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # dead code unless GATE
    for k0 in range(0, K, BLOCK_K):
        # the K tail must read zeros: unlike M and N it feeds every output element (TMA fills past the edge with 0)
        k_mask = offs_k < K - k0
        if USE_TMA:
            a = x_desc.load([pid_m * BLOCK_M, k0])
        else:
            a = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
        if NORM_INPUT:
            normed = (a.to(tl.float32) - mean[:, None]) * rstd[:, None]
            if LN_HAS_WEIGHT:
                normed = normed * tl.load(ln_w_ptr + k0 + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
            if LN_HAS_BIAS:
                normed = normed + tl.load(ln_b_ptr + k0 + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
            normed = tl.where(k_mask[None, :], normed, 0.0)
            # rounded to x's dtype, as the unfused LayerNorm stores it: the dot sees the same operand
            a = to_bf16_rtne(normed) if ROUND_BF16 else normed.to(x_ptr.dtype.element_ty)
        if USE_TMA:
            b = w_desc.load([pid_n * BLOCK_N, k0]).T  # [BLOCK_N, BLOCK_K] rows of W, as W^T
        else:
            b = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        acc = dot(a, b, acc, DOT_IN_FP32)
        if GATE:
            if USE_TMA:
                b2 = w_desc.load([N + pid_n * BLOCK_N, k0]).T
            else:
                b2 = tl.load(w_ptrs + N * stride_w_n, mask=k_mask[:, None], other=0.0)
            acc2 = dot(a, b2, acc2, DOT_IN_FP32)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    n_mask = offs_n < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if GATE:
            acc2 += tl.load(bias_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if GATE == 1:  # act(x1) * x2: SwiGLU
        acc = activate(acc, ACTIVATION) * acc2
    elif GATE == 2:  # x1 * act(x2): timm's GluMlp with gate_last
        acc = acc * activate(acc2, ACTIVATION)
    else:
        acc = activate(acc, ACTIVATION)
    out_mask = (offs_m[:, None] < M) & n_mask[None, :]
    if HAS_RESIDUAL:
        if HAS_GAMMA:
            acc = acc * tl.load(gamma_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        residual = tl.load(residual_ptr + rows[:, None] * stride_residual_m + offs_n[None, :], mask=out_mask, other=0.0)
        acc += residual.to(tl.float32)
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_out_m + offs_n[None, :]
    out = to_bf16_rtne(acc) if ROUND_BF16 else acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptrs, out, mask=out_mask)


# ---------------------------------------------------------------------------------- compile-check variants
# what tools/compile_check.py compiles of this kernel (KERNELS[name].compile_variants / .compile_launch): its
# cases (kernel, label, params, which configs) per variant set, and one launch per case recorded through v.record;
# ``v`` is the tool's vocabulary (DTYPES, PICK_MODELS, PICK_BATCHES, EVERY_CONFIG_DTYPES, which, empty, torch_dtype)
# (label, (M, N, K), activation, bias, residual, gamma): "ln+" labels have the LayerNorm prologue
# (layer_norm_linear: LN1 -> qkv, LN2 -> fc1)
def _vit_b16_gemms(b: int, D: int = 768, tag: str = ""):
    """A ViT block's four GEMMs at batch ``b`` (197 tokens) and width ``D`` (ViT-B/16's 768 by default);
    ``tag`` goes into the labels after the GEMM's name."""
    M = 197 * b
    return (
        (f"ln+qkv{tag} b{b} none+bias", (M, 3 * D, D), "none", True, False, False),
        (f"proj{tag} b{b} bias+res", (M, D, D), "none", True, True, False),
        (f"ln+fc1{tag} b{b} gelu+bias", (M, 4 * D, D), "gelu", True, False, False),
        (f"fc2{tag} b{b} bias+res", (M, D, 4 * D), "none", True, True, False),
    )


#: ViT-B/16's GEMMs whose every kept config is checked (the others: the heuristic's pick only): the LayerNorm
#: prologue with the erf GELU epilogue, the heaviest in registers (the prune reads shapes only, so it keeps the same
#: tiles for all four; each prologue / epilogue is tuned among them on its own: its flags are in the autotune key)
_VIT_B16_EVERY_CONFIG = ("ln+fc1",)

# the sweep: the ViT-B/16 block's GEMMs at batch 8 with every epilogue, and batch 1's narrow tiles
_LINEAR_VARIANTS = (
    ("qkv none+bias", (1576, 2304, 768), "none", True, False, False),
    ("ln+qkv none+bias", (1576, 2304, 768), "none", True, False, False),
    ("ln+fc1 gelu+bias", (1576, 3072, 768), "gelu", True, False, False),
    # batch 1 (197 rows): the narrow small-M tiles (BLOCK_N 16 / 32) are candidates only here
    ("ln+qkv b1 none+bias", (197, 2304, 768), "none", True, False, False),
    ("fc2 b1 bias+res+gamma", (197, 768, 3072), "none", True, True, True),
    ("fc1 gelu+bias", (1576, 3072, 768), "gelu", True, False, False),
    ("fc1 gelu_tanh+bias", (1576, 3072, 768), "gelu_tanh", True, False, False),
    # OpenAI CLIP's QuickGELU and SwiGLU's SiLU (timm / HF models patched in place run these epilogues)
    ("fc1 quick_gelu+bias", (1576, 3072, 768), "quick_gelu", True, False, False),
    ("fc1 silu+bias", (1576, 3072, 768), "silu", True, False, False),
    ("fc2 bias+res+gamma", (1576, 768, 3072), "none", True, True, True),
    # the RmsNorm prologue (LN_RMS: timm's xp ViTs, ParallelScalingBlock's in_proj as fc1 and qkv GEMMs; no qkv bias)
    ("rms+qkv none", (1576, 2304, 768), "none", False, False, False),
    ("rms+fc1 gelu+bias", (1576, 3072, 768), "gelu", True, False, False),
    ("rms+qkv b1 none", (197, 2304, 768), "none", False, False, False),
    # SwiGLU's gated epilogue (two accumulators: the register-heaviest GEMM; N is the output's width, the weight
    # stacks 2N rows): EVA-02 / AIMv2 fc1 behind a LayerNorm or RmsNorm, DINOv2 giant's GluMlp (gate last)
    ("ln+fc1 silu_glu+bias", (1576, 2048, 768), "silu_glu", True, False, False),
    ("rms+fc1 silu_glu", (1576, 2048, 768), "silu_glu", False, False, False),
    ("ln+fc1 b1 silu_glu_last+bias", (197, 2048, 768), "silu_glu_last", True, False, False),
)
# every config for the heaviest epilogues (erf GELU; residual + LayerScale); the others on two tiles unless --full
_LINEAR_EVERY_CONFIG = ("fc1 gelu+bias", "fc2 bias+res+gamma", "ln+fc1 gelu+bias", "ln+fc1 silu_glu+bias")


def compile_variants(v, variant_set: str, full: bool) -> list[tuple]:
    cases = []
    if variant_set == "picks":
        for dtype, (_, D, _), b in itertools.product(v.DTYPES, v.PICK_MODELS, v.PICK_BATCHES):
            for variant in _vit_b16_gemms(b, D, f" D{D}"):
                cases.append(("linear", f"{dtype} {variant[0]}", {"dtype": dtype, "variant": variant}, "pick"))
        return cases
    if variant_set == "vit-b16":
        for dtype, b in itertools.product(v.DTYPES, (1, 8)):
            for variant in _vit_b16_gemms(b):
                every = variant[0].split()[0] in _VIT_B16_EVERY_CONFIG
                which = v.which(dtype) if every else "pick"
                cases.append(("linear", f"{dtype} {variant[0]}", {"dtype": dtype, "variant": variant}, which))
        return cases
    for variant, dtype in itertools.product(_LINEAR_VARIANTS, v.DTYPES):
        name = variant[0]
        if full:
            which = "all"
        elif " b1 " in name:
            which = "narrow"  # batch 1: the narrow tiles only batch 1-2 gets
        elif name in _LINEAR_EVERY_CONFIG:
            which = "kept"
        else:
            which = "ends"  # epilogue-only variants: the smallest and largest tile
        cases.append(("linear", f"{dtype} {name}", {"dtype": dtype, "variant": variant}, which))
    return cases


def compile_launch(v, params: dict) -> tuple:
    from .linear import launch_linear

    name, (M, N, K), act, has_bias, has_res, has_gamma = params["variant"]
    dtype = params["dtype"]
    ln = (
        {"ln_weight": v.empty((K,), dtype), "ln_bias": v.empty((K,), dtype), "ln_eps": 1e-6}
        if name[:3] == "ln+"
        else {}
    )
    if name[:4] == "rms+":  # timm's RmsNorm: a weight, no bias
        ln = {"ln_weight": v.empty((K,), dtype), "ln_eps": 1e-6, "ln_rms": True}
    rows = 2 * N if "_glu" in act else N  # a gated GEMM's weight and bias stack its two halves
    return v.record(
        launch_linear,
        v.empty((M, K), dtype),
        v.empty((rows, K), dtype),
        v.empty((rows,), dtype) if has_bias else None,
        None if act == "none" else act,
        v.empty((M, N), dtype) if has_res else None,
        v.empty((N,), dtype) if has_gamma else None,
        **ln,
    )


__all__ = [
    "ACTIVATIONS",
    "ACTIVATION_CODES",
    "GATED",
    "activate",
    "gate_code",
    "gate_split",
    "heuristic_linear_config",
    "linear_configs",
    "linear_tile",
    "prune_linear_configs",
]
