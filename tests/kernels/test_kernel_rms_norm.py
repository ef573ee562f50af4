"""RmsNorm on the kernels: the LayerNorm kernel's RMS mode (``vit_fast::rms_norm``) and the GEMM's RMS prologue
(``vit_fast::rms_norm_linear``), against a float64 reference, judged by eager PyTorch's own error.

Row counts are not powers of two and D is 32/48/80/96/...; outputs are NaN-poisoned so an unwritten element fails.
On a CPU machine these run in Triton's interpreter (the GEMM's bf16 dots upcast to fp32 there).
"""

from __future__ import annotations

import pytest
import torch

from vit_fast.kernels.layer_norm import add_layer_norm_ref, launch_layer_norm, launch_rms_norm, rms_norm, rms_norm_ref
from vit_fast.kernels.linear import layer_norm_linear_ref, rms_norm_linear, rms_norm_linear_ref

from ..numerics import (
    assert_within_eager,
    in_float64,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)
from .test_kernel_layer_norm_linear import check_norm_linear

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# leading dims x D: one row, odd row counts, D not a power of two (80, 96: head dims; 48: 1.5 K-blocks)
SHAPES = [(1, 32), (5, 48), (2, 65, 80), (3, 33, 96), (7, 3, 40)]


def _x(lead, D, dtype, device):
    # a per-row offset: the mean is part of the mean square and must not be subtracted
    return (torch.randn(*lead, D, device=device) * 2 + torch.randn(*lead, 1, device=device) * 3).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm_matches_float64(shape, dtype, device):
    D, eps = shape[-1], 1e-6
    x = _x(shape[:-1], D, dtype, device)
    weight = (1 + 0.5 * torch.randn(D, device=device)).to(dtype)
    out = launch_rms_norm(x, weight, None, eps, out=poisoned(shape, dtype, device))
    assert_within_eager(out, rms_norm_ref(x, weight, None, eps), rms_norm_ref(*in_float64(x, weight), None, eps), "rms")
    torch.testing.assert_close(rms_norm(x, weight, None, eps), out, rtol=0, atol=0)  # the custom op: same kernel


@pytest.mark.parametrize("affine", [(False, False), (True, True), (False, True)], ids=["none", "weight+bias", "bias"])
def test_rms_norm_affine_options(affine, device):
    shape, eps = (2, 21, 48), 1e-5
    x = _x(shape[:-1], 48, torch.float32, device)
    weight = 1 + 0.5 * torch.randn(48, device=device) if affine[0] else None
    bias = torch.randn(48, device=device) if affine[1] else None
    out = launch_rms_norm(x, weight, bias, eps, out=poisoned(shape, torch.float32, device))
    ref64 = rms_norm_ref(*in_float64(x, weight, bias), eps)
    assert_within_eager(out, rms_norm_ref(x, weight, bias, eps), ref64, f"rms affine={affine}")


def test_rms_mode_is_not_layer_norm(device):
    """The RMS flag changes the kernel's result where the rows have a mean (the two modes differ by far more than
    rounding), so a flag that never reached the kernel would fail here."""
    x = _x((4, 9), 32, torch.float32, device)
    rms, ln = launch_rms_norm(x, None, None, 1e-6), launch_layer_norm(x, None, None, 1e-6)
    assert (rms - ln).abs().max() > 0.1


def test_rms_norm_strided_rows_and_gradients(device):
    """A strided view (q's columns of a packed qkv) is read by its row stride; backward recomputes eagerly."""
    qkv = _x((2, 7), 3 * 32, torch.float32, device)
    q = qkv[..., :32]
    weight = (1 + 0.5 * torch.randn(32, device=device)).requires_grad_()
    out = rms_norm(q, weight, None, 1e-6)
    assert_within_eager(out, rms_norm_ref(q, weight, None, 1e-6), rms_norm_ref(*in_float64(q, weight), None, 1e-6), "q")
    grad = torch.randn_like(out)
    (g,) = torch.autograd.grad((out * grad).sum(), weight)
    w64 = weight.detach().double().requires_grad_()
    (g64,) = torch.autograd.grad((rms_norm_ref(q.double(), w64, None, 1e-6) * grad.double()).sum(), w64)
    w_e = weight.detach().requires_grad_()
    (g_e,) = torch.autograd.grad((rms_norm_ref(q, w_e, None, 1e-6) * grad).sum(), w_e)
    assert_within_eager(g, g_e, g64, "d weight")


