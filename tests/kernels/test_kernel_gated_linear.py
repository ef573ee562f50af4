"""The GEMM's gated (GLU) epilogue: a weight of two stacked halves ``[2N, K]``, one launch writing ``act(x1) * x2``
(SwiGLU: ``silu_glu``) or ``x1 * act(x2)`` (``*_glu_last``, timm's GluMlp default), N columns, with the plain
GEMM's bias / residual / LayerScale and its LayerNorm or RmsNorm prologue. Judged against float64 by eager
PyTorch's own error (tests/numerics.py), into NaN-poisoned outputs, in Triton's interpreter on a CPU."""

from __future__ import annotations

import pytest
import torch

from vit_fast.base.interpret import interpreter_enabled
from vit_fast.kernels import KERNELS
from vit_fast.kernels.autotune import autotune_enabled
from vit_fast.kernels.launches import record_launches
from vit_fast.kernels.linear import (
    launch_linear,
    layer_norm_linear,
    layer_norm_linear_ref,
    linear,
    linear_ref,
    rms_norm_linear_ref,
)
from vit_fast.kernels.linear_tiles import GATED

from ..numerics import (
    assert_kernel_matches,
    assert_within_eager,
    in_float64,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(lead, k_in, n_out, dtype, device, activation="silu_glu", bias=True, residual=False):
    """x [*lead, K], a stacked weight [2 * n_out, K] (gate rows first), bias [2 * n_out], residual and gamma
    [n_out]: outputs of order 1."""
    x = torch.randn(*lead, k_in, device=device).to(dtype)
    weight = (torch.randn(2 * n_out, k_in, device=device) * k_in**-0.5).to(dtype)
    b = torch.randn(2 * n_out, device=device).to(dtype) if bias else None
    res = (2 * torch.randn(*lead, n_out, device=device)).to(dtype) if residual else None
    gamma = torch.randn(n_out, device=device).to(dtype) if residual else None
    return x, weight, b, activation, res, gamma


def _check(args, name):
    x, weight = args[0], args[1]
    out = launch_linear(*args, out=poisoned((*x.shape[:-1], weight.shape[0] // 2), x.dtype, x.device))
    return assert_kernel_matches(out, linear_ref, args, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["silu_glu", "gelu_glu_last"])
def test_gated_tails(activation, dtype, device):
    """37 x 48 -> 2 x 72: tails on M, K (1.5 K-blocks) and N (72 = 1.125 N-blocks), both gate sides."""
    _check(_inputs((37,), 48, 72, dtype, device, activation), f"{activation} 37x48->72 {dtype}")


@pytest.mark.parametrize("activation", GATED)
def test_every_gated_activation(activation, device):
    _check(_inputs((2, 9), 24, 20, torch.float32, device, activation, bias=False), f"{activation} fp32")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_gated_with_residual_and_layer_scale(dtype, device):
    """The gated output feeds the residual add as a plain GEMM's does (a block's last GEMM never gates, but the
    epilogue composes)."""
    _check(_inputs((1, 50), 40, 24, dtype, device, residual=True), f"gated residual {dtype}")


def test_one_launch_and_the_public_op(device):
    """A SwiGLU fc1 is one launch (the gate is the epilogue, not a second pass), and the custom op computes what the
    launcher does, with N = rows / 2 columns."""
    args = _inputs((2, 5), 32, 40, torch.float16, device)
    with record_launches() as launches:
        direct = launch_linear(*args)
    assert len(launches) == 1 and direct.shape == (2, 5, 40)
    assert torch.equal(linear(*args), direct)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_gated_with_norm_prologue(rms, dtype, device):
    """EVA-02 / AIMv2 fc1: the block's LayerNorm or RmsNorm in the GEMM's prologue, the gate in its epilogue."""
    x, weight, bias, act, _, _ = _inputs((33,), 40, 36, dtype, device)
    norm_w = (1 + 0.3 * torch.randn(40, device=device)).to(dtype)
    norm_b = None if rms else (0.1 * torch.randn(40, device=device)).to(dtype)
    args = (x, norm_w, norm_b, 1e-6, weight, bias, act)
    out = launch_linear(
        x, weight, bias, act, ln_weight=norm_w, ln_bias=norm_b, ln_eps=1e-6, ln_rms=rms,
        out=poisoned((33, 36), dtype, device),
    )  # fmt: skip
    assert_kernel_matches(out, rms_norm_linear_ref if rms else layer_norm_linear_ref, args, f"norm+gate {rms} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_many_rows_take_the_persistent_tma_tiles(dtype, device):
    """602 rows of 16-bit operands: the persistent TMA tiles, whose weight descriptor spans both halves."""
    _check(_inputs((2, 301), 48, 40, dtype, device), f"gated TMA {dtype}")
    if interpreter_enabled() or not autotune_enabled():
        assert KERNELS["linear"].kernel.best_config.kwargs["TMA"]


def test_gradients_through_the_reference(device):
    """Backward of the gated op (recomputed through the reference) for x, the stacked weight and bias, against
    float64, with the LayerNorm prologue too."""
    x, weight, bias, act, _, _ = _inputs((2, 3), 16, 12, torch.float32, device)
    grad_out = torch.randn(2, 3, 12, device=device)

    def grads(fn, inputs):
        leaves = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in inputs]
        wanted = [t for t in leaves if isinstance(t, torch.Tensor)]
        return torch.autograd.grad(fn(*leaves), wanted, grad_out.to(inputs[0].dtype))

    for fn, ref, args in (
        (linear, linear_ref, (x, weight, bias, act)),
        (layer_norm_linear, layer_norm_linear_ref, (x, torch.ones(16), torch.zeros(16), 1e-6, weight, bias, act)),
    ):
        for ours, eager, exact in zip(grads(fn, args), grads(ref, args), grads(ref, in_float64(*args)), strict=True):
            assert_within_eager(ours, eager, exact, f"d gated {fn.__name__}")


def test_traces_fullgraph(device):
    x, weight, bias, act, _, _ = _inputs((2, 7), 32, 24, torch.float32, device)
    fn = lambda t: linear(t, weight, bias, act) * 2  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    assert out.shape == (2, 7, 24)
    torch.testing.assert_close(out, fn(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "case, match",
    [
        ("odd rows", r"needs the two halves stacked, weight \[2N, K\]; got 41 rows"),
        ("bias of N", r"bias must have shape \(40,\)"),
        ("residual of 2N", r"residual must have shape \(3, 20\)"),
        ("unknown", "activation must be one of"),
    ],
)
def test_bad_gated_inputs_raise_before_launch(case, match, device):
    x, weight, bias, act, _, _ = _inputs((3,), 8, 20, torch.float32, device)
    residual = None
    if case == "odd rows":
        weight = torch.randn(41, 8, device=device)
        bias = None
    elif case == "bias of N":
        bias = bias[:20]
    elif case == "residual of 2N":
        residual = torch.randn(3, 40, device=device)
    else:
        act = "silu_glu_first"
    with pytest.raises(ValueError, match=match):
        linear(x, weight, bias, act, residual)
