"""vit_fast::add_layer_norm / vit_fast::layer_norm against a float64 reference, by eager's own error.

There is no tl.dot in this kernel, so bfloat16 is tested for real under the interpreter too.
"""

from __future__ import annotations

import pytest
import torch

from vit_fast.kernels.layer_norm import (
    add_layer_norm,
    add_layer_norm_ref,
    launch_add_layer_norm,
    launch_layer_norm,
    layer_norm,
)

from ..numerics import (
    assert_within_eager,
    in_float64,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# leading dims x D: a single row, odd token counts, D not a power of two
SHAPES = [(1, 32), (5, 37), (2, 65, 96), (3, 197, 40)]


def _inputs(shape, dtype, device, affine=True):
    D = shape[-1]
    x = torch.randn(shape, device=device).to(dtype)
    residual = (3 * torch.randn(shape, device=device) + 0.5).to(dtype)  # an offset the norm must remove
    weight = (1 + 0.5 * torch.randn(D, device=device)).to(dtype) if affine else None
    bias = torch.randn(D, device=device).to(dtype) if affine else None
    return x, residual, weight, bias


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_layer_norm_matches_float64(shape, dtype, device):
    eps = 1e-6
    x, residual, weight, bias = _inputs(shape, dtype, device)
    summed, normed = launch_add_layer_norm(
        x,
        residual,
        weight,
        bias,
        eps,
        summed_out=poisoned(shape, dtype, device),
        normed_out=poisoned(shape, dtype, device),
    )
    summed64, normed64 = add_layer_norm_ref(*in_float64(x, residual, weight, bias), eps)
    summed_eager, normed_eager = add_layer_norm_ref(x, residual, weight, bias, eps)
    assert_within_eager(summed, summed_eager, summed64, "summed")
    assert_within_eager(normed, normed_eager, normed64, "normed")
    # the custom op runs the same kernel
    s_op, n_op = add_layer_norm(x, residual, weight, bias, eps)
    torch.testing.assert_close(s_op, summed, rtol=0, atol=0)
    torch.testing.assert_close(n_op, normed, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
def test_layer_norm_without_residual(dtype, affine, device):
    shape, eps = (2, 50, 40), 1e-5
    x, _, weight, bias = _inputs(shape, dtype, device, affine)
    x = x * 4 + 2
    normed = launch_layer_norm(x, weight, bias, eps, out=poisoned(shape, dtype, device))
    _, normed64 = add_layer_norm_ref(*in_float64(x, None, weight, bias), eps)
    _, eager = add_layer_norm_ref(x, None, weight, bias, eps)
    assert_within_eager(normed, eager, normed64, "normed")
    summed, normed_op = add_layer_norm(x, None, weight, bias, eps)
    assert summed is x, "with residual=None, summed must be x itself, not a copy"
    torch.testing.assert_close(normed_op, normed, rtol=0, atol=0)
    torch.testing.assert_close(layer_norm(x, weight, bias, eps), normed, rtol=0, atol=0)


def test_non_contiguous_rows(device):
    """A strided view (every other token) is read by its row stride."""
    x, residual, weight, bias = _inputs((2, 10, 48), torch.float32, device)
    xs, rs = x[:, ::2], residual[:, 1::2]
    summed, normed = add_layer_norm(xs, rs, weight, bias, 1e-6)
    s64, n64 = add_layer_norm_ref(*in_float64(xs, rs, weight, bias), 1e-6)
    s_e, n_e = add_layer_norm_ref(xs, rs, weight, bias, 1e-6)
    assert_within_eager(summed, s_e, s64, "summed")
    assert_within_eager(normed, n_e, n64, "normed")


def test_gradients_match_float64(device):
    shape, eps = (2, 5, 24), 1e-6
    inputs = [t.requires_grad_() for t in _inputs(shape, torch.float32, device)]
    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    g_summed, g_normed = torch.randn(shape, device=device), torch.randn(shape, device=device)

    def loss(fn, ts, cast):
        summed, normed = fn(*ts, eps)
        return (summed * cast(g_summed)).sum() + (normed * cast(g_normed)).sum()

    grads = torch.autograd.grad(loss(add_layer_norm, inputs, lambda t: t), inputs)
    grads64 = torch.autograd.grad(loss(add_layer_norm_ref, inputs64, torch.Tensor.double), inputs64)
    eager = [t.detach().clone().requires_grad_() for t in inputs]
    grads_eager = torch.autograd.grad(loss(add_layer_norm_ref, eager, lambda t: t), eager)
    for name, g, g_e, g64 in zip(("x", "residual", "weight", "bias"), grads, grads_eager, grads64, strict=True):
        assert_within_eager(g, g_e, g64, f"d{name}")

    x = inputs[0].detach().requires_grad_()
    (layer_norm(x, None, None, eps) * g_normed).sum().backward()
    x64 = x.detach().double().requires_grad_()
    (torch.nn.functional.layer_norm(x64, (shape[-1],), eps=eps) * g_normed.double()).sum().backward()
    x_e = x.detach().requires_grad_()
    (torch.nn.functional.layer_norm(x_e, (shape[-1],), eps=eps) * g_normed).sum().backward()
    assert_within_eager(x.grad, x_e.grad, x64.grad, "dx (layer_norm)")


def test_torch_compile_fullgraph(device):
    x, residual, weight, bias = _inputs((2, 7, 40), torch.float32, device)

    def fn(x, residual):
        summed, normed = add_layer_norm(x, residual, weight, bias, 1e-6)
        return summed * 2 + layer_norm(normed, weight, None, 1e-5)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, residual), fn(x, residual), rtol=0, atol=0)


