"""Flash-style multi-head attention forward, reading the fused qkv GEMM output in place, with an optional mask of a
padded (``lengths``) or packed (``cu_seqlens``) batch: the kernel, the launcher :func:`launch_attention`, the
``torch.library`` op and the eager reference :func:`attention_ref`. Its tiles are in :mod:`.attention_tiles`, its
input checks in :mod:`.attention_checks`, rotary embeddings (q and k rotated as loaded) in :mod:`.rope`; design:
docs/kernels.md, "Attention"."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from vit_fast.base.cards import tensor_arch

from ._launch import SelfCheck, case_rows, cdiv, define_op, output_buffer
from ._tl import (
    attend_tile,
    head_tile,
    load_kv_tile,
    online_softmax_start,
    store_rounded,
)
from .attention_checks import check_attention_inputs
from .attention_tiles import (
    attention_configs,
    block_d_for,
    dtype_flags,
    head_split,
    prune_attention_configs,
    row_strides,
)
from .autotune import autotune_cache_enabled, tune_key
from .launches import ResolvedLaunches
from .rope import LAYOUTS, apply_rope_ref, check_rope, rope_rotate, sequence_positions

LOG2E = math.log2(math.e)


@triton.jit
def _zero_tokens(
    out_ptr,
    start,
    end,
    T,
    stride_out_b,
    stride_out_t,
    col,
    HEAD_DIM,
    first_row,
    step,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Zeros over one head's ``HEAD_DIM`` columns (``col`` on) of tokens ``[start, end)`` of the ``B * T`` (a run
    may cross image rows): this program's ``BLOCK_M`` tokens at ``first_row`` of every ``step``."""
    offs_m = first_row + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    zeros = tl.zeros([BLOCK_M, BLOCK_D], dtype=out_ptr.dtype.element_ty)
    for first in range(start, end, step):
        tokens = first + offs_m
        row = tokens // T
        ptrs = out_ptr + row.to(tl.int64)[:, None] * stride_out_b + (tokens - row * T)[:, None] * stride_out_t
        tl.store(ptrs + col + offs_d[None, :], zeros, mask=(tokens < end)[:, None] & d_mask[None, :])


