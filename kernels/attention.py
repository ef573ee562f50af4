"""Flash-style multi-head attention forward, reading the fused qkv GEMM output in place.

``attention(qkv, num_heads)`` takes ``qkv`` of shape ``[B, T, 3 * H * Dh]`` (the output of a
ViT block's qkv ``nn.Linear``), views it by strides as ``[B, T, 3, H, Dh]`` and writes
``softmax(q k^T * scale) v`` straight into ``[B, T, H * Dh]``, the layout the proj GEMM reads:
no permute and no contiguous copies. The softmax is the online (streaming) one, in fp32, with
fp32 accumulation.

Top to bottom: the autotune configs, the kernel, the launcher :func:`launch_attention` (input
checks, allocation, grid), the ``torch.library`` custom op ``vit_fast::attention`` (fake
implementation + autograd), the public :func:`attention` and the eager reference
:func:`attention_ref`. Backward is not a kernel: it recomputes the forward through the eager
reference, in fp32 for half inputs (``_common.register_recompute_backward``).

Importing this module never touches a GPU driver.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from vit_fast.kernels._common import (
    SUPPORTED_DTYPES,
    ResolvedLaunches,
    autotune_cache_enabled,
    cdiv,
    check_device,
    closest_config,
    dot,
    dot_in_fp32,
    eager_direct,
    interpret_bf16,
    interpreter_enabled,
    next_power_of_2,
    online_softmax_step,
    output_buffer,
    register_recompute_backward,
    to_bf16_rtne,
    tune_key,
    tuning_requested,
)
from vit_fast.kernels.cards import Card, card_for_arch, tensor_arch

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
LOG2E = math.log2(math.e)


def _attention_configs() -> list[triton.Config]:
    """Autotune candidates. Built from the environment only (never a device query), so importing
    this module touches no GPU driver; the prune keeps those that suit the card of the tensors' device. The
    interpreter cannot time configs: it gets one."""
    if interpreter_enabled():
        # BLOCK_M != BLOCK_N on purpose: a query-tail mask swapped with a key-tail mask fails tests
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=num_warps, num_stages=num_stages)
        for block_m in (64, 128)
        for block_n in (32, 64, 128)
        for num_stages in (2, 3)
        for num_warps in (4, 8)
        if not (block_m == 128 and num_warps == 4)  # 128 rows of fp32 state spill with 4 warps
    ] + [
        # cards without tensor cores (sm_75) get only these, and only they run there: the configs above spill up
        # to 32.6 KB per thread on sm_75 and two need 96 KB of its 64 KB (issue 19's offline compiles). Small
        # tiles, 4 warps, no pipelining (sm_75 has no asynchronous copies to overlap); the prune keeps those not
        # expected to spill (_fma_attention_fits)
        triton.Config({"BLOCK_M": block_m, "BLOCK_N": 32}, num_warps=4, num_stages=FMA_ATTENTION_STAGES)
        for block_m in (16, 32)
    ]


#: num_stages of the configs meant for cards without tensor cores: every other config has more
FMA_ATTENTION_STAGES = 1


def _fma_attention_fits(config: triton.Config, block_d: int, elem_bytes: int) -> bool:
    """Whether a config is expected not to spill where ``tl.dot`` is FMA (sm_75): its q / accumulator and score
    tiles, ``BLOCK_M * (BLOCK_D + BLOCK_N)`` elements, at most 5120 in fp32 and 3072 in 16-bit. From triton
    3.9's compiles for sm_75 (spilled bytes per thread): fp32 Dh 64 64x32 836, 32x32 none; fp32 Dh 128 64x32
    5376, 32x32 none; fp16 Dh 64 64x32 1012, 32x32 and 16x32 none (bf16 32x32 none); fp16 Dh 128 64x32 21136,
    32x32 1356, 16x32 none."""
    elements = config.kwargs["BLOCK_M"] * (block_d + config.kwargs["BLOCK_N"])
    return elements <= (5120 if elem_bytes == 4 else 3072)


def block_d_for(head_dim: int) -> int:
    """The kernel's ``BLOCK_D``: the head dim padded to a power of two, at least 16 (the dot's minimum)."""
    return max(16, next_power_of_2(head_dim))


def _attention_shared_bytes(config: triton.Config, block_d: int, elem_bytes: int, card: Card) -> int:
    """Shared memory of a config on ``card``, as the prune compares it with ``card.shared_memory``. On the
    wgmma / tcgen05 cards (sm_90, sm_100): 2 * num_stages - 1 k/v tiles, plus the q tile at 128 rows, as Triton
    3.9 lays it out on sm_90, never above what it reports there (tools/compile_check.py). Other cards: the k/v
    tiles, plus a padded q tile and a padded p tile (the layout conversions into the dot's operands), an upper
    bound of every figure triton 3.9 reported for sm_86 (fp32: Dh 64 64x64 s2 64 KB against 80.5 here, 64x128 s2
    112.3 against 144.5, 128x64 s2 96 against 113; Dh 128 64x32 s2 72.3 against 88.5, 64x64 s2 112.3 (the config
    that failed to launch there) against 144.5, 64x128 s2 192 against 256.5; fp16 Dh 128 64x64 s2 56 against
    72.3). Without tensor cores (sm_75, FMA dots) k and v are buffered apart and more than the 16-bit tiles
    themselves was reported (fp16 Dh 64: 64x32 s1 24 KB, 64x64 s2 32 KB), so every tile counts as fp32 there
    (40.5 and 96.5 KB)."""
    block_m, block_n, stages = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], max(config.num_stages, 1)
    if card.dot in ("wgmma", "tcgen05"):
        kv = (2 * stages - 1) * block_n * block_d * elem_bytes
        return kv + (block_m * block_d * elem_bytes if block_m > 64 else 0)
    if card.dot == "fma":  # k and v apart at every stage, and every tile counted as fp32
        return 2 * stages * block_n * block_d * 4 + block_m * (block_d + 1) * 4 + block_m * (block_n + 1) * 4
    kv = (2 * stages - 1) * block_n * block_d * elem_bytes
    return kv + block_m * (block_d + 1) * elem_bytes + block_m * (block_n + 1) * elem_bytes


def _prune_attention_configs(configs, named_args, **kwargs):
    """The candidates for one launch, read only from its autotune key (T, the head dim, the card ``ARCH``, the
    dtype, ``TUNE``): the configs for this kind of card (tensor cores or not, :data:`FMA_ATTENTION_STAGES`) that
    fit its shared memory (:func:`_attention_shared_bytes`). Wide heads (Dh > 128, padded to 256) keep the q tile
    and the accumulator in registers only with 64-row tiles and key blocks of at most 64; without tensor cores
    only the tiles not expected to spill (:func:`_fma_attention_fits`). Without tuning one config: the fitting
    one nearest 64x64, 4 warps, 2 stages (fp32: 64x32, 8 warps, 3 stages for head dims up to 64 and 2 above; a
    card without tensor cores: its own, nearest 32x32)."""
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    if block_d is None:
        return configs
    card = card_for_arch(named_args["ARCH"])
    qkv = named_args.get("qkv_ptr")
    elem_bytes = qkv.element_size() if isinstance(qkv, torch.Tensor) else 2

    def shared(config: triton.Config) -> int:
        return _attention_shared_bytes(config, block_d, elem_bytes, card)

    def fits(config: triton.Config) -> bool:
        kw = config.kwargs
        if card.tensor_cores and block_d > 128 and not (kw["BLOCK_M"] == 64 and kw["BLOCK_N"] <= 64):
            return False
        if not card.tensor_cores and not _fma_attention_fits(config, block_d, elem_bytes):
            return False
        return shared(config) <= card.shared_memory

    # nothing fits (Dh 256 on sm_75): the smallest config for the card, which may spill or fail to launch there
    same_kind = [c for c in configs if (c.num_stages > FMA_ATTENTION_STAGES) == card.tensor_cores] or configs
    kept = [c for c in same_kind if fits(c)] or [min(same_kind, key=shared)]
    if tuning_requested(named_args) or len(kept) == 1:
        return kept
    if not card.tensor_cores:
        return [closest_config(kept, {"BLOCK_M": 32, "BLOCK_N": 32}, 4, FMA_ATTENTION_STAGES)]
    if elem_bytes == 4:
        # fp32: 64x64 with 4 warps spilled 4.4-4.7 KB per thread on every target (33 KB on sm_80), 64x32 with 8
        # warps nothing on any, sm_75 to sm_120 (tools/compile_check.py, triton 3.9, Dh 64). On triton 3.6 that
        # 64x32 spilled at 2 stages with Dh 64 (sm_90 56 bytes, sm_86/89 36) and not at 3 (80-92 registers on
        # sm_80 to sm_120, 3.6 and 3.9 alike); Dh 128 the other way round on 3.6 (3 stages: 40 bytes on sm_80, 2:
        # none; 3.9: 64 bytes there either way), and 3 stages overflow the 99 KB cards there
        return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_N": 32}, 8, 3 if block_d <= 64 else 2)]
    return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_N": 64}, 4, 2)]


@triton.autotune(
    configs=_attention_configs(),
    key=[
        # everything _prune_attention_configs reads (the autotuner adds the dtypes itself)
        *("T", "HEAD_DIM", "ARCH", "TUNE"),
        # every constexpr the configs do not set (tests/test_autotune_mode.py); these follow the dtype and head dim
        *("DOT_IN_FP32", "ROUND_BF16", "BLOCK_D"),
    ],
    prune_configs_by={"early_config_prune": _prune_attention_configs},
    cache_results=autotune_cache_enabled(),
)
@triton.jit(do_not_specialize=["ARCH", "TUNE"])  # key-only: one compile whatever their values
def _attention_kernel(
    qkv_ptr,  # [B, T, 3, H, Dh] fused q|k|v viewed by strides; unit stride along Dh
    out_ptr,  # [B, T, H * Dh] attention output, unit stride along its last dim
    qk_scale,  # softmax scale * log2(e): exp2 of scaled logits equals exp of the unscaled ones
    T,  # tokens per image (rows of q, k and v)
    H,  # number of heads
    HEAD_DIM,  # Dh, the true head dim (BLOCK_D is it rounded up to a power of two)
    stride_qkv_b,  # elements between images in qkv
    stride_qkv_t,  # elements between tokens in qkv (3 * H * Dh when qkv is contiguous)
    stride_out_b,  # elements between images in out
    stride_out_t,  # elements between tokens in out
    ARCH,  # compute capability of the tensors' device (cards.tensor_arch), never read: the prune's card
    TUNE,  # _common.tune_key(): 1 while tuning, never read: a heuristic pick never answers a tuned request
    DOT_IN_FP32: tl.constexpr,  # dot operands as fp32 at IEEE precision (fp32, or bf16 under the interpreter)
    ROUND_BF16: tl.constexpr,  # round the bf16 store by hand (interpreter: its fp32 -> bf16 cast truncates)
    BLOCK_D: tl.constexpr,  # head dim padded to a power of two >= 16; padding lanes are masked
    BLOCK_M: tl.constexpr,  # query rows per program
    BLOCK_N: tl.constexpr,  # key/value rows per inner step
):
    # one flat grid axis over (query block, image * head): grid axis 1 caps at 65535, which B * H
    # passes at batch ~5.5k for 12 heads. Query blocks vary fastest, so programs running together
    # share one head's k and v in L2.
    num_m_blocks = tl.cdiv(T, BLOCK_M)
    pid_m = tl.program_id(0) % num_m_blocks
    pid_bh = tl.program_id(0) // num_m_blocks
    off_b = pid_bh // H
    off_h = pid_bh % H
    embed_dim = H * HEAD_DIM
    # int64 batch offset: B * T * 3 * D overflows int32 for large serving batches
    q_base = qkv_ptr + off_b.to(tl.int64) * stride_qkv_b + off_h * HEAD_DIM
    k_base = q_base + embed_dim
    v_base = q_base + 2 * embed_dim

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    row_mask = offs_m < T

    # zero-filled padding lanes of q and k add nothing to q k^T; those of v give output lanes
    # that are never stored
    q = tl.load(
        q_base + offs_m[:, None] * stride_qkv_t + offs_d[None, :], mask=row_mask[:, None] & d_mask[None, :], other=0.0
    )
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running row max (log2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running softmax denominator
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    for start_n in range(0, T, BLOCK_N):
        cols = start_n + offs_n
        col_mask = cols < T
        kv_offsets = cols[:, None] * stride_qkv_t + offs_d[None, :]
        kv_mask = col_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_base + kv_offsets, mask=kv_mask, other=0.0)
        if DOT_IN_FP32:  # once per tile; and p below stays fp32 rather than rounding to v's 16-bit dtype
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = dot(q, tl.trans(k), None, DOT_IN_FP32) * qk_scale
        # key tail -> -inf, so exp2 gives exactly 0. The first block always holds key 0, so m_new
        # is finite for every row (padded query rows included) and no inf - inf NaN can arise.
        s = tl.where(col_mask[None, :], s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, DOT_IN_FP32)

    acc = acc / l_i[:, None]
    out_ptrs = (
        out_ptr
        + off_b.to(tl.int64) * stride_out_b
        + offs_m[:, None] * stride_out_t
        + off_h * HEAD_DIM
        + offs_d[None, :]
    )
    out = to_bf16_rtne(acc) if ROUND_BF16 else acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptrs, out, mask=row_mask[:, None] & d_mask[None, :])


_attention_launches = ResolvedLaunches(_attention_kernel)


# ---------------------------------------------------------------------------------- launcher
def _check_attention_inputs(qkv: torch.Tensor, num_heads: int, scale: float | None) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"attention: qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() != 3:
        raise ValueError(
            f"attention: qkv must have shape [B, T, 3 * num_heads * head_dim], got {tuple(qkv.shape)}; "
            "pass the qkv GEMM output before any reshape"
        )
    if qkv.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"attention: qkv dtype {qkv.dtype} is not supported; use float16, bfloat16 or float32 "
            "(e.g. qkv.to(torch.float16))"
        )
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"attention: num_heads must be a positive int, got {num_heads!r}")
    width = qkv.shape[-1]
    if width % (3 * num_heads) != 0:
        raise ValueError(
            f"attention: qkv's last dim {width} is not 3 * num_heads * head_dim with num_heads={num_heads}; "
            "check num_heads, or that qkv is the fused [q | k | v] projection"
        )
    head_dim = width // (3 * num_heads)
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"attention: head_dim {head_dim} (= {width} / (3 * {num_heads})) is outside the supported range "
            f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM}; use the torch backend for this model"
        )
    if qkv.shape[1] == 0:
        raise ValueError("attention: qkv has T = 0 tokens; attention needs at least one token")
    if qkv.stride(-1) != 1:
        raise ValueError(
            f"attention: qkv's last dim must be contiguous (stride 1), got stride {qkv.stride(-1)}; "
            "call qkv.contiguous() first"
        )
    # not while compiling: a scale that changed between compiled calls arrives as a symbolic float
    # (automatic dynamic), and math.isfinite on it would break the graph; eager calls still check it
    if scale is not None and not torch.compiler.is_compiling():
        if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
            raise ValueError(f"attention: scale must be a finite float or None, got {scale!r}")
    check_device("attention", qkv)


def launch_attention(
    qkv: torch.Tensor,
    num_heads: int,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """Check the inputs, then run the kernel once (no autograd, no custom op); returns ``[B, T, H * Dh]``.

    ``checked=True`` skips the checks: only for the custom op, whose one caller (:func:`attention`)
    has just run them, so a forward pays for each check once.

    ``out``, if given, must be ``[B, T, H * Dh]`` in qkv's dtype and device with a unit-stride last
    dim; tests pass a NaN-filled one so an element the kernel leaves unwritten is caught.
    """
    if not checked:
        _check_attention_inputs(qkv, num_heads, scale)
    batch, tokens, width = qkv.shape
    embed_dim = width // 3
    head_dim = embed_dim // num_heads
    out = output_buffer("attention", out, (batch, tokens, embed_dim), qkv)
    if batch == 0:
        return out
    scale = head_dim**-0.5 if scale is None else float(scale)

    def grid(meta):
        return (cdiv(tokens, meta["BLOCK_M"]) * batch * num_heads,)

    _attention_launches(
        grid,
        (batch,),
        qkv,
        out,
        scale * LOG2E,
        tokens,
        num_heads,
        head_dim,
        qkv.stride(0),
        qkv.stride(1),
        out.stride(0),
        out.stride(1),
        tensor_arch(qkv),
        tune_key(),
        DOT_IN_FP32=dot_in_fp32(qkv.dtype),
        ROUND_BF16=interpret_bf16(qkv.dtype),
        BLOCK_D=block_d_for(head_dim),
    )
    return out


# ---------------------------------------------------------------------------------- custom op
@torch.library.custom_op("vit_fast::attention", mutates_args=())
def _attention_op(qkv: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
    return launch_attention(qkv, num_heads, scale, checked=True)  # attention() checked the inputs


@_attention_op.register_fake
def _attention_fake(qkv: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
    _check_attention_inputs(qkv, num_heads, scale)
    batch, tokens, width = qkv.shape
    return qkv.new_empty((batch, tokens, width // 3))


register_recompute_backward(
    _attention_op, lambda qkv, num_heads, scale: attention_ref(qkv, num_heads, scale, upcast=True)
)


def attention(qkv: torch.Tensor, num_heads: int, scale: float | None = None) -> torch.Tensor:
    """Multi-head self-attention on the fused qkv projection, without copies.

    Args:
        qkv: ``[B, T, 3 * H * Dh]`` float16 / bfloat16 / float32, CUDA (or CPU under
            ``TRITON_INTERPRET=1``); its last dim must have stride 1, other dims may be strided
            (e.g. a slice of a larger buffer). Read as ``[B, T, 3, H, Dh]``: q, then k, then v.
        num_heads: H. ``Dh = qkv.shape[-1] / (3 * H)`` must lie in 16..256.
        scale: softmax scale; ``Dh ** -0.5`` when None.

    Returns:
        ``[B, T, H * Dh]`` in qkv's dtype, heads side by side (timm's ``transpose(1, 2).reshape``).

    A ``torch.library`` custom op (``vit_fast::attention``) with a fake implementation, so it
    traces under ``torch.compile(fullgraph=True)``. Backward is supported but not fused: it
    recomputes the forward through ``attention_ref`` (fp32 for half inputs) and differentiates
    that, so it costs eager attention's time and memory.
    """
    _check_attention_inputs(qkv, num_heads, scale)
    head_dim = qkv.shape[-1] // (3 * num_heads)
    scale = head_dim**-0.5 if scale is None else float(scale)
    if eager_direct(qkv):  # plain eager: skip the custom op's dispatch
        return launch_attention(qkv, num_heads, scale, checked=True)
    return _attention_op(qkv, num_heads, scale)


# ---------------------------------------------------------------------------------- reference
def attention_ref(qkv: torch.Tensor, num_heads: int, scale: float | None = None, upcast: bool = False) -> torch.Tensor:
    """Eager attention, written as timm's ``Attention.forward``: ``[B, T, 3HDh] -> [B, T, HDh]``.

    ``upcast=False`` computes in qkv's dtype (what eager PyTorch does: the error a kernel is
    judged against). ``upcast=True`` computes float16 / bfloat16 inputs in float32 and casts the
    result back; float32 and float64 inputs are computed as they are. For a float64 reference,
    pass ``qkv.double()``.
    """
    batch, tokens, width = qkv.shape
    head_dim = width // (3 * num_heads)
    scale = head_dim**-0.5 if scale is None else scale
    dtype = qkv.dtype
    if upcast and dtype in (torch.float16, torch.bfloat16):
        qkv = qkv.float()
    q, k, v = qkv.reshape(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    attn = ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)
    out = (attn @ v).transpose(1, 2).reshape(batch, tokens, num_heads * head_dim)
    return out.to(dtype)


__all__ = ["attention", "attention_ref", "launch_attention"]
