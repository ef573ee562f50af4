"""The ``@triton.jit`` helpers the kernels share: bf16 rounding under the interpreter, the dot every kernel takes
(fp32 operands at IEEE precision where it must), the attention kernels' online softmax (its start, one key tile,
its end) and their output: one head's tile of a ``[B, rows, H * width]`` tensor, stored in its dtype."""

import triton
import triton.language as tl


@triton.jit
def to_bf16_rtne(x):
    """fp32 -> bf16, round to nearest even, by hand. Only for the interpreter: its fp32 -> bf16
    cast truncates (twice eager's error); compiled, ``.to(tl.bfloat16)`` already rounds."""
    bits = x.to(tl.uint32, bitcast=True)
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def dot(a, b, acc, IN_FP32: tl.constexpr):
    """``a @ b`` accumulated in fp32, onto ``acc`` unless it is None. ``IN_FP32``: the operands go in as
    fp32 at IEEE precision
    (fp32 inputs: not TF32, to stay within 2x of eager; bf16 under the interpreter, whose bf16 tl.dot is
    garbage (triton issue 11584): products of bf16 values are exact in fp32, so this is the GPU's bf16 dot)."""
    if IN_FP32:
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        result = tl.dot(a, b, acc)
    return result


@triton.jit
def store_rounded(ptrs, value, mask, ROUND_BF16: tl.constexpr):
    """Store fp32 ``value`` at ``ptrs`` in their dtype (bf16 rounded by hand under the interpreter: ``ROUND_BF16``)."""
    out = to_bf16_rtne(value) if ROUND_BF16 else value.to(ptrs.dtype.element_ty)
    tl.store(ptrs, out, mask=mask)


@triton.jit
def head_tile(base, off_b, stride_b, rows, stride_t, col, cols):
    """Pointers to ``rows`` x ``cols`` of image ``off_b`` from column ``col`` (a head's first) on: an int64 image
    offset, as ``B * T * D`` passes int32 for large serving batches."""
    return base + off_b.to(tl.int64) * stride_b + rows[:, None] * stride_t + col + cols[None, :]


@triton.jit
def online_softmax_start(BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The running max (log2 units, -inf), denominator and ``[BLOCK_M, BLOCK_D]`` accumulator before any key."""
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    return m_i, l_i, acc


@triton.jit
def load_kv_tile(k_base, v_base, start_n, end, offs_n, stride_t, offs_d, d_mask):
    """The key and value rows ``start_n + offs_n`` before ``end`` (zeros past it and in the padding lanes past
    ``d_mask``); returns k, v, those rows, their mask and their offsets from ``k_base`` / ``v_base``."""
    cols = start_n + offs_n
    col_mask = cols < end
    kv_offsets = cols[:, None] * stride_t + offs_d[None, :]
    kv_mask = col_mask[:, None] & d_mask[None, :]
    k = tl.load(k_base + kv_offsets, mask=kv_mask, other=0.0)
    v = tl.load(v_base + kv_offsets, mask=kv_mask, other=0.0)
    return k, v, cols, col_mask, kv_offsets


@triton.jit
def attend_tile(q, k, v, col_mask, qk_scale, m_i, l_i, acc, IN_FP32: tl.constexpr):
    """One key tile ``k, v [N, D]`` for ``q [M, D]`` (fp32 already when ``IN_FP32``): logits in log2 units with the
    keys outside ``col_mask`` at -inf (the first tile holds key 0, so every row's max is finite and no inf - inf NaN
    arises), then :func:`online_softmax_step`. ``IN_FP32``: k and v as fp32 (p stays fp32 for the second dot)."""
    if IN_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = dot(q, tl.trans(k), None, IN_FP32) * qk_scale
    s = tl.where(col_mask[None, :], s, float("-inf"))
    return online_softmax_step(s, v, m_i, l_i, acc, IN_FP32)


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc, IN_FP32: tl.constexpr):
    """One key tile of the streaming (online) softmax shared by the attention kernels: ``s [M, N]`` the tile's
    logits in log2 units with masked keys at -inf, ``v [N, D]`` its values; returns the running max, the running
    denominator and the ``p @ v`` accumulator, what was summed under the old max rescaled to the new one."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, None, IN_FP32)
    return m_new, l_i, acc