# ------------------------------------------------------------------------------- malformed inputs
def _good(device):
    return _inputs((2, 5, 16), torch.float32, device)


def _bad_cases():
    def with_(**kw):
        def make(device):
            x, residual, weight, bias = _good(device)
            args = dict(x=x, residual=residual, weight=weight, bias=bias, eps=1e-6)
            for k, fn in kw.items():
                args[k] = fn(args)
            return args

        return make

    return [
        ("int-x", with_(x=lambda a: a["x"].long()), TypeError, "supports float32, float16 and bfloat16"),
        ("float64-x", with_(x=lambda a: a["x"].double()), TypeError, "supports float32"),
        ("residual-dtype", with_(residual=lambda a: a["residual"].half()), TypeError, r"residual has dtype .*to\("),
        ("weight-dtype", with_(weight=lambda a: a["weight"].bfloat16()), TypeError, "weight has dtype"),
        ("residual-shape", with_(residual=lambda a: a["residual"][:, :4]), ValueError, "residual has shape"),
        ("weight-shape", with_(weight=lambda a: a["weight"][:8]), ValueError, r"weight must be \(16,\)"),
        ("bias-shape", with_(bias=lambda a: a["bias"][None]), ValueError, "bias has shape"),
        ("eps", with_(eps=lambda a: 0.0), ValueError, "eps must be a positive float"),
        (
            "empty-D",
            with_(x=lambda a: a["x"][..., :0], residual=lambda a: None, weight=lambda a: None, bias=lambda a: None),
            ValueError,
            "empty last dim",
        ),
        (
            "too-wide",
            with_(
                x=lambda a: torch.zeros(1, 20000), residual=lambda a: None, weight=lambda a: None, bias=lambda a: None
            ),
            ValueError,
            "too wide",
        ),
        ("not-tensor", with_(x=lambda a: [1.0, 2.0]), TypeError, "must be a torch.Tensor"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_malformed_inputs_raise_before_launch(case, device):
    _, make, exc, match = case
    args = make(device)
    with pytest.raises(exc, match=match):
        add_layer_norm(**args)
    with pytest.raises(exc, match=match):
        launch_add_layer_norm(**args)


def test_device_mismatch(device):
    x, residual, weight, bias = _good(device)
    with pytest.raises(ValueError, match="residual is on meta but x is on .*same device"):
        add_layer_norm(x, residual.to("meta"), weight, bias, 1e-6)
    with pytest.raises(ValueError, match="weight is on meta"):
        layer_norm(x, weight.to("meta"), bias, 1e-6)


def test_cpu_tensor_without_interpreter_says_what_to_do(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the check reads it per call
    x, residual, weight, bias = _good("cpu")
    with pytest.raises(RuntimeError, match="CUDA GPU.*TRITON_INTERPRET=1"):
        add_layer_norm(x, residual, weight, bias, 1e-6)


def test_out_buffer_checked(device):
    x, residual, weight, bias = _good(device)
    with pytest.raises(ValueError, match="normed_out must be a contiguous"):
        launch_add_layer_norm(x, residual, weight, bias, 1e-6, normed_out=torch.empty(3, device=device))
    with pytest.raises(ValueError, match="residual is None"):
        launch_add_layer_norm(x, None, weight, bias, 1e-6, summed_out=torch.empty_like(x))
