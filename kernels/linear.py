"""GEMM with fused epilogues: ``y = act(x @ W^T + b)``, then ``residual + gamma * y``.

One kernel covers every linear layer of a ViT block: qkv (+bias), proj (+bias +residual
+LayerScale), fc1 (+bias +GELU) and fc2 (+bias +residual +LayerScale); with a LayerNorm prologue
(:func:`layer_norm_linear`) it also takes the LayerNorm before qkv and fc1, so a block is 5 launches; the same
prologue in its RMS mode (:func:`rms_norm_linear`: no mean subtracted, the mean square as the statistic) takes timm's
RmsNorm before a GEMM, so RmsNorm is folded too, never a launch of its own. Accumulation and the
whole epilogue are fp32; the output is rounded once, to x's dtype.

Two tilings, chosen for the card of the tensors' device (``cards``) by a heuristic (the default) or, when tuning,
by the autotuner: one program per output tile with pointer loads (narrow tiles for few rows; small tiles only on
a card without tensor cores), and for many rows of 16-bit operands a persistent kernel, one program per SM
walking the tiles, its x and W tiles loaded by TMA descriptors (the bulk tensor copy of sm_90 and newer).

Top to bottom: the autotune configs, the tile body and the kernel, the launcher :func:`launch_linear` (input
checks, reshape, allocation, grid), the ``torch.library`` custom op ``vit_fast::linear`` (fake
implementation + autograd), the public :func:`linear` and the eager reference :func:`linear_ref`.
Backward is not a kernel: it recomputes the forward through the eager reference, in fp32 for half
inputs (``_launch.register_recompute_backward``).

Importing this module never touches a GPU driver.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._launch import (
    cdiv,
    check_device,
    define_op,
    dot_in_fp32,
    ensure_scratch_allocator,
    interpret_bf16,
    next_power_of_2,
)
from ._tl import dot, to_bf16_rtne
from .autotune import (
    FMA_STAGES,
    SMALL_M,
    autotune_cache_enabled,
    closest_config,
    fma_tile_fits,
    gemm_shared_bytes,
    m_class,
    persistent_programs,
    tma_enabled,
    tma_usable,
    tune_key,
    tuning_requested,
)
from .cards import CPU_SM_COUNT, card_for_arch, tensor_arch, tensor_sm_count
from .interpret import interpreter_enabled
from .launches import SUPPORTED_DTYPES, ResolvedLaunches

#: the epilogue's activations: exact (erf) GELU, tanh GELU, QuickGELU (``y * sigmoid(1.702 y)``, OpenAI CLIP) and
#: SiLU (``y * sigmoid(y)``)
ACTIVATIONS = (None, "gelu", "gelu_tanh", "quick_gelu", "silu")
_ACTIVATION_CODE = {None: 0, "gelu": 1, "gelu_tanh": 2, "quick_gelu": 3, "silu": 4}


def _linear_configs() -> list[triton.Config]:
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
            # within 160 KB (the card's limit is applied per dtype by _prune_linear_configs)
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
            # tiles above spill 1.2-28.8 KB per thread on sm_75 (issue 19's offline compiles). Small tiles, 4 warps,
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


def _prune_linear_configs(configs, named_args, **kwargs):
    """The candidates for one launch, read only from its autotune key (row class ``m_class(M)``, N, K, the card
    ``ARCH``, dtype, ``TMA_OK``, ``TUNE``, the device's ``SM_COUNT``), so what the autotuner caches under that key
    holds for every launch with it. Drops: configs for the other kind of card (tensor cores or not,
    :data:`FMA_STAGES`); tiles far larger than the problem (e.g. BLOCK_N 256 for N = 64: only masked work); the
    narrow tiles past SMALL_M rows; tiles past the card's shared memory (:func:`gemm_shared_bytes`); the
    persistent TMA tiles unless the card has TMA, the rows are many (M > SMALL_M), the operands 16-bit and TMA can
    read them (``TMA_OK``: alignment and ``VIT_FAST_TMA``; a direct call without it, as tools/compile_check.py
    makes, means contiguous operands). Without tuning, one config: :func:`_heuristic_linear_config` (a direct call
    without ``SM_COUNT`` reads as :data:`~.cards.CPU_SM_COUNT`)."""
    card = card_for_arch(named_args["ARCH"])
    x = named_args.get("x_ptr")
    elem_bytes = x.element_size() if isinstance(x, torch.Tensor) else 2
    rows = m_class(named_args["M"])
    operands_ok = named_args.get("TMA_OK")
    operands_ok = tma_enabled() if operands_ok is None else bool(operands_ok)
    # 16-bit only: fp32 TMA tiles spill tens of KB and overflow shared memory (tools/compile_check.py)
    tma_ok = rows > SMALL_M and elem_bytes == 2 and card.tma and operands_ok

    def fits(config: triton.Config) -> bool:
        kw = config.kwargs
        return (
            (config.num_stages > FMA_STAGES) == card.tensor_cores
            and (card.tensor_cores or fma_tile_fits(kw["BLOCK_M"], kw["BLOCK_N"], elem_bytes))
            and (not kw["TMA"] or tma_ok)
            and (kw["BLOCK_N"] >= 64 or rows <= SMALL_M or not card.tensor_cores)
            and kw["BLOCK_M"] <= max(64, next_power_of_2(rows))
            and kw["BLOCK_N"] <= max(64, next_power_of_2(named_args["N"]))
            and kw["BLOCK_K"] <= max(32, next_power_of_2(named_args["K"]))
            and gemm_shared_bytes(card, config, kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], elem_bytes)
            <= card.shared_memory
        )

    kept = [c for c in configs if fits(c)] or configs[:1]
    if (tuning_requested(named_args) and not interpreter_enabled()) or len(kept) == 1:
        return kept
    programs = named_args.get("SM_COUNT", CPU_SM_COUNT)
    return [_heuristic_linear_config(kept, rows, named_args["N"], elem_bytes, card, programs)]


def _heuristic_linear_config(
    configs: list[triton.Config], rows: int, N: int, elem_bytes: int, card, programs: int
) -> triton.Config:
    """The no-autotune pick (the default, and the interpreter's), among the prune's survivors for ``rows`` (a row
    class: a multiple of 64 up to SMALL_M). Few rows (batch 1-2 of a ViT): 64-row tiles, and the widest of
    64 / 32 / 16 columns (fp32: 32 / 16, for registers) that still gives ``programs`` programs (the device's SM
    count: every SM busy). Many rows: 128x128 with 8 warps, persistent with TMA where the operands allow it (else
    the pointer tiling, fp32 at half the depth for shared memory). A card without tensor cores: its own small
    tiles, 64x64 (64x32 if that fills the GPU better at few rows; 16-bit: the prune leaves at most 32x64). Always
    the nearest fitting survivor (:func:`closest_config`)."""
    if not card.tensor_cores:
        block_n = 64 if rows > SMALL_M or cdiv(rows, 64) * cdiv(N, 64) >= programs else 32
        return closest_config(configs, {"BLOCK_M": 64, "BLOCK_N": block_n, "BLOCK_K": 32}, 4, FMA_STAGES)
    if any(c.kwargs["TMA"] for c in configs):
        return closest_config(configs, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1}, 8, 3)
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
    return closest_config(configs, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": block_k}, 8, 3)


@triton.jit
def _linear_tile(
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
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    n_mask = offs_n < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
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
    out_mask = (offs_m[:, None] < M) & n_mask[None, :]
    if HAS_RESIDUAL:
        if HAS_GAMMA:
            acc = acc * tl.load(gamma_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        residual = tl.load(residual_ptr + rows[:, None] * stride_residual_m + offs_n[None, :], mask=out_mask, other=0.0)
        acc += residual.to(tl.float32)
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_out_m + offs_n[None, :]
    out = to_bf16_rtne(acc) if ROUND_BF16 else acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptrs, out, mask=out_mask)


@triton.autotune(
    configs=_linear_configs(),
    key=[
        # everything _prune_linear_configs reads (the autotuner adds the tensors' dtypes itself)
        *("M_CLASS", "N", "K", "ARCH", "TMA_OK", "TUNE", "SM_COUNT"),
        # every constexpr the configs do not set: each prologue / epilogue is code of its own, with its own register
        # pressure and best tile, so each gets its own tuning, in memory and on disk (tests/kernels/test_autotune_mode.py)
        *("ACTIVATION", "HAS_BIAS", "HAS_RESIDUAL", "HAS_GAMMA", "NORM_INPUT", "LN_HAS_WEIGHT", "LN_HAS_BIAS"),
        *("LN_RMS", "DOT_IN_FP32", "ROUND_BF16"),
    ],
    prune_configs_by={"early_config_prune": _prune_linear_configs},
    cache_results=autotune_cache_enabled(),
)
@triton.jit(do_not_specialize=["M_CLASS", "ARCH", "TMA_OK", "TUNE", "SM_COUNT"])  # key-only: never specialised
def _linear_kernel(
    x_ptr,  # [M, K] activations; unit stride along K
    w_ptr,  # [N, K] weight in nn.Linear layout; unit stride along K
    bias_ptr,  # [N] bias, read only when HAS_BIAS
    residual_ptr,  # [M, N] residual stream, read only when HAS_RESIDUAL; unit stride along N
    gamma_ptr,  # [N] LayerScale, read only when HAS_GAMMA
    ln_w_ptr,  # [K] LayerNorm weight of the input, read only when NORM_INPUT and LN_HAS_WEIGHT
    ln_b_ptr,  # [K] LayerNorm bias of the input, read only when NORM_INPUT and LN_HAS_BIAS
    out_ptr,  # [M, N] output, unit stride along N
    M,  # rows: all leading dims of x flattened (B * T: rarely a multiple of the tile)
    N,  # output features
    K,  # input features
    stride_x_m,  # elements between rows of x (TMA: a multiple of 16 bytes)
    stride_w_n,  # elements between rows of w (TMA: a multiple of 16 bytes)
    stride_residual_m,  # elements between rows of residual
    stride_out_m,  # elements between rows of out
    M_CLASS,  # autotune.m_class(M), never read: the autotune key, so a new batch size reuses its class's tuning
    ARCH,  # compute capability of the tensors' device (cards.tensor_arch), never read: the prune's card
    TMA_OK,  # 1 if a persistent TMA config may run here (many rows, 16-bit, TMA-readable operands), never read
    TUNE,  # autotune.tune_key(): 1 while tuning, never read: a heuristic pick never answers a tuned request
    SM_COUNT,  # SMs of the tensors' device (cards.tensor_sm_count), never read: the programs the heuristic fills
    ln_eps,  # LayerNorm epsilon, read only when NORM_INPUT (a Python float under the interpreter: no .to())
    ACTIVATION: tl.constexpr,  # 0: none, 1: exact (erf) GELU, 2: tanh GELU, 3: QuickGELU, 4: SiLU
    HAS_BIAS: tl.constexpr,  # add bias before the activation
    HAS_RESIDUAL: tl.constexpr,  # out = residual + (gamma *) y
    HAS_GAMMA: tl.constexpr,  # scale y by gamma before the residual add
    NORM_INPUT: tl.constexpr,  # LayerNorm the rows of x first (prologue): the op is linear(LN(x))
    LN_HAS_WEIGHT: tl.constexpr,  # the LayerNorm has a weight (elementwise affine)
    LN_HAS_BIAS: tl.constexpr,  # the LayerNorm has a bias
    LN_RMS: tl.constexpr,  # the input norm is RmsNorm: no mean subtracted, normalised by the root mean square
    DOT_IN_FP32: tl.constexpr,  # dot operands as fp32 at IEEE precision (fp32, or bf16 under the interpreter)
    ROUND_BF16: tl.constexpr,  # round the bf16 store by hand (interpreter: its fp32 -> bf16 cast truncates)
    BLOCK_M: tl.constexpr,  # rows of the output tile
    BLOCK_N: tl.constexpr,  # columns of the output tile
    BLOCK_K: tl.constexpr,  # depth of one step along K
    GROUP_M: tl.constexpr,  # output-tile rows walked together, so a weight tile is reused from L2
    TMA: tl.constexpr,  # 1: persistent (each program walks tiles, grid <= SMs), x and w tiles loaded by TMA
):
    if TMA:
        # device-side descriptors (Triton keeps them in scratch memory: _launch.ensure_scratch_allocator); they
        # need 16-byte aligned bases and row strides, which _prune_linear_configs checked
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_x_m, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_w_n, 1], block_shape=[BLOCK_N, BLOCK_K])
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            _linear_tile(
                tile, x_desc, w_desc, x_ptr, w_ptr, bias_ptr, residual_ptr, gamma_ptr, ln_w_ptr, ln_b_ptr, out_ptr,
                M, N, K, stride_x_m, stride_w_n, stride_residual_m, stride_out_m, ln_eps,
                ACTIVATION, HAS_BIAS, HAS_RESIDUAL, HAS_GAMMA, NORM_INPUT, LN_HAS_WEIGHT, LN_HAS_BIAS, LN_RMS,
                DOT_IN_FP32, ROUND_BF16, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, True,
            )  # fmt: skip
    else:
        _linear_tile(
            tl.program_id(0), None, None, x_ptr, w_ptr, bias_ptr, residual_ptr, gamma_ptr, ln_w_ptr, ln_b_ptr, out_ptr,
            M, N, K, stride_x_m, stride_w_n, stride_residual_m, stride_out_m, ln_eps,
            ACTIVATION, HAS_BIAS, HAS_RESIDUAL, HAS_GAMMA, NORM_INPUT, LN_HAS_WEIGHT, LN_HAS_BIAS, LN_RMS,
            DOT_IN_FP32, ROUND_BF16, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, False,
        )  # fmt: skip


_linear_launches = ResolvedLaunches(_linear_kernel)


# ---------------------------------------------------------------------------------- launcher
def _check_linear_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual: torch.Tensor | None,
    gamma: torch.Tensor | None,
) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    for name, tensor in (("x", x), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"linear: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"linear: x dtype {x.dtype} is not supported; use float16, bfloat16 or float32 (e.g. x.to(torch.float16))"
        )
    if x.dim() < 1:
        raise ValueError("linear: x must have at least one dim [..., K], got a scalar")
    if weight.dim() != 2:
        raise ValueError(
            f"linear: weight must be 2-D [N, K] (nn.Linear layout: out_features x in_features), "
            f"got shape {tuple(weight.shape)}"
        )
    n_out, k_in = weight.shape
    if x.shape[-1] != k_in:
        raise ValueError(
            f"linear: x's last dim {x.shape[-1]} != weight's in_features {k_in} (weight is {tuple(weight.shape)}); "
            "weight must be [out_features, in_features] as in nn.Linear (not transposed)"
        )
    if k_in == 0 or n_out == 0:
        raise ValueError(f"linear: weight {tuple(weight.shape)} has an empty dim")
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if gamma is not None and residual is None:
        raise ValueError("linear: gamma (LayerScale) is applied with the residual add only; pass residual= as well")
    optional = {"bias": (bias, (n_out,)), "residual": (residual, (*x.shape[:-1], n_out)), "gamma": (gamma, (n_out,))}
    for name, (tensor, shape) in optional.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"linear: {name} must be a torch.Tensor or None, got {type(tensor).__name__}")
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"linear: {name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}")
    named = {"x": x, "weight": weight, **{name: t for name, (t, _) in optional.items() if t is not None}}
    for name, tensor in named.items():
        if tensor.dtype != x.dtype:
            raise TypeError(
                f"linear: dtypes differ: x is {x.dtype} but {name} is {tensor.dtype}; "
                f"cast them to one dtype (e.g. {name}.to({x.dtype}) or model.to(dtype))"
            )
        if tensor.device != x.device:
            raise ValueError(f"linear: devices differ: x is on {x.device} but {name} is on {tensor.device}")
        if tensor.numel() > 0 and tensor.stride(-1) != 1:
            raise ValueError(
                f"linear: {name}'s last dim must be contiguous (stride 1), got stride {tensor.stride(-1)}; "
                f"call {name}.contiguous() first"
            )
    check_device("linear", x)


def _check_input_norm(
    x: torch.Tensor, ln_weight: torch.Tensor | None, ln_bias: torch.Tensor | None, eps, op: str = "layer_norm_linear"
) -> None:
    """Raise before launch unless the input norm's parameters fit ``x [..., K]`` (``op`` names the caller)."""
    if not isinstance(eps, (float, int)) or isinstance(eps, bool) or not eps > 0:
        raise ValueError(f"{op}: eps must be a positive float, got {eps!r}")
    for name, t in (("ln_weight", ln_weight), ("ln_bias", ln_bias)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if tuple(t.shape) != (x.shape[-1],):
            raise ValueError(f"{op}: {name} must have shape ({x.shape[-1]},), got {tuple(t.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{op}: {name} is {t.dtype} but x is {x.dtype}: pass {name}.to({x.dtype})")
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} must be contiguous; call {name}.contiguous() first")


def launch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
    *,
    ln_weight: torch.Tensor | None = None,
    ln_bias: torch.Tensor | None = None,
    ln_eps: float | None = None,
    ln_rms: bool = False,
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """Check the inputs, then run the kernel once (no autograd, no custom op); returns ``[..., N]``.

    With ``ln_eps`` given, the rows of ``x`` are LayerNormed first inside the kernel (``ln_weight`` /
    ``ln_bias`` ``[K]`` or None): ``linear(LayerNorm(x), ...)`` in one launch; with ``ln_rms=True`` as well, RmsNorm
    instead of LayerNorm: ``linear(RmsNorm(x), ...)``.

    ``checked=True`` skips the checks: only for the custom op, whose one caller (:func:`linear`)
    has just run them, so a forward pays for each check once.

    ``out``, if given, must be a contiguous ``[..., N]`` tensor in x's dtype and device; tests pass
    a NaN-filled one so an element the kernel leaves unwritten is caught.
    """
    if not checked:
        _check_linear_inputs(x, weight, bias, activation, residual, gamma)
        if ln_eps is not None:
            _check_input_norm(x, ln_weight, ln_bias, ln_eps)
    n_out, k_in = weight.shape
    out_shape = (*x.shape[:-1], n_out)
    if out is None:
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != out_shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(
            f"linear: out must be a contiguous {out_shape} {x.dtype} tensor on {x.device}, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device} (contiguous={out.is_contiguous()})"
        )
    rows = out.numel() // n_out
    if rows == 0:
        return out
    # flattening the leading dims is free for the usual [B, T, K] (a view); odd strides copy once
    x2d = x.reshape(rows, k_in)
    residual2d = residual.reshape(rows, n_out) if residual is not None else None

    def grid(meta):
        tiles = cdiv(rows, meta["BLOCK_M"]) * cdiv(n_out, meta["BLOCK_N"])
        return (min(tiles, persistent_programs(x.device)) if meta["TMA"] else tiles,)

    # whether a persistent TMA config may run (the prune's rule; few rows and fp32 never ask for the alignment)
    tma_ok = rows > SMALL_M and x.element_size() == 2 and tma_usable((x2d, x2d.stride(0)), (weight, weight.stride(0)))
    if tma_ok:  # its descriptors live in Triton's scratch memory, which needs an allocator in this thread
        ensure_scratch_allocator()
    _linear_launches(
        grid,
        (),
        x2d,
        weight,
        bias if bias is not None else x2d,  # never read: HAS_BIAS is False
        residual2d if residual2d is not None else x2d,  # never read: HAS_RESIDUAL is False
        gamma if gamma is not None else x2d,  # never read: HAS_GAMMA is False
        ln_weight if ln_weight is not None else x2d,  # never read: LN_HAS_WEIGHT is False
        ln_bias if ln_bias is not None else x2d,  # never read: LN_HAS_BIAS is False
        out,
        rows,
        n_out,
        k_in,
        x2d.stride(0),
        weight.stride(0),
        residual2d.stride(0) if residual2d is not None else 0,
        n_out,
        m_class(rows),
        tensor_arch(x),
        int(tma_ok),
        tune_key(),
        tensor_sm_count(x),
        float(ln_eps) if ln_eps is not None else 0.0,
        ACTIVATION=_ACTIVATION_CODE[activation],
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None,
        HAS_GAMMA=gamma is not None,
        NORM_INPUT=ln_eps is not None,
        LN_HAS_WEIGHT=ln_weight is not None,
        LN_HAS_BIAS=ln_bias is not None,
        LN_RMS=bool(ln_rms),
        DOT_IN_FP32=dot_in_fp32(x.dtype),
        ROUND_BF16=interpret_bf16(x.dtype),
    )
    return out


# ---------------------------------------------------------------------------------- custom ops
def _gemm_output(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual: torch.Tensor | None,
    gamma: torch.Tensor | None,
) -> torch.Tensor:
    return launch_linear(x, weight, bias, activation, residual, gamma, checked=True)


_linear = define_op(
    _linear_op,
    check=_check_linear_inputs,
    empty=lambda x, weight, *_: _gemm_output(x, weight),
    reference=lambda x, weight, bias, activation, residual, gamma: linear_ref(
        x, weight, bias, activation, residual, gamma, upcast=True
    ),
)


def _normed_checks(op: str):
    """The input checks of the GEMM with a norm prologue, in its ops' argument order."""

    def check(x, norm_weight, norm_bias, norm_eps, weight, bias, activation) -> None:
        _check_linear_inputs(x, weight, bias, activation, None, None)
        _check_input_norm(x, norm_weight, norm_bias, norm_eps, op)

    return check


def _layer_norm_linear_op(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    ln_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    return launch_linear(x, weight, bias, activation, ln_weight=ln_weight, ln_bias=ln_bias, ln_eps=ln_eps, checked=True)


_layer_norm_linear = define_op(
    _layer_norm_linear_op,
    check=_normed_checks("layer_norm_linear"),
    empty=lambda x, _w, _b, _eps, weight, *_: _gemm_output(x, weight),
    reference=lambda *args: layer_norm_linear_ref(*args, upcast=True),
)


def _rms_norm_linear_op(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    norm_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    return launch_linear(
        x, weight, bias, activation, ln_weight=norm_weight, ln_bias=norm_bias, ln_eps=norm_eps, ln_rms=True,
        checked=True,
    )  # fmt: skip


_rms_norm_linear = define_op(
    _rms_norm_linear_op,
    check=_normed_checks("rms_norm_linear"),
    empty=lambda x, _w, _b, _eps, weight, *_: _gemm_output(x, weight),
    reference=lambda *args: rms_norm_linear_ref(*args, upcast=True),
)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(x @ weight^T + bias)``, then ``residual + gamma * that`` when residual is given.

    Args:
        x: ``[..., K]`` float16 / bfloat16 / float32, CUDA (or CPU under ``TRITON_INTERPRET=1``),
            unit stride along K.
        weight: ``[N, K]``, nn.Linear layout, x's dtype and device, unit stride along K.
        bias: ``[N]`` or None.
        activation: None, ``"gelu"`` (exact, erf: ``nn.GELU()``), ``"gelu_tanh"``
            (``nn.GELU(approximate="tanh")``), ``"quick_gelu"`` (``y * sigmoid(1.702 y)``) or ``"silu"``.
        residual: ``[..., N]`` (x's leading dims) or None; added after the activation.
        gamma: ``[N]`` LayerScale or None; multiplies the activation output before the residual
            add, so only with ``residual``.

    Returns:
        ``[..., N]`` in x's dtype. Accumulation and epilogue in fp32, one rounding at the end.

    A ``torch.library`` custom op (``vit_fast::linear``) with a fake implementation, so it traces
    under ``torch.compile(fullgraph=True)``. Backward is supported but not fused: it recomputes
    the forward through ``linear_ref`` (fp32 for half inputs) and differentiates that.
    """
    return _linear(x, weight, bias, activation, residual, gamma)


def layer_norm_linear(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    ln_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """``act(LayerNorm(x) @ weight^T + bias)`` in one launch: the GEMM takes each row's LayerNorm
    statistics itself (fp32, two passes) and normalises the tiles it feeds the dot. ``LayerNorm(x)``
    is rounded to x's dtype before the dot, as the unfused ``layer_norm`` then ``linear`` would store it.

    ``x [..., K]``; ``ln_weight`` / ``ln_bias`` ``[K]`` or None; ``ln_eps > 0``; the rest as in
    :func:`linear` (no residual: in a ViT block the LayerNormed GEMMs are qkv and fc1).
    A ``torch.library`` custom op (``vit_fast::layer_norm_linear``); backward recomputes through
    :func:`layer_norm_linear_ref` in fp32.
    """
    return _layer_norm_linear(x, ln_weight, ln_bias, ln_eps, weight, bias, activation)


def rms_norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    norm_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """``act(RmsNorm(x) @ weight^T + bias)`` in one launch, as :func:`layer_norm_linear` with the prologue in its
    RMS mode: each row's mean square in fp32 over all of K, no mean subtracted, ``RmsNorm(x)`` rounded to x's dtype
    before the dot. ``norm_weight`` / ``norm_bias`` ``[K]`` or None (timm's RmsNorm: a weight, no bias).
    A ``torch.library`` custom op (``vit_fast::rms_norm_linear``); backward recomputes through
    :func:`rms_norm_linear_ref` in fp32.
    """
    return _rms_norm_linear(x, norm_weight, norm_bias, norm_eps, weight, bias, activation)


# ---------------------------------------------------------------------------------- reference
def rms_norm_linear_ref(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    norm_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager RmsNorm (timm's ``rms_norm``: ``x * rsqrt(mean(x^2) + eps) * weight``) then :func:`linear_ref`;
    ``upcast`` as there."""
    dtype = x.dtype
    if upcast and dtype in (torch.float16, torch.bfloat16):
        x, norm_weight, norm_bias = (t.float() if t is not None else None for t in (x, norm_weight, norm_bias))
    h = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + norm_eps)
    if norm_weight is not None:
        h = h * norm_weight
    if norm_bias is not None:
        h = h + norm_bias
    return linear_ref(h.to(dtype), weight, bias, activation, upcast=upcast)


def layer_norm_linear_ref(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    ln_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager ``F.layer_norm`` then :func:`linear_ref` (timm's ``mlp(norm2(x))``); ``upcast`` as there."""
    dtype = x.dtype
    if upcast and dtype in (torch.float16, torch.bfloat16):
        x, ln_weight, ln_bias = (t.float() if t is not None else None for t in (x, ln_weight, ln_bias))
    h = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, ln_eps).to(dtype)
    return linear_ref(h, weight, bias, activation, upcast=upcast)


def linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager ``linear``, written as timm's block computes it (``x + ls(mlp(...))``).

    ``upcast=False`` computes in the inputs' dtype, rounding after every op as eager PyTorch
    does (the error a kernel is judged against). ``upcast=True`` computes float16 / bfloat16
    inputs in float32 and casts the result back; float32 and float64 inputs are computed as they
    are. For a float64 reference, pass float64 inputs.
    """
    dtype = x.dtype
    if upcast and dtype in (torch.float16, torch.bfloat16):
        x, weight, bias, residual, gamma = (
            t.float() if t is not None else None for t in (x, weight, bias, residual, gamma)
        )
    y = F.linear(x, weight, bias)
    if activation == "gelu":
        y = F.gelu(y)
    elif activation == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif activation == "quick_gelu":
        y = y * torch.sigmoid(1.702 * y)
    elif activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"linear_ref: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if residual is not None:
        y = residual + (y * gamma if gamma is not None else y)
    return y.to(dtype)


__all__ = [
    "linear",
    "linear_ref",
    "layer_norm_linear",
    "layer_norm_linear_ref",
    "rms_norm_linear",
    "rms_norm_linear_ref",
    "launch_linear",
    "ACTIVATIONS",
]
