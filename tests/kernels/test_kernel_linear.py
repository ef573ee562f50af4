"""vit_fast::linear (GEMM + bias / GELU / residual / LayerScale) against a float64 reference,
judged by eager PyTorch's own error.

On a CPU machine these run in Triton's interpreter. bfloat16 is a real test there only because
the launcher hands the dot operands to tl.dot as fp32 when interpreting (the interpreter's bf16
tl.dot returns garbage) and rounds the bf16 store by hand (its fp32 -> bf16 cast truncates); a
garbage result would fail the 2x-eager bound by ten orders of magnitude. On a GPU the same tests
run the compiled kernel with real bf16 dots.
"""

from __future__ import annotations

import pytest
import torch
import triton

from vit_fast.base.interpret import interpreter_enabled
from vit_fast.kernels import KERNELS
from vit_fast.kernels._launch import cdiv, next_power_of_2
from vit_fast.kernels.autotune import autotune_enabled, persistent_programs, tma_usable
from vit_fast.kernels.linear import launch_linear, linear, linear_ref

from ..numerics import (
    assert_kernel_matches,
    assert_within_eager,
    in_float64,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# id -> (bias, activation, residual, gamma): every epilogue a ViT block uses, and all at once
EPILOGUES = {
    "plain": (False, None, False, False),
    "bias": (True, None, False, False),
    "bias-gelu": (True, "gelu", False, False),
    "bias-gelu_tanh": (True, "gelu_tanh", False, False),
    "bias-residual": (True, None, True, False),
    "bias-residual-gamma": (True, None, True, True),
    "gelu_tanh-residual-gamma": (False, "gelu_tanh", True, True),
    "bias-quick_gelu": (True, "quick_gelu", False, False),  # OpenAI CLIP's MLP
    "bias-silu": (True, "silu", False, False),
}


def _inputs(lead, k_in, n_out, epilogue, dtype, device):
    has_bias, activation, has_residual, has_gamma = epilogue
    x = torch.randn(*lead, k_in, device=device).to(dtype)
    weight = (torch.randn(n_out, k_in, device=device) * k_in**-0.5).to(dtype)  # outputs of order 1
    bias = torch.randn(n_out, device=device).to(dtype) if has_bias else None
    residual = (2 * torch.randn(*lead, n_out, device=device)).to(dtype) if has_residual else None
    gamma = torch.randn(n_out, device=device).to(dtype) if has_gamma else None
    return x, weight, bias, activation, residual, gamma


def _check(args, name):
    """Run the kernel into a NaN-poisoned buffer and hold it to 2x eager's error vs float64."""
    x, weight = args[0], args[1]
    out = launch_linear(*args, out=poisoned((*x.shape[:-1], weight.shape[0]), x.dtype, x.device))
    return assert_kernel_matches(out, linear_ref, args, name)


# ------------------------------------------------------------------------------ forward numerics
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("epilogue", EPILOGUES.values(), ids=EPILOGUES.keys())
def test_epilogues_small(epilogue, dtype, device):
    """37 x 48 -> 144: tails on M (37), K (48 = 1.5 K-blocks) and N (144 = 2.25 N-blocks)."""
    _check(_inputs((37,), 48, 144, epilogue, dtype, device), f"37x48->144 {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("epilogue", ["bias-gelu", "bias-residual-gamma"])
def test_vit_token_count(epilogue, dtype, device):
    """[1, 197, 96] -> 384: a ViT's token count (never a power of two) with fc1's and fc2's epilogues."""
    _check(_inputs((1, 197), 96, 384, EPILOGUES[epilogue], dtype, device), f"197x96->384 {epilogue} {dtype}")


@pytest.mark.parametrize("lead, k_in, n_out", [((1,), 1, 1), ((3,), 5, 7), ((2, 3, 4), 20, 33)])
def test_degenerate_and_batched_shapes(lead, k_in, n_out, device):
    """A 1x1x1 GEMM, tiny odd dims, and three leading dims flattened into M."""
    _check(_inputs(lead, k_in, n_out, EPILOGUES["bias-residual-gamma"], torch.float32, device), f"{lead}x{k_in}")


def test_large_activations_gelu_limits(device):
    """Pre-activations of +-30: GELU (and QuickGELU, SiLU) must give x and -0 at the ends, with no overflow NaN."""
    x, weight, bias, _, _, _ = _inputs((37,), 48, 144, EPILOGUES["bias"], torch.float32, device)
    for activation in ("gelu", "gelu_tanh", "quick_gelu", "silu"):
        _check((x * 30, weight, bias, activation, None, None), f"large {activation}")


def test_strided_inputs(device):
    """x, weight and residual as slices of larger buffers (row strides > K or N): strides are honoured."""
    k_in, n_out, rows = 40, 72, 37
    x = torch.randn(rows, k_in + 24, device=device)[:, 8 : 8 + k_in]
    weight = (torch.randn(n_out + 5, k_in + 16, device=device) * k_in**-0.5)[2 : 2 + n_out, :k_in]
    residual = torch.randn(rows, 2 * n_out, device=device)[:, n_out:]
    bias, gamma = torch.randn(n_out, device=device), torch.randn(n_out, device=device)
    assert not (x.is_contiguous() or weight.is_contiguous() or residual.is_contiguous())
    args = (x, weight, bias, "gelu", residual, gamma)
    out = _check(args, "strided")
    assert torch.equal(linear(*args), out)


def test_public_op_matches_launcher(device):
    """linear() (validation + custom op) computes exactly what the checked launcher computes."""
    args = _inputs((2, 5), 48, 144, EPILOGUES["bias-residual-gamma"], torch.float16, device)
    ours = linear(*args)
    assert ours.shape == (2, 5, 144) and ours.dtype == torch.float16
    assert torch.equal(ours, launch_linear(*args))


# ------------------------------------------------------------------------------ persistent TMA tiles
def _expects_heuristic() -> bool:
    """The interpreter and VIT_FAST_AUTOTUNE=0 take the heuristic's pick; a timed autotune may take any config."""
    return interpreter_enabled() or not autotune_enabled()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("epilogue", ["bias-gelu", "bias-residual-gamma"])
def test_many_rows_take_the_persistent_tma_tiles(epilogue, dtype, device):
    """[2, 301, 48] -> 72: 602 rows (> SMALL_M), so 16-bit operands go through TMA descriptors in a persistent
    loop (3 programs walk 38 tiles in the interpreter; one per SM on a GPU), tails on M, K and N zero-filled by
    the descriptors; fp32 stays on the pointer tiles."""
    _check(_inputs((2, 301), 48, 72, EPILOGUES[epilogue], dtype, device), f"602x48->72 {epilogue} {dtype}")
    if _expects_heuristic():
        assert KERNELS["linear"].kernel.best_config.kwargs["TMA"] == (dtype != torch.float32)


@pytest.mark.parametrize("case", ["row stride of 90 bytes", "base off 16-byte alignment"], ids=["stride", "alignment"])
def test_tma_needs_16_byte_rows(case, device):
    """TMA reads only 16-byte aligned bases and row strides: anything else takes the pointer tiles, right."""
    if case == "row stride of 90 bytes":
        x, weight, bias, _, residual, gamma = _inputs(
            (600,), 45, 40, EPILOGUES["bias-residual-gamma"], torch.float16, device
        )
    else:
        x, weight, bias, _, residual, gamma = _inputs(
            (600,), 49, 40, EPILOGUES["bias-residual-gamma"], torch.float16, device
        )
        x, weight = x[:, 1:], weight[:, 1:]  # 48 columns starting 2 bytes into the buffer
        assert x.data_ptr() % 16 and x.stride(0) == 49
    _check((x, weight, bias, "gelu_tanh", residual, gamma), case)
    if _expects_heuristic():
        assert not KERNELS["linear"].kernel.best_config.kwargs["TMA"]


def test_tma_off_by_env(monkeypatch, device):
    """VIT_FAST_TMA=0 keeps every GEMM on the pointer tiles (a switch for a GPU or driver where TMA misbehaves)."""
    monkeypatch.setenv("VIT_FAST_TMA", "0")
    monkeypatch.setattr(KERNELS["linear"].kernel, "cache", {})  # tunings made with TMA allowed
    _check(_inputs((600,), 48, 40, EPILOGUES["bias"], torch.bfloat16, device), "TMA off")
    assert not KERNELS["linear"].kernel.best_config.kwargs["TMA"]


def test_tma_helpers():
    assert [cdiv(a, 64) for a in (1, 64, 65, 197)] == [1, 1, 2, 4]
    sizes = (1, 2, 3, 64, 197, 3072)
    assert [next_power_of_2(n) for n in sizes] == [triton.next_power_of_2(n) for n in sizes]
    buffer = torch.empty(64, dtype=torch.float16)
    assert tma_usable((buffer.view(4, 16), 16))  # 32-byte rows
    assert not tma_usable((buffer.view(4, 16), 9))  # 18-byte rows
    assert not tma_usable((buffer[1:], 8))  # base 2 bytes past an aligned address
    assert persistent_programs(torch.device("cpu")) == 3  # the interpreter: several tiles per program


# ------------------------------------------------------------------------------ autograd, compile
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("epilogue", ["bias-gelu", "gelu_tanh-residual-gamma"])
def test_gradients(epilogue, dtype, device):
    """Backward (recomputed through the reference) for every differentiable input, against float64."""
    args = _inputs((2, 3), 16, 24, EPILOGUES[epilogue], dtype, device)
    grad_out = torch.randn(2, 3, 24, device=device).to(dtype)

    def grads_of(fn, inputs):
        leaves = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in inputs]
        wanted = [t for t in leaves if isinstance(t, torch.Tensor)]
        return torch.autograd.grad(fn(*leaves), wanted, grad_out.to(inputs[0].dtype))

    ours = grads_of(linear, args)
    eager = grads_of(linear_ref, args)
    ref64 = grads_of(linear_ref, in_float64(*args))
    names = [
        n
        for n, a in zip(("x", "weight", "bias", "act", "residual", "gamma"), args, strict=True)
        if isinstance(a, torch.Tensor)
    ]
    for name, g_ours, g_eager, g_ref in zip(names, ours, eager, ref64, strict=True):
        assert g_ours.dtype == dtype
        assert_within_eager(g_ours, g_eager, g_ref, f"d {name} {epilogue} {dtype}")


def test_gradient_for_x_only(device):
    """Frozen weights (only x requires grad, as in feature extraction): backward still right."""
    x, weight, bias, _, residual, gamma = _inputs((4,), 16, 8, EPILOGUES["bias-residual-gamma"], torch.float32, device)
    grads = []
    for fn, dtype in ((linear, torch.float32), (linear_ref, torch.float32), (linear_ref, torch.float64)):
        leaf = x.to(dtype).requires_grad_(True)
        out = fn(leaf, weight.to(dtype), bias.to(dtype), "gelu", residual.to(dtype), gamma.to(dtype))
        grads.append(torch.autograd.grad(out.sum(), leaf)[0])
    assert_within_eager(*grads, "d x (weights frozen)")


def test_torch_compile_fullgraph(device):
    """The custom op traces without graph breaks (fullgraph=True), forward and backward, with
    optional tensors present and absent and a string argument."""

    def mlp(x, fc1_w, fc1_b, fc2_w, gamma):
        hidden = linear(x, fc1_w, fc1_b, activation="gelu")
        return linear(hidden, fc2_w, None, residual=x, gamma=gamma)

    args = _inputs((1, 5), 16, 32, EPILOGUES["bias"], torch.float32, device)
    x, fc1_w, fc1_b = args[0].requires_grad_(True), args[1], args[2]
    fc2_w = torch.randn(16, 32, device=device) * 32**-0.5
    gamma = torch.randn(16, device=device)
    compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager")
    out = compiled(x, fc1_w, fc1_b, fc2_w, gamma)
    (grad,) = torch.autograd.grad(out.sum(), x)
    eager_out = mlp(x, fc1_w, fc1_b, fc2_w, gamma)
    (eager_grad,) = torch.autograd.grad(eager_out.sum(), x)
    assert torch.equal(out, eager_out)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ input checks
def _good(device, dtype=torch.float32):
    """Valid (x, weight, bias, activation, residual, gamma) for a 5 x 16 -> 8 GEMM."""
    return dict(
        x=torch.randn(5, 16, device=device, dtype=dtype),
        weight=torch.randn(8, 16, device=device, dtype=dtype),
        bias=torch.randn(8, device=device, dtype=dtype),
        activation=None,
        residual=torch.randn(5, 8, device=device, dtype=dtype),
        gamma=torch.randn(8, device=device, dtype=dtype),
    )


# id -> (changes to the valid arguments, exception type, message pattern)
BAD_INPUTS = {
    "x-not-tensor": (lambda d: {"x": [[1.0] * 16]}, TypeError, "x must be a torch.Tensor"),
    "float64": (
        lambda d: {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in _good(d).items()},
        TypeError,
        r"x dtype torch.float64 is not supported; use float16, bfloat16 or float32",
    ),
    "mixed-dtypes": (
        lambda d: {"weight": torch.randn(8, 16, device=d, dtype=torch.float16)},
        TypeError,
        r"dtypes differ: x is torch.float32 but weight is torch.float16; cast",
    ),
    "weight-transposed": (
        lambda d: {"weight": torch.randn(16, 8, device=d)},
        ValueError,
        r"x's last dim 16 != weight's in_features 8 .*(not transposed)",
    ),
    "weight-1d": (lambda d: {"weight": torch.randn(16, device=d)}, ValueError, r"weight must be 2-D \[N, K\]"),
    "bias-shape": (
        lambda d: {"bias": torch.randn(16, device=d)},
        ValueError,
        r"bias must have shape \(8,\), got \(16,\)",
    ),
    "residual-shape": (
        lambda d: {"residual": torch.randn(5, 16, device=d)},
        ValueError,
        r"residual must have shape \(5, 8\), got \(5, 16\)",
    ),
    "gamma-without-residual": (lambda d: {"residual": None}, ValueError, "gamma .* pass residual= as well"),
    "bad-activation": (lambda d: {"activation": "relu"}, ValueError, r"activation must be one of .* got 'relu'"),
    "x-strided-last-dim": (
        lambda d: {"x": torch.randn(16, 5, device=d).t()},
        ValueError,
        r"x's last dim must be contiguous .* x\.contiguous\(\)",
    ),
    "weight-strided-last-dim": (
        lambda d: {"weight": torch.randn(16, 8, device=d).t()},
        ValueError,
        r"weight's last dim must be contiguous",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_inputs_raise_clear_errors(case, device):
    changes, error, match = case
    kwargs = {**_good(device), **changes(device)}
    with pytest.raises(error, match=match):
        linear(**kwargs)


def test_bad_out_buffer(device):
    kwargs = _good(device)
    with pytest.raises(ValueError, match=r"out must be a contiguous \(5, 8\) torch.float32"):
        launch_linear(**kwargs, out=torch.empty(8, 5, device=device).t())


def test_cpu_tensor_without_interpreter(monkeypatch):
    """Without TRITON_INTERPRET a CPU tensor is refused before any launch, with both ways out."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"need a CUDA tensor.*\.cuda\(\).*TRITON_INTERPRET=1"):
        linear(**_good("cpu"))