def test_rms_norm_refuses_bad_input_before_launch(device):
    x = _x((3,), 32, torch.float32, device)
    with pytest.raises(ValueError, match=r"weight has shape \(31,\)"):
        rms_norm(x, torch.ones(31, device=device), None, 1e-6)
    with pytest.raises(ValueError, match="eps must be a positive float"):
        rms_norm(x, None, None, 0.0)
    with pytest.raises(TypeError, match="supports float32, float16 and bfloat16"):
        rms_norm(x.double(), None, None, 1e-6)


# ------------------------------------------------------------------------------- RmsNorm folded into the GEMM
def _gemm_inputs(lead, k_in, n_out, dtype, device, activation=None, norm_weight=True):
    x = _x(lead, k_in, dtype, device)
    w = (1 + 0.3 * torch.randn(k_in, device=device)).to(dtype) if norm_weight else None
    weight = (torch.randn(n_out, k_in, device=device) * k_in**-0.5).to(dtype)
    bias = torch.randn(n_out, device=device).to(dtype)
    return x, w, None, 1e-6, weight, bias, activation


def _check_gemm(args, name):
    return check_norm_linear(args, name, rms=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_rms_norm_linear_tails(dtype, activation, device):
    """37 x 48 -> 144: tails on M, K (1.5 K-blocks: the mean square must not count padding) and N."""
    _check_gemm(_gemm_inputs((37,), 48, 144, dtype, device, activation), f"RMS 37x48->144 {activation} {dtype}")


@pytest.mark.parametrize("shape", [((2, 33), 80, 96), ((1, 65), 96, 288)], ids=str)
def test_rms_norm_linear_odd_shapes(shape, device):
    lead, k_in, n_out = shape
    _check_gemm(_gemm_inputs(lead, k_in, n_out, torch.float32, device), f"RMS {shape}")


def test_rms_norm_linear_without_weight_and_public_op(device):
    args = _gemm_inputs((5,), 32, 16, torch.float32, device, norm_weight=False)
    out = _check_gemm(args, "RMS no weight")
    torch.testing.assert_close(rms_norm_linear(*args), out, rtol=0, atol=0)
    x, w, b, eps, weight, bias, _ = args
    with pytest.raises(ValueError, match=r"rms_norm_linear: ln_weight must have shape \(32,\)"):
        rms_norm_linear(x, torch.ones(31), b, eps, weight, bias)
    with pytest.raises(ValueError, match="rms_norm_linear: eps must be a positive float"):
        rms_norm_linear(x, w, b, -1.0, weight, bias)


def test_rms_norm_linear_traces_fullgraph(device):
    x, w, b, eps, weight, bias, act = _gemm_inputs((2, 7), 32, 24, torch.float32, device)
    fn = lambda t: rms_norm_linear(t, w, b, eps, weight, bias, "gelu") * 2  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)


# name -> (reference of (x, weight, eps, upcast), whether it rounds only once: the norm-GEMM rounds the norm first)
_NORM_REFS = {
    "rms_norm_ref": (lambda x, w, eps, upcast: rms_norm_ref(x, w, None, eps, upcast=upcast), True),
    "add_layer_norm_ref": (
        lambda x, w, eps, upcast: add_layer_norm_ref(x, x.flip(-1), w, None, eps, upcast=upcast)[1],
        True,
    ),
    "rms_norm_linear_ref": (
        lambda x, w, eps, upcast: rms_norm_linear_ref(x, w, None, eps, w.diag(), upcast=upcast),
        False,
    ),
    "layer_norm_linear_ref": (
        lambda x, w, eps, upcast: layer_norm_linear_ref(x, w, None, eps, w.diag(), upcast=upcast),
        False,
    ),
}


@pytest.mark.parametrize("ref, once", _NORM_REFS.values(), ids=_NORM_REFS.keys())
def test_norm_references_upcast_only_16_bit(ref, once):
    """The references' ``upcast`` (docs/kernels.md): float16 computed in float32, float64 computed as it is (a
    float64 reference stays float64 with ``upcast=True`` too)."""
    x = _x((3, 5), 48, torch.float64, "cpu")
    weight = 1 + 0.5 * torch.randn(48, dtype=torch.float64)
    assert torch.equal(ref(x, weight, 1e-6, True), ref(x, weight, 1e-6, False))
    up = ref(x.half(), weight.half(), 1e-6, True)
    assert up.dtype == torch.float16
    if once:  # float32 throughout, one rounding at the end
        in_fp32 = ref(x.half().float(), weight.half().float(), 1e-6, False)
        torch.testing.assert_close(up, in_fp32.half(), rtol=0, atol=0)