@triton.autotune(
    configs=attention_configs(),
    key=[
        # everything prune_attention_configs reads (the autotuner adds the dtypes itself)
        *("T", "HEAD_DIM", "ARCH", "TUNE"),
        # every constexpr the configs do not set (tests/kernels/test_autotune_mode.py); these follow the dtype, the head dim
        # and which mask the launch has
        *("DOT_IN_FP32", "ROUND_BF16", "HAS_LENGTHS", "PACKED", "ROPE", "BLOCK_D"),
    ],
    prune_configs_by={"early_config_prune": prune_attention_configs},
    cache_results=autotune_cache_enabled(),
)
# key-only (ARCH, TUNE) or read by the masked variants only (batch, num_seqs, max_seqlen): one compile whatever their
# values, so the unmasked kernel never specialises on a batch of 1
@triton.jit(do_not_specialize=["batch", "num_seqs", "max_seqlen", "ARCH", "TUNE"])
def _attention_kernel(
    qkv_ptr,  # [B, T, 3, H, Dh] fused q|k|v viewed by strides; unit stride along Dh
    out_ptr,  # [B, T, H * Dh] attention output, unit stride along its last dim
    lengths_ptr,  # [B] int32 valid tokens per image (HAS_LENGTHS; otherwise any tensor, never read)
    cu_seqlens_ptr,  # [N + 1] int32 segment offsets into the B * T tokens (PACKED; otherwise any tensor, never read)
    rope_cos_ptr,  # ROPE: cos table [T_rot, Dh] or [H, T_rot, Dh], unit stride along Dh (else never read)
    rope_sin_ptr,  # ROPE: sin table, cos's strides
    qk_scale,  # softmax scale * log2(e): exp2 of scaled logits equals exp of the unscaled ones
    T,  # tokens per image (rows of q, k and v)
    H,  # number of heads
    HEAD_DIM,  # Dh, the true head dim (BLOCK_D is it rounded up to a power of two)
    stride_qkv_b,  # elements between images in qkv
    stride_qkv_t,  # elements between tokens in qkv (3 * H * Dh when qkv is contiguous)
    stride_out_b,  # elements between images in out
    stride_out_t,  # elements between tokens in out
    batch,  # B (PACKED: the segments and the padding after them cover the B * T tokens; otherwise unused)
    num_seqs,  # PACKED: N, the number of segments; otherwise unused
    max_seqlen,  # PACKED: query rows the grid gives each segment, at least its longest; otherwise unused
    stride_rope_h,  # ROPE: elements between heads' tables (0: one table for every head)
    stride_rope_t,  # ROPE: elements between table rows
    num_prefix,  # ROPE: a sequence's first tokens left unrotated (class, registers)
    num_rot,  # ROPE: table rows (T_rot): token num_prefix + i takes row i
    ARCH,  # compute capability of the tensors' device (cards.tensor_arch), never read: the prune's card
    TUNE,  # autotune.tune_key(): 1 while tuning, never read: a heuristic pick never answers a tuned request
    DOT_IN_FP32: tl.constexpr,  # dot operands as fp32 at IEEE precision (fp32, or bf16 under the interpreter)
    ROUND_BF16: tl.constexpr,  # round the bf16 store by hand (interpreter: its fp32 -> bf16 cast truncates)
    HAS_LENGTHS: tl.constexpr,  # a padded batch: image b's tokens >= lengths[b] are padding (zeros out)
    PACKED: tl.constexpr,  # packed images: a program attends within one segment of cu_seqlens
    ROPE: tl.constexpr,  # rotary embedding of q and k as loaded: 0 none, 1 interleaved pairs, 2 halves (rope.LAYOUTS)
    BLOCK_D: tl.constexpr,  # head dim padded to a power of two >= 16; padding lanes are masked
    BLOCK_M: tl.constexpr,  # query rows per program
    BLOCK_N: tl.constexpr,  # key/value rows per inner step
):
    # one flat grid axis over (query block, image * head), or (query block, segment * head) when PACKED: grid axis 1
    # caps at 65535, which B * H passes at batch ~5.5k for 12 heads. Query blocks vary fastest, so programs running
    # together share one head's k and v in L2.
    if PACKED:
        num_m_blocks = tl.cdiv(max_seqlen, BLOCK_M)
    else:
        num_m_blocks = tl.cdiv(T, BLOCK_M)
    pid_m = tl.program_id(0) % num_m_blocks
    pid_bh = tl.program_id(0) // num_m_blocks
    if PACKED:
        # segment `seg` is tokens [cu_seqlens[seg], cu_seqlens[seg + 1]) of the B * T, inside one image row; the
        # launcher checked the offsets, and clamping them keeps a bad one from reaching outside qkv and out
        seg = pid_bh // H
        off_h = pid_bh % H
        total = batch * T
        seg_start = tl.minimum(tl.maximum(tl.load(cu_seqlens_ptr + seg), 0), total)
        if seg == num_seqs:  # the programs after the last segment write zeros over the padding that follows it
            zero_from = seg_start  # cu_seqlens[N]
            _zero_tokens(
                out_ptr,
                zero_from,
                total,
                T,
                stride_out_b,
                stride_out_t,
                off_h * HEAD_DIM,
                HEAD_DIM,
                pid_m * BLOCK_M,
                num_m_blocks * BLOCK_M,
                BLOCK_M,
                BLOCK_D,
            )
            return
        off_b = seg_start // T
        row_start = seg_start - off_b * T
        seg_end = tl.minimum(tl.maximum(tl.load(cu_seqlens_ptr + seg + 1), seg_start), total)
        seq_len = tl.minimum(seg_end - seg_start, T - row_start)  # a segment never runs past its image row
        if pid_m * BLOCK_M >= seq_len:  # beyond this segment's end: its rows belong to the next one
            return
        kv_end = seq_len  # the segment's last key tile bounds the loop
    else:
        off_b = pid_bh // H
        off_h = pid_bh % H
    embed_dim = H * HEAD_DIM
    # int64 batch offset: B * T * 3 * D overflows int32 for large serving batches
    q_base = qkv_ptr + off_b.to(tl.int64) * stride_qkv_b + off_h * HEAD_DIM
    if PACKED:
        q_base += row_start * stride_qkv_t
    k_base = q_base + embed_dim
    v_base = q_base + 2 * embed_dim

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    if HAS_LENGTHS:
        seq_len = tl.minimum(tl.maximum(tl.load(lengths_ptr + off_b), 0), T)
        if pid_m * BLOCK_M >= seq_len:  # a query tile wholly in the image's padding: zeros, no key tile loaded
            zero_ptrs = head_tile(out_ptr, off_b, stride_out_b, offs_m, stride_out_t, off_h * HEAD_DIM, offs_d)
            zeros = tl.zeros([BLOCK_M, BLOCK_D], dtype=out_ptr.dtype.element_ty)
            tl.store(zero_ptrs, zeros, mask=(offs_m < T)[:, None] & d_mask[None, :])
            return
        kv_end = seq_len  # keys end at the image's end
    elif not PACKED:
        seq_len = T
        kv_end = T
    row_mask = offs_m < seq_len  # seq_len is T without a mask

    # zero-filled padding lanes of q and k add nothing to q k^T; those of v give output lanes
    # that are never stored. Padding tokens (HAS_LENGTHS, PACKED) are never loaded
    q = tl.load(
        q_base + offs_m[:, None] * stride_qkv_t + offs_d[None, :], mask=row_mask[:, None] & d_mask[None, :], other=0.0
    )
    if ROPE:
        rope_cos_ptr += off_h * stride_rope_h
        rope_sin_ptr += off_h * stride_rope_h
        q = rope_rotate(
            q,
            q_base + offs_m[:, None] * stride_qkv_t + offs_d[None, :],
            offs_m,
            row_mask,
            offs_d,
            d_mask,
            rope_cos_ptr,
            rope_sin_ptr,
            stride_rope_t,
            num_prefix,
            num_rot,
            HEAD_DIM,
            ROPE,
            ROUND_BF16,
        )
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    m_i, l_i, acc = online_softmax_start(BLOCK_M, BLOCK_D)
    for start_n in range(0, kv_end, BLOCK_N):
        k, v, cols, col_mask, kv_offsets = load_kv_tile(
            k_base, v_base, start_n, kv_end, offs_n, stride_qkv_t, offs_d, d_mask
        )
        if ROPE:  # rotated in fp32, then rounded to qkv's dtype as eager rounds it before the attention
            k = rope_rotate(
                k,
                k_base + kv_offsets,
                cols,
                col_mask,
                offs_d,
                d_mask,
                rope_cos_ptr,
                rope_sin_ptr,
                stride_rope_t,
                num_prefix,
                num_rot,
                HEAD_DIM,
                ROPE,
                ROUND_BF16,
            )
        # key tail (and padding) -> -inf: key 0, in the first tile, is valid, so padded query rows stay finite too
        m_i, l_i, acc = attend_tile(q, k, v, col_mask, qk_scale, m_i, l_i, acc, DOT_IN_FP32)

    if HAS_LENGTHS or PACKED:
        # padding query rows -> exact zeros (they summed valid keys with q = 0; the guard keeps any l_i = 0 out)
        acc = tl.where(row_mask[:, None], acc / tl.where(row_mask, l_i, 1.0)[:, None], 0.0)
    else:
        acc = acc / l_i[:, None]
    out_ptrs = head_tile(out_ptr, off_b, stride_out_b, offs_m, stride_out_t, off_h * HEAD_DIM, offs_d)
    if PACKED:
        out_ptrs += row_start * stride_out_t
    if HAS_LENGTHS:
        store_mask = offs_m < T  # padding rows are written too: zeros
    else:
        store_mask = row_mask  # PACKED: the rows after the segment's end belong to the next segment
    store_rounded(out_ptrs, acc, store_mask[:, None] & d_mask[None, :], ROUND_BF16)


