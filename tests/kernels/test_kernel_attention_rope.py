"""vit_fast::attention with rotary position embeddings: q and k rotated in the kernel as it loads them, against
the library's math (rotate, then attention) in float64, judged by eager PyTorch's own error in the same dtype.

Tables are random angles in timm's two layouts (interleaved pairs, halves), one table for every head ('cat',
'dinov3') or one per head ('mixed'), handed over as the two views of one timm-style sin|cos table. Under the
interpreter bf16 is an honest test: the dot takes fp32 operands and the rounding of q, k and the output is done by
hand (docs/kernels.md, section "RoPE").
"""

from __future__ import annotations

import pytest
import torch

from vit_fast.kernels.attention import attention, attention_ref, launch_attention
from vit_fast.kernels.launches import record_launches
from vit_fast.kernels.rope import split_sin_cos

from ..numerics import (
    assert_within_eager,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _table(rows: int, head_dim: int, layout: str, heads: int | None, device) -> torch.Tensor:
    """A timm-style ``[(H,) rows, 2 * Dh]`` table, sin then cos, of random angles (several turns) per lane pair."""
    shape = (rows, head_dim // 2) if heads is None else (heads, rows, head_dim // 2)
    angles = torch.rand(shape, device=device) * 20.0 - 10.0
    if layout == "interleaved":  # [f0, f0, f1, f1, ...]
        angles = angles.repeat_interleave(2, dim=-1)
    else:  # [f0, f1, ..., f0, f1, ...]
        angles = torch.cat([angles, angles], dim=-1)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def _check(batch, tokens, heads, head_dim, dtype, device, layout, prefix, per_head, name, max_seqlen=None, **masks):
    qkv = torch.randn(batch, tokens, 3 * heads * head_dim, device=device).to(dtype)
    embed = _table(tokens - prefix, head_dim, layout, heads if per_head else None, device)
    cos, sin = split_sin_cos(embed)  # fp32 views of one table, as timm hands it to a block
    rope = dict(rope_cos=cos, rope_sin=sin, num_prefix=prefix, rope_layout=layout)
    out = poisoned((batch, tokens, heads * head_dim), dtype, device)
    launch_attention(qkv, heads, out=out, max_seqlen=max_seqlen, **masks, **rope)
    ref64 = attention_ref(qkv.double(), heads, rope=(cos.double(), sin.double(), prefix, layout), **masks)
    eager = attention_ref(qkv, heads, rope=(cos, sin, prefix, layout), **masks)
    unrotated = attention_ref(qkv.double(), heads, **masks)
    assert (ref64 - unrotated).abs().max() > 1e-2, f"{name}: the tables changed nothing; the test would prove nothing"
    assert_within_eager(out, eager, ref64, name)
    return out


# (layout, one table per head, prefix tokens, tokens): class + 2x2 grid, class + 4 registers + 3x3 grid, a 5x7 grid
# with no prefix, class + 1 register + 4x4
VARIANTS = [
    ("interleaved", False, 1, 1 + 4),
    ("interleaved", False, 5, 5 + 9),
    ("interleaved", False, 0, 35),
    ("half", False, 1, 1 + 4),
    ("half", False, 5, 5 + 9),
    ("half", False, 0, 35),
    ("interleaved", True, 1, 1 + 4),
    ("interleaved", True, 2, 2 + 16),
    ("half", True, 0, 35),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout, per_head, prefix, tokens", VARIANTS)
def test_variants(layout, per_head, prefix, tokens, dtype, device):
    """Both layouts, shared and per-head tables, with and without prefix tokens, odd token counts, 2 heads of 64."""
    name = f"{layout} per_head={per_head} prefix={prefix} T={tokens} {dtype}"
    _check(1, tokens, 2, 64, dtype, device, layout, prefix, per_head, name)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("head_dim", [64, 72, 80, 96, 128])
def test_head_dims(head_dim, layout, device):
    """Power-of-two and padded head dims (72, 80, 96 -> 128 lanes: the partner lanes stay inside Dh), fp16."""
    _check(1, 5, 1, head_dim, torch.float16, device, layout, 1, False, f"Dh={head_dim} {layout}")


def test_padded_batch(device):
    """A padded batch (``lengths``): each image's tokens rotated from its own start, padding never read (NaN)."""
    lengths = torch.tensor([14, 9, 0], dtype=torch.int32, device=device)
    out = _check(3, 14, 2, 64, torch.float16, device, "half", 5, False, "lengths", lengths=lengths)
    assert (out[1, 9:] == 0).all() and (out[2] == 0).all()


def test_packed_segments(device):
    """Packed images (``cu_seqlens``): each segment's tokens rotated from the segment's start, prefix per segment."""
    cu_seqlens = torch.tensor([0, 5, 14, 19, 21], dtype=torch.int32, device=device)  # 5 + 9 in row 0, 5 + 2 in row 1
    masks = dict(cu_seqlens=cu_seqlens, max_seqlen=9)
    _check(2, 14, 2, 64, torch.float32, device, "interleaved", 1, True, "cu_seqlens", **masks)


def test_rope_adds_no_launch(device):
    """One launch of the attention kernel with or without RoPE, through the public op."""
    qkv = torch.randn(1, 5, 3 * 64, device=device, dtype=torch.float16)
    cos, sin = split_sin_cos(_table(4, 64, "interleaved", None, device))
    with record_launches() as plain:
        attention(qkv, 1)
    with record_launches() as rotated:
        attention(qkv, 1, rope_cos=cos, rope_sin=sin, num_prefix=1)
    assert [r["kernel"] for r in rotated] == [r["kernel"] for r in plain] == ["_attention_kernel"]


def test_backward_through_the_op(device):
    """With autograd on, the op's backward recomputes through the reference with the same tables."""
    qkv = torch.randn(1, 5, 3 * 2 * 16, device=device, dtype=torch.float32, requires_grad=True)
    cos, sin = split_sin_cos(_table(4, 16, "half", 2, device))
    rope = dict(rope_cos=cos, rope_sin=sin, num_prefix=1, rope_layout="half")
    attention(qkv, 2, **rope).square().sum().backward()
    expected = torch.autograd.grad(attention_ref(qkv, 2, rope=(cos, sin, 1, "half")).square().sum(), qkv)[0]
    torch.testing.assert_close(qkv.grad, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(rope_sin=None), "both rope_cos and rope_sin"),
        (dict(rope_layout="pairs"), "rope_layout must be one of"),
        (dict(num_prefix=6), "num_prefix must be an int in 0..T"),
        (dict(num_prefix=0), "fewer than the T - num_prefix"),
        (dict(rope_cos=torch.ones(4, 32)), "must be [T_rot, 64]"),
        (dict(rope_cos=torch.ones(3, 4, 64), rope_sin=torch.ones(3, 4, 64)), "3 per-head tables"),
        (dict(rope_cos=torch.ones(4, 64).t().contiguous().t()), "unit stride along head_dim"),
    ],
)
def test_bad_tables_are_refused_by_name(change, message, device):
    qkv = torch.randn(1, 5, 3 * 2 * 64, device=device)
    cos, sin = split_sin_cos(_table(4, 64, "interleaved", None, device))
    rope = dict(rope_cos=cos, rope_sin=sin, num_prefix=1, rope_layout="interleaved") | change
    rope = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in rope.items()}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(".", r"\.")):
        attention(qkv, 2, **rope)
