"""vit_fast::attention with a key-padding mask (``lengths``) and packed images (``cu_seqlens``).

Judged as the unmasked kernel is (tests/kernels/test_kernel_attention.py): against a float64 reference, at most 2x
eager's error in the same dtype plus the floor (``vit_fast.util.numerics``); bf16 runs through the interpreter's fp32
dot path. Every padding token of qkv is NaN, and the output buffer starts as NaN: a valid row that read padding, or an
element the kernel left unwritten, is not finite. The masked reference is itself checked against the unmasked reference
run on each sequence cut out alone, so the kernel and its reference cannot share a masking mistake.
"""

from __future__ import annotations

import pytest
import torch

from vit_fast.kernels import KERNELS
from vit_fast.kernels.attention import attention, attention_ref, launch_attention

from ..numerics import (
    assert_within_eager,
    max_err,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: one padded batch: a single token, under one query tile, exactly one and just past one key tile (64), ViT-B/16's
#: 197 and a DeiT-style 257 (the longest: T)
LENGTHS = [1, 5, 64, 65, 197, 257]


def _qkv(batch, tokens, heads, head_dim, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, tokens, 3 * heads * head_dim, generator=generator).to(device=device, dtype=dtype)


def _padding(batch, tokens, lengths=None, cu_seqlens=None) -> torch.Tensor:
    """``[B, T]`` bool: the padding tokens (past an image's length, or after the last packed segment)."""
    positions = torch.arange(batch * tokens).view(batch, tokens)
    if lengths is not None:
        return positions % tokens >= lengths.cpu().long()[:, None]
    return positions >= int(cu_seqlens[-1])


def _sequences(batch, tokens, lengths=None, cu_seqlens=None):
    """(row, first token, token count) of every sequence the mask describes."""
    if lengths is not None:
        return [(b, 0, int(n)) for b, n in enumerate(lengths.tolist())]
    offsets = cu_seqlens.tolist()
    return [(start // tokens, start % tokens, end - start) for start, end in zip(offsets, offsets[1:], strict=False)]


def _check_masked(qkv, heads, name, lengths=None, cu_seqlens=None, max_seqlen=None):
    """Poison qkv's padding with NaN, run the kernel into a NaN buffer, and hold every valid row to 2x eager's
    error against float64; padding rows must be exact zeros."""
    batch, tokens, width = qkv.shape
    padding = _padding(batch, tokens, lengths, cu_seqlens).to(qkv.device)
    qkv = qkv.masked_fill(padding[..., None], float("nan"))
    masks = {"lengths": lengths, "cu_seqlens": cu_seqlens}
    out = poisoned((batch, tokens, width // 3), qkv.dtype, qkv.device)
    launch_attention(qkv, heads, out=out, max_seqlen=max_seqlen, **masks)
    ref64 = attention_ref(qkv.double(), heads, **masks)
    eager = attention_ref(qkv, heads, **masks)
    assert ref64.isfinite().all() and eager.isfinite().all(), "the reference read padding"
    # the masked reference, sequence by sequence, is the unmasked one on that sequence alone
    for row, first, count in _sequences(batch, tokens, lengths, cu_seqlens):
        if count:
            alone = attention_ref(qkv[row : row + 1, first : first + count].double(), heads)
            assert max_err(ref64[row : row + 1, first : first + count], alone) < 1e-12, (name, row, first, count)
    assert out.isfinite().all(), f"{name}: a non-finite output (padding read, or an element left unwritten)"
    assert (out[padding] == 0).all(), f"{name}: padding rows must be zeros"
    assert_within_eager(out, eager, ref64, name)
    return out


# ------------------------------------------------------------------------------ a padded batch
# Dh 128 is the heaviest case of the file: 4-6 s each in the interpreter on a 2-core machine
PADDED_CASES = [(dtype, 64) for dtype in DTYPES] + [
    pytest.param(dtype, 128, marks=pytest.mark.slow) for dtype in DTYPES
]


@pytest.mark.parametrize("dtype, head_dim", PADDED_CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_padded_batch(dtype, head_dim, device):
    """Lengths 1 .. 257 side by side in one batch of T = 257: query tiles wholly in padding (zeros, no key tile
    run), tiles straddling an image's end, key loops ending at the image's last tile."""
    lengths = torch.tensor(LENGTHS, dtype=torch.int32, device=device)
    qkv = _qkv(len(LENGTHS), max(LENGTHS), 2, head_dim, dtype, device)
    _check_masked(qkv, 2, f"lengths Dh={head_dim} {dtype}", lengths=lengths)


@pytest.mark.parametrize("head_dim", [16, 40, 80])
def test_padded_batch_small_and_padded_head_dims(head_dim, device):
    """The smallest head dim, one that is not a multiple of 16, and one padded to 128 lanes; zero-length images."""
    lengths = torch.tensor([0, 33, 7, 0], dtype=torch.int32, device=device)
    _check_masked(_qkv(4, 40, 3, head_dim, torch.float16, device), 3, f"lengths Dh={head_dim}", lengths=lengths)


def test_full_lengths_are_the_unmasked_kernel(device):
    """Every image at full length: exactly what the unmasked kernel computes."""
    qkv = _qkv(3, 70, 2, 32, torch.float32, device)
    full = torch.full((3,), 70, dtype=torch.int32, device=device)
    assert torch.equal(launch_attention(qkv, 2, lengths=full), launch_attention(qkv, 2))


# ------------------------------------------------------------------------------ packed images
def _cu(*offsets, device):
    return torch.tensor(offsets, dtype=torch.int32, device=device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_packed_images(dtype, device):
    """Odd segment lengths in two rows of 131 tokens (1, 5, 64 and 61 fill row 0; 65, an empty segment and 37 in
    row 1), then 29 tokens of padding: no attention across images, zeros after the last."""
    cu_seqlens = _cu(0, 1, 6, 70, 131, 196, 196, 233, device=device)
    qkv = _qkv(2, 131, 2, 64, dtype, device)
    _check_masked(qkv, 2, f"packed {dtype}", cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("head_dim", [16, 40, 128])
def test_packed_head_dims(head_dim, device):
    """Packed images at other head dims; the padding after the last segment spans a whole row and part of another
    (the zero-writing programs cross a row boundary)."""
    cu_seqlens = _cu(0, 9, 20, 33, device=device)
    qkv = _qkv(3, 20, 2, head_dim, torch.float16, device)
    _check_masked(qkv, 2, f"packed Dh={head_dim}", cu_seqlens=cu_seqlens)


def test_packed_max_seqlen(device):
    """A tight ``max_seqlen`` launches fewer programs and computes the same; the padding is still zeroed."""
    cu_seqlens = _cu(0, 3, 40, 40, 70, 100, 137, device=device)
    qkv = _qkv(3, 70, 2, 32, torch.float32, device)
    loose = _check_masked(qkv, 2, "packed, max_seqlen T", cu_seqlens=cu_seqlens)
    tight = _check_masked(qkv, 2, "packed, max_seqlen 37", cu_seqlens=cu_seqlens, max_seqlen=37)
    assert torch.equal(loose, tight)


def test_one_segment_per_row_is_the_unmasked_kernel(device):
    """One segment per full row: exactly what the unmasked kernel computes."""
    qkv = _qkv(3, 70, 2, 32, torch.float32, device)
    assert torch.equal(launch_attention(qkv, 2, cu_seqlens=_cu(0, 70, 140, 210, device=device)), attention(qkv, 2))


def test_packed_strided_qkv_and_out(device):
    """qkv a strided slice of a larger buffer and out a window of a larger poisoned one: strides honoured, nothing
    written outside the window (the padding's zeros included)."""
    batch, tokens, heads, head_dim = 2, 30, 2, 16
    width = 3 * heads * head_dim
    big = torch.randn(2 * batch, tokens + 3, width + 40, device=device)
    qkv = big[::2, 1 : 1 + tokens, 8 : 8 + width]
    cu_seqlens = _cu(0, 11, 30, 47, device=device)
    canvas = poisoned((batch, tokens + 2, heads * head_dim + 16), torch.float32, device)
    window = canvas[:, 1 : 1 + tokens, 4 : 4 + heads * head_dim]
    launch_attention(qkv, heads, cu_seqlens=cu_seqlens, out=window)
    assert torch.equal(window, launch_attention(qkv.contiguous(), heads, cu_seqlens=cu_seqlens))
    ref64 = attention_ref(qkv.double(), heads, cu_seqlens=cu_seqlens)
    assert_within_eager(window, attention_ref(qkv, heads, cu_seqlens=cu_seqlens), ref64, "strided packed")
    outside = torch.ones_like(canvas, dtype=torch.bool)
    outside[:, 1 : 1 + tokens, 4 : 4 + heads * head_dim] = False
    assert canvas[outside].isnan().all(), "the kernel wrote outside its output window"


# ------------------------------------------------------------------------------ the public op, autograd, compile
def test_public_op_matches_launcher(device):
    qkv = _qkv(2, 40, 2, 32, torch.float16, device)
    lengths = torch.tensor([40, 17], dtype=torch.int32, device=device)
    cu_seqlens = _cu(0, 25, 40, 57, device=device)
    assert torch.equal(attention(qkv, 2, lengths=lengths), launch_attention(qkv, 2, lengths=lengths))
    assert torch.equal(attention(qkv, 2, cu_seqlens=cu_seqlens), launch_attention(qkv, 2, cu_seqlens=cu_seqlens))


@pytest.mark.parametrize("mask", ["lengths", "cu_seqlens"])
def test_gradients(mask, device):
    """Backward (recomputed through the masked reference) against float64 autograd; padding gets zero gradient
    even where it holds NaN."""
    qkv = _qkv(2, 9, 2, 16, torch.float32, device)
    masks = {
        "lengths": {"lengths": torch.tensor([9, 4], dtype=torch.int32, device=device)},
        "cu_seqlens": {"cu_seqlens": _cu(0, 3, 9, 14, device=device)},
    }[mask]
    padding = _padding(2, 9, **masks).to(device)
    qkv = qkv.masked_fill(padding[..., None], float("nan"))
    grad_out = torch.randn(2, 9, 32, device=device)

    def grad_of(fn, inp):
        leaf = inp.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(fn(leaf), leaf, grad_out.to(inp.dtype))
        return grad

    ours = grad_of(lambda t: attention(t, 2, **masks), qkv)
    eager = grad_of(lambda t: attention_ref(t, 2, **masks), qkv)
    ref64 = grad_of(lambda t: attention_ref(t, 2, **masks), qkv.double())
    assert ours.isfinite().all() and (ours[padding] == 0).all()
    assert_within_eager(ours, eager, ref64, f"d qkv, {mask}")


def test_torch_compile_fullgraph(device):
    """The masked op traces without graph breaks (the fake implementation takes the optional tensors)."""
    lengths = torch.tensor([5, 2], dtype=torch.int32, device=device)
    cu_seqlens = _cu(0, 2, 5, 8, device=device)

    def block(qkv):
        return (attention(qkv * 0.5, 2, lengths=lengths) + attention(qkv, 2, cu_seqlens=cu_seqlens, max_seqlen=3)).sum()

    qkv = _qkv(2, 5, 2, 16, torch.float32, device).requires_grad_(True)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(qkv)
    (grad,) = torch.autograd.grad(out, qkv)
    eager_out = block(qkv)
    (eager_grad,) = torch.autograd.grad(eager_out, qkv)
    assert torch.equal(out, eager_out)
    assert max_err(grad, eager_grad.double()) < 1e-6


# ------------------------------------------------------------------------------ bad arguments
def _i32(*values):
    return lambda device: torch.tensor(values, dtype=torch.int32, device=device)


# id -> (mask kwargs factory on a [2, 5, 3 * 2 * 16] qkv, message pattern)
BAD_MASKS = {
    "length-past-T": (lambda d: {"lengths": _i32(5, 6)(d)}, r"lengths\[1\] = 6 is outside 0\.\.T = 0\.\.5"),
    "negative-length": (lambda d: {"lengths": _i32(-1, 5)(d)}, r"lengths\[0\] = -1 is outside"),
    "lengths-int64": (
        lambda d: {"lengths": torch.tensor([5, 5], device=d)},
        r"lengths must be int32, got torch.int64; pass lengths\.to\(torch\.int32\)",
    ),
    "lengths-float": (lambda d: {"lengths": torch.ones(2, device=d)}, "lengths must be int32, got torch.float32"),
    "lengths-shape": (lambda d: {"lengths": _i32(5, 5, 5)(d)}, r"lengths must have shape \[B\] = \[2\], got \(3,\)"),
    "lengths-list": (lambda d: {"lengths": [5, 5]}, "lengths must be an int32 torch.Tensor, got list"),
    "lengths-device": (
        lambda d: {"lengths": torch.full((2,), 5, dtype=torch.int32, device="meta")},
        r"lengths is on meta but qkv is on .*; pass lengths\.to\(qkv\.device\)",
    ),
    "both": (lambda d: {"lengths": _i32(5, 5)(d), "cu_seqlens": _i32(0, 5)(d)}, "lengths .* or cu_seqlens .*not both"),
    "non-monotonic": (
        lambda d: {"cu_seqlens": _i32(0, 4, 3, 8)(d)},
        r"cu_seqlens must be non-decreasing, got cu_seqlens\[2\] = 3 < cu_seqlens\[1\] = 4",
    ),
    "cu-not-from-0": (lambda d: {"cu_seqlens": _i32(1, 5)(d)}, r"cu_seqlens\[0\] must be 0, got 1"),
    "cu-past-end": (lambda d: {"cu_seqlens": _i32(0, 5, 11)(d)}, r"cu_seqlens\[2\] = 11 is past the B \* T = 2 \* 5"),
    "cu-across-rows": (
        lambda d: {"cu_seqlens": _i32(0, 3, 7)(d)},
        r"segment 1 \(tokens 3\.\.6 of the B \* T\) crosses from image row 0 into row 1",
    ),
    "cu-int64": (lambda d: {"cu_seqlens": torch.tensor([0, 5], device=d)}, "cu_seqlens must be int32, got torch.int64"),
    "cu-one-offset": (lambda d: {"cu_seqlens": _i32(0)(d)}, r"cu_seqlens must have shape \[N \+ 1\] with N >= 1"),
    "cu-device": (
        lambda d: {"cu_seqlens": torch.zeros(3, dtype=torch.int32, device="meta")},
        "cu_seqlens is on meta but qkv is on",
    ),
    "max-seqlen-short": (
        lambda d: {"cu_seqlens": _i32(0, 2, 5)(d), "max_seqlen": 2},
        "segment 1 has 3 tokens, more than max_seqlen = 2",
    ),
    "max-seqlen-alone": (lambda d: {"max_seqlen": 4}, "max_seqlen goes with cu_seqlens"),
    "max-seqlen-negative": (
        lambda d: {"cu_seqlens": _i32(0, 5)(d), "max_seqlen": -1},
        "max_seqlen must be an int >= 0 or None, got -1",
    ),
}


@pytest.mark.parametrize("case", BAD_MASKS.values(), ids=BAD_MASKS.keys())
def test_bad_masks_raise_before_launch(case, device, monkeypatch):
    make, match = case
    launched = []
    monkeypatch.setattr(
        KERNELS["attention"].module, KERNELS["attention"].launches_name, lambda *a, **k: launched.append(a)
    )
    qkv = _qkv(2, 5, 2, 16, torch.float32, device)
    for entry in (attention, launch_attention):
        with pytest.raises(ValueError, match=match):
            entry(qkv, 2, **make(device))
    assert not launched