_attention_launches = ResolvedLaunches(_attention_kernel)


# ---------------------------------------------------------------------------------- launcher
def launch_attention(
    qkv: torch.Tensor,
    num_heads: int,
    scale: float | None = None,
    *,
    lengths: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    rope_cos: torch.Tensor | None = None,
    rope_sin: torch.Tensor | None = None,
    num_prefix: int = 0,
    rope_layout: str = "interleaved",
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """Check the inputs, then run the kernel once (no autograd, no custom op); returns ``[B, T, H * Dh]``. The
    masks and the rotary tables (``rope_*``, ``num_prefix``) as in :func:`attention`. ``checked=True`` skips the checks (the
    mask values included, so no host read): for the custom op, called by :func:`attention` just after them, and for
    callers that checked already. ``out``, if given: ``[B, T, H * Dh]`` in qkv's dtype and device, unit-stride last
    dim (tests pass a NaN-filled one). See docs/kernels.md, section Ops, launchers and references."""
    if not checked:
        check_attention_inputs(qkv, num_heads, scale, lengths, cu_seqlens, max_seqlen)
        check_rope(qkv, num_heads, rope_cos, rope_sin, num_prefix, rope_layout)
    batch, tokens, _ = qkv.shape
    embed_dim, head_dim, scale = head_split(qkv, 3, num_heads, scale)
    out = output_buffer("attention", out, (batch, tokens, embed_dim), qkv)
    if batch == 0:
        return out
    if cu_seqlens is not None:
        num_seqs = cu_seqlens.shape[0] - 1
        # a segment lies in one row, so T query rows cover the longest; the grid's last "segment" zeroes the
        # padding after cu_seqlens[N]
        rows = tokens if max_seqlen is None else min(max(max_seqlen, 1), tokens)
        grid_seqs = num_seqs + 1
    else:
        num_seqs, rows, grid_seqs = batch, tokens, batch
    rope = 0 if rope_cos is None else LAYOUTS[rope_layout]
    # one table for every head: stride 0 between heads
    rope_strides = (
        (0, 0) if rope_cos is None else (rope_cos.stride(0) if rope_cos.dim() == 3 else 0, rope_cos.stride(-2))
    )

    def grid(meta):
        return (cdiv(rows, meta["BLOCK_M"]) * grid_seqs * num_heads,)

    _attention_launches(
        grid,
        (grid_seqs,),
        qkv,
        out,
        qkv if lengths is None else lengths,  # a stand-in pointer the kernel never reads
        qkv if cu_seqlens is None else cu_seqlens,
        qkv if rope_cos is None else rope_cos,  # stand-ins the kernel never reads without ROPE
        qkv if rope_sin is None else rope_sin,
        scale * LOG2E,
        tokens,
        num_heads,
        head_dim,
        *row_strides(qkv, out),
        batch,
        num_seqs,
        rows,
        *rope_strides,
        num_prefix,
        0 if rope_cos is None else rope_cos.shape[-2],
        tensor_arch(qkv),
        tune_key(),
        **dtype_flags(qkv.dtype),
        HAS_LENGTHS=lengths is not None,
        PACKED=cu_seqlens is not None,
        ROPE=rope,
        BLOCK_D=block_d_for(head_dim),
    )
    return out


# ---------------------------------------------------------------------------------- custom op
def _attention_op(
    qkv: torch.Tensor,
    num_heads: int,
    scale: float,
    lengths: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    rope_cos: torch.Tensor | None = None,
    rope_sin: torch.Tensor | None = None,
    num_prefix: int = 0,
    rope_layout: str = "interleaved",
) -> torch.Tensor:
    rope = dict(rope_cos=rope_cos, rope_sin=rope_sin, num_prefix=num_prefix, rope_layout=rope_layout)
    return launch_attention(
        qkv, num_heads, scale, lengths=lengths, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, **rope, checked=True
    )


def _check(qkv, num_heads, scale, lengths, cu_seqlens, max_seqlen, rope_cos, rope_sin, num_prefix, layout) -> None:
    check_attention_inputs(qkv, num_heads, scale, lengths, cu_seqlens, max_seqlen)  # a fake's values: not read
    check_rope(qkv, num_heads, rope_cos, rope_sin, num_prefix, layout)


def _default_scale(qkv, num_heads, scale, *rest) -> tuple:
    return (qkv, num_heads, head_split(qkv, 3, num_heads, scale)[2], *rest)


_attention = define_op(
    _attention_op,
    check=_check,
    empty=lambda qkv, *_: qkv.new_empty((*qkv.shape[:2], qkv.shape[2] // 3)),
    reference=lambda qkv, num_heads, scale, lengths, cu_seqlens, _max, cos, sin, num_prefix, layout: attention_ref(
        qkv, num_heads, scale, True, lengths=lengths, cu_seqlens=cu_seqlens, rope=(cos, sin, num_prefix, layout)
    ),
    prepare=_default_scale,
    selfcheck=SelfCheck(  # qkv [B, T, 3D] of ``heads`` heads, no mask
        cases=lambda m: [("attention", {**case_rows(m), "heads": m["heads"]})],
        inputs=lambda d, rnd, *_: ((rnd(d["batch"], d["tokens"], 3 * d["dim"]), d["heads"]), {}),
        launch=lambda d, args, _, poisoned: launch_attention(*args, out=poisoned(d["batch"], d["tokens"], d["dim"])),
        shape=lambda d: (
            f"[{d['batch']}, {d['tokens']}, {3 * d['dim']}] -> [{d['batch']}, {d['tokens']}, {d['dim']}] "
            f"({d['heads']} heads of {d['dim'] // d['heads']})"
        ),
    ),
)


def attention(
    qkv: torch.Tensor,
    num_heads: int,
    scale: float | None = None,
    *,
    lengths: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    rope_cos: torch.Tensor | None = None,
    rope_sin: torch.Tensor | None = None,
    num_prefix: int = 0,
    rope_layout: str = "interleaved",
) -> torch.Tensor:
    """Multi-head self-attention on the fused qkv projection, without copies: ``qkv [B, T, 3 * H * Dh]`` (float16 /
    bfloat16 / float32, last dim unit-stride, read as ``[B, T, 3, H, Dh]``), ``num_heads`` H (Dh in 16..256),
    ``scale`` (default ``Dh ** -0.5``); returns ``[B, T, H * Dh]`` in qkv's dtype. Masks, one at a time:
    ``lengths [B]`` int32 (a padded batch) or ``cu_seqlens [N + 1]`` int32 (packed images; ``max_seqlen`` bounds a
    segment); padding comes out zero. RoPE tables ``rope_cos`` / ``rope_sin``: docs/kernels.md, section RoPE."""
    masks, rope = (lengths, cu_seqlens, max_seqlen), (rope_cos, rope_sin, num_prefix, rope_layout)
    return _attention(qkv, num_heads, scale, *masks, *rope)


# ---------------------------------------------------------------------------------- reference
def _token_segments(
    batch: int, tokens: int, lengths: torch.Tensor | None, cu_seqlens: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """``[B, T]`` int64: which sequence each token belongs to (tokens attend within their own), -1 for padding."""
    positions = torch.arange(batch * tokens, device=device)
    if lengths is not None:
        in_image = positions.view(batch, tokens) % tokens < lengths.to(device, torch.int64)[:, None]
        return torch.where(in_image, 0, -1)
    offsets = cu_seqlens.to(device, torch.int64)
    segment = torch.searchsorted(offsets[1:], positions, right=True)
    return torch.where(positions < offsets[-1], segment, -1).view(batch, tokens)


def attention_ref(
    qkv: torch.Tensor,
    num_heads: int,
    scale: float | None = None,
    upcast: bool = False,
    *,
    lengths: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    rope: tuple | None = None,
) -> torch.Tensor:
    """Eager attention, written as timm's ``Attention.forward``: ``[B, T, 3HDh] -> [B, T, HDh]``. ``upcast=False``
    computes in qkv's dtype (what eager PyTorch does: the error a kernel is judged against); ``upcast=True`` computes
    float16 / bfloat16 in float32 and casts back, float32 / float64 as they are. For a float64 reference, pass
    ``qkv.double()``. ``lengths`` / ``cu_seqlens`` as in :func:`attention`; ``rope``: ``(cos, sin, num_prefix,
    layout)`` (cos None: none), q and k rotated first (:func:`.rope.apply_rope_ref`). More: docs/kernels.md."""
    batch, tokens, width = qkv.shape
    head_dim = width // (3 * num_heads)
    scale = head_dim**-0.5 if scale is None else scale
    dtype = qkv.dtype
    if upcast and dtype in (torch.float16, torch.bfloat16):
        qkv = qkv.float()
    allowed = None
    if lengths is not None or cu_seqlens is not None:
        segment = _token_segments(batch, tokens, lengths, cu_seqlens, qkv.device)
        padding = segment < 0
        qkv = qkv.masked_fill(padding[..., None], 0.0)
        allowed = (segment[:, :, None] == segment[:, None, :]) & ~padding[:, None, :]
        allowed |= torch.eye(tokens, dtype=torch.bool, device=qkv.device) & padding[:, :, None]
    q, k, v = qkv.reshape(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    if rope is not None and rope[0] is not None:
        positions = sequence_positions(batch, tokens, lengths, cu_seqlens, qkv.device)
        q, k = (apply_rope_ref(t, rope[0], rope[1], positions, rope[2], rope[3]) for t in (q, k))
    scores = (q * scale) @ k.transpose(-2, -1)
    if allowed is not None:
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    attn = scores.softmax(dim=-1)
    out = (attn @ v).transpose(1, 2).reshape(batch, tokens, num_heads * head_dim)
    return out.to(dtype)


__all__ = ["attention", "attention_ref", "launch_attention"]
