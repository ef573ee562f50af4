"""vit_fast::layer_norm_linear (LayerNorm folded into the prologue of the GEMM after it: LN1 -> qkv,
LN2 -> fc1) against a float64 reference, judged by eager PyTorch's own error (the project's rule).

On a CPU machine these run in Triton's interpreter (bf16 dots upcast to fp32 there, as for linear).
"""

from __future__ import annotations

import pytest
import torch

from vit_fast.kernels.linear import launch_linear, layer_norm_linear, layer_norm_linear_ref, rms_norm_linear_ref

from ..numerics import (
    assert_kernel_matches,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(lead, k_in, n_out, dtype, device, affine=(True, True), activation=None):
    # an offset and scale per row, as a residual stream has: the statistics must be taken, not assumed
    x = (torch.randn(*lead, k_in, device=device) * 3 + torch.randn(*lead, 1, device=device) * 5).to(dtype)
    ln_w = (1 + 0.3 * torch.randn(k_in, device=device)).to(dtype) if affine[0] else None
    ln_b = (0.3 * torch.randn(k_in, device=device)).to(dtype) if affine[1] else None
    weight = (torch.randn(n_out, k_in, device=device) * k_in**-0.5).to(dtype)
    bias = torch.randn(n_out, device=device).to(dtype)
    return x, ln_w, ln_b, 1e-6, weight, bias, activation


def check_norm_linear(args, name, rms=False):
    """Run the GEMM with its LayerNorm prologue (``rms``: its RmsNorm one) into a NaN-poisoned buffer and hold it to
    the numerics rule against the matching reference. ``args``: the reference's, (x, norm weight, norm bias, eps,
    weight, bias, activation)."""
    x, norm_w, norm_b, eps, weight, bias, activation = args
    out = launch_linear(
        x,
        weight,
        bias,
        activation,
        ln_weight=norm_w,
        ln_bias=norm_b,
        ln_eps=eps,
        ln_rms=rms,
        out=poisoned((*x.shape[:-1], weight.shape[0]), x.dtype, x.device),
    )
    return assert_kernel_matches(out, rms_norm_linear_ref if rms else layer_norm_linear_ref, args, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "quick_gelu", "silu"])
def test_tails_and_activations(dtype, activation, device):
    """37 x 48 -> 144: tails on M, K (1.5 K-blocks: the statistics must not count padding) and N."""
    check_norm_linear(
        _inputs((37,), 48, 144, dtype, device, activation=activation), f"LN 37x48->144 {activation} {dtype}"
    )


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)], ids=["none", "weight", "bias"])
def test_without_affine(affine, device):
    check_norm_linear(_inputs((2, 9), 40, 24, torch.float32, device, affine=affine), f"LN affine={affine}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_vit_token_count(dtype, device):
    """[1, 197, 96] -> 288 (a qkv): a ViT's token count with several K blocks."""
    check_norm_linear(_inputs((1, 197), 96, 288, dtype, device), f"LN 197x96->288 {dtype}")


def test_public_op_matches_launcher_and_checks(device):
    args = _inputs((5,), 32, 16, torch.float32, device)
    torch.testing.assert_close(layer_norm_linear(*args), check_norm_linear(args, "public op"), rtol=0, atol=0)
    x, ln_w, ln_b, eps, weight, bias, _ = args
    with pytest.raises(ValueError, match="ln_weight must have shape"):
        layer_norm_linear(x, ln_w[:-1], ln_b, eps, weight, bias)
    with pytest.raises(ValueError, match="eps must be a positive float"):
        layer_norm_linear(x, ln_w, ln_b, 0.0, weight, bias)


def test_gradients_match_reference(device):
    x, ln_w, ln_b, eps, weight, bias, act = _inputs((7,), 24, 12, torch.float32, device, activation="gelu")
    leaves = [t.clone().requires_grad_() for t in (x, ln_w, ln_b, weight, bias)]
    grads = []
    for fn in (layer_norm_linear, layer_norm_linear_ref):
        for t in leaves:
            t.grad = None
        xx, lw, lb, w, b = leaves
        fn(xx, lw, lb, eps, w, b, act).square().sum().backward()
        grads.append([t.grad.clone() for t in leaves])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_many_rows_persistent_tma(dtype, device):
    """602 rows: the LayerNorm prologue on tiles loaded by TMA descriptors in the persistent loop (statistics
    still from the rows themselves; the descriptors zero-fill the K tail the LayerNorm must not count)."""
    check_norm_linear(_inputs((2, 301), 48, 72, dtype, device, activation="gelu"), f"LN 602x48->72 TMA {dtype}")
