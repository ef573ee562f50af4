"""vit_fast::attention against a float64 reference, judged by eager PyTorch's own error.

On a CPU machine these run in Triton's interpreter. bfloat16 is a real test there only because
the launcher hands the dot operands to tl.dot as fp32 when interpreting (the interpreter's bf16
tl.dot returns garbage) and rounds the bf16 store by hand (its fp32 -> bf16 cast truncates); a
garbage result would fail the 2x-eager bound by ten orders of magnitude. On a GPU the same tests
run the compiled kernel with real bf16 dots.
"""

from __future__ import annotations

import pytest
import torch

from vit_fast.kernels.attention import attention, attention_ref, launch_attention

from ..numerics import (
    assert_within_eager,
    max_err,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _qkv(batch, tokens, heads, head_dim, dtype, device):
    return torch.randn(batch, tokens, 3 * heads * head_dim, device=device).to(dtype)


def _check(qkv, heads, scale=None, name="attention"):
    """Run the kernel into a NaN-poisoned buffer and hold it to 2x eager's error vs float64."""
    batch, tokens, width = qkv.shape
    out = launch_attention(qkv, heads, scale, out=poisoned((batch, tokens, width // 3), qkv.dtype, qkv.device))
    ref64 = attention_ref(qkv.double(), heads, scale)
    eager = attention_ref(qkv, heads, scale)
    assert_within_eager(out, eager, ref64, name)
    return out


# ------------------------------------------------------------------------------ forward numerics
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 5, 50, 65, 196, 197, 257, 577])
def test_token_counts(tokens, dtype, device):
    """Odd T at head_dim 64: one query block, query/key tails, several key blocks."""
    _check(_qkv(2, tokens, 1, 64, dtype, device), heads=1, name=f"T={tokens} {dtype}")


# every dtype at 65 tokens; 197 tokens (ViT-B's count) in fp16 only, to keep the interpreter suite short
HEAD_DIM_CASES = [(65, head_dim, dtype) for head_dim in (32, 80, 96, 128) for dtype in DTYPES] + [
    (197, head_dim, torch.float16) for head_dim in (32, 80, 96, 128)
]


@pytest.mark.parametrize("tokens, head_dim, dtype", HEAD_DIM_CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_head_dims(tokens, head_dim, dtype, device):
    """Power-of-two and padded (80, 96 -> 128) head dims, two heads side by side in the output."""
    _check(_qkv(1, tokens, 2, head_dim, dtype, device), heads=2, name=f"Dh={head_dim} T={tokens} {dtype}")


@pytest.mark.parametrize("head_dim", [16, 40, 256])
def test_head_dim_range_edges(head_dim, device):
    """The smallest and largest supported head dims, and one (40) that is not a multiple of 16."""
    _check(_qkv(1, 5, 3, head_dim, torch.float16, device), heads=3, name=f"Dh={head_dim}")


def test_custom_scale(device):
    _check(_qkv(2, 50, 2, 32, torch.float32, device), heads=2, scale=0.3, name="scale=0.3")


def test_large_logits_are_stable(device):
    """Logits of a few hundred: exp without the running max would overflow fp32."""
    qkv = _qkv(1, 65, 1, 64, torch.float32, device) * 6.0
    assert attention_ref(qkv.double(), 1).isfinite().all()
    _check(qkv, heads=1, name="large logits")


def test_strided_views_in_and_out(device):
    """qkv as a slice of a larger buffer (batch step 2, token offset, padded rows) and the output
    written into a window of a larger poisoned buffer: strides are honoured, nothing else written."""
    batch, tokens, heads, head_dim = 2, 50, 2, 32
    width = 3 * heads * head_dim
    big = torch.randn(2 * batch, tokens + 3, width + 40, device=device)
    qkv = big[::2, 1 : 1 + tokens, 8 : 8 + width]
    assert not qkv.is_contiguous() and qkv.stride(-1) == 1
    canvas = poisoned((batch, tokens + 2, heads * head_dim + 16), torch.float32, device)
    window = canvas[:, 1 : 1 + tokens, 4 : 4 + heads * head_dim]
    launch_attention(qkv, heads, out=window)
    ref64 = attention_ref(qkv.double(), heads)
    assert_within_eager(window, attention_ref(qkv, heads), ref64, "strided")
    assert torch.equal(attention(qkv, heads), launch_attention(qkv.contiguous(), heads))
    outside = torch.ones_like(canvas, dtype=torch.bool)
    outside[:, 1 : 1 + tokens, 4 : 4 + heads * head_dim] = False
    assert canvas[outside].isnan().all(), "the kernel wrote outside its output window"


def test_public_op_matches_launcher(device):
    """attention() (validation + custom op) computes exactly what the checked launcher computes."""
    qkv = _qkv(2, 65, 2, 32, torch.float16, device)
    ours = attention(qkv, 2)
    assert ours.dtype == torch.float16 and ours.shape == (2, 65, 64)
    assert torch.equal(ours, launch_attention(qkv, 2))
    assert torch.equal(attention(qkv, 2, scale=32**-0.5), ours), "scale=None must mean head_dim ** -0.5"


# ------------------------------------------------------------------------------ autograd, compile
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_gradients(dtype, device):
    """Backward (recomputed through the reference) against float64 autograd."""
    qkv = _qkv(2, 5, 2, 16, dtype, device)
    grad_out = torch.randn(2, 5, 32, device=device).to(dtype)

    def grad_of(fn, inp):
        leaf = inp.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(fn(leaf), leaf, grad_out.to(inp.dtype))
        return grad

    ours = grad_of(lambda t: attention(t, 2), qkv)
    eager = grad_of(lambda t: attention_ref(t, 2), qkv)
    ref64 = grad_of(lambda t: attention_ref(t, 2), qkv.double())
    assert ours.dtype == dtype
    assert_within_eager(ours, eager, ref64, f"d qkv {dtype}")


def test_torch_compile_fullgraph(device):
    """The custom op traces without graph breaks (fullgraph=True), forward and backward."""

    def block(qkv):
        return attention(qkv * 0.5, 2).sum(dim=-1)

    qkv = _qkv(1, 5, 2, 16, torch.float32, device).requires_grad_(True)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(qkv)
    (grad,) = torch.autograd.grad(out.sum(), qkv)
    eager_out = block(qkv)
    (eager_grad,) = torch.autograd.grad(eager_out.sum(), qkv)
    assert torch.equal(out, eager_out)
    assert max_err(grad, eager_grad.double()) < 1e-6


# ------------------------------------------------------------------------------ input checks
def _randn(*shape):
    return lambda device: torch.randn(*shape, device=device)


# id -> (qkv factory, extra kwargs, exception type, message pattern)
BAD_INPUTS = {
    "not-tensor": (lambda device: [[1.0]], {}, TypeError, "qkv must be a torch.Tensor"),
    "2d": (_randn(5, 96), {}, ValueError, r"shape \[B, T, 3 \* num_heads \* head_dim\]"),
    "float64": (lambda d: torch.randn(1, 5, 96, device=d).double(), {}, TypeError, "float64 is not supported"),
    "zero-heads": (_randn(1, 5, 96), {"num_heads": 0}, ValueError, "num_heads must be a positive int"),
    "indivisible": (_randn(1, 5, 100), {}, ValueError, r"not 3 \* num_heads \* head_dim with num_heads=2"),
    "head-dim-8": (_randn(1, 5, 48), {}, ValueError, r"head_dim 8 .* outside the supported range 16\.\.256"),
    "head-dim-512": (_randn(1, 5, 3 * 512), {"num_heads": 1}, ValueError, "head_dim 512 .* torch backend"),
    "no-tokens": (_randn(1, 0, 96), {}, ValueError, "T = 0 tokens"),
    "strided-last-dim": (
        lambda d: torch.randn(1, 96, 5, device=d).transpose(1, 2),
        {},
        ValueError,
        r"last dim must be contiguous .* qkv\.contiguous\(\)",
    ),
    "nan-scale": (_randn(1, 5, 96), {"scale": float("nan")}, ValueError, "scale must be a finite float"),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_inputs_raise_clear_errors(case, device):
    make, kwargs, error, match = case
    with pytest.raises(error, match=match):
        attention(make(device), **{"num_heads": 2, **kwargs})


def test_bad_out_buffer(device):
    qkv = _qkv(1, 5, 2, 16, torch.float16, device)
    with pytest.raises(ValueError, match=r"out must be \[1, 5, 32\] torch.float16"):
        launch_attention(qkv, 2, out=torch.empty(1, 5, 32, device=device))  # float32


def test_cpu_tensor_without_interpreter(monkeypatch):
    """Without TRITON_INTERPRET a CPU tensor is refused before any launch, with both ways out."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"need a CUDA tensor.*\.cuda\(\).*TRITON_INTERPRET=1"):
        attention(torch.randn(1, 5, 96), 2)
