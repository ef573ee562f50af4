"""The ``@triton.jit`` helpers the kernels share: bf16 rounding under the interpreter, the dot every kernel takes
(fp32 operands at IEEE precision where it must), and one key tile of the attention kernels' online softmax."""

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
