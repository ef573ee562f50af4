"""vit_fast::patch_embed against a float64 reference, judged by eager's own error (tests/numerics.py).

bfloat16 is a real test under the interpreter only because the kernel upcasts its dot operands to
float32 there (its bf16 tl.dot is garbage, triton issue 11584). Products of two bf16 values are
exact in float32, so that is the same math as the GPU's bf16 dot with float32 accumulation.
"""

from __future__ import annotations

import pytest
import torch

from vit_fast.kernels.patch_embed import launch_patch_embed, patch_embed, patch_embed_ref

from ..numerics import (
    assert_within_eager,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# (batch, channels, (H, W), patch, dim, class token, register tokens, no_embed_class) -> tokens T
CASES = {
    "T1-C1-p8": (2, 1, (8, 8), 8, 32, False, 0, False),  # a single patch, no prefix
    "T5-p8": (3, 3, (16, 16), 8, 48, True, 0, False),
    "T50-p4": (2, 3, (28, 28), 4, 96, True, 0, False),  # K = 48
    "T65-reg4-noembedcls": (2, 3, (24, 40), 4, 40, True, 4, True),  # non-square grid, registers
    "T65-reg4-embedcls": (1, 3, (24, 40), 4, 40, True, 4, False),
    "T196-C1-noprefix": (1, 1, (56, 56), 4, 32, False, 0, False),
    "T197-p14": (1, 3, (196, 196), 14, 40, False, 1, False),  # K = 588, one register and no class token
    "T257-p16-C1": (1, 1, (256, 256), 16, 24, True, 0, False),  # K = 256, D = 24
}
EXPECTED_T = {"T1": 1, "T5": 5, "T50": 50, "T65": 65, "T196": 196, "T197": 197, "T257": 257}


def _params(C, p, D, cls, R, no_embed_class, grid, dtype, device, bias=True):
    num_patches = grid[0] * grid[1]
    L = num_patches + (0 if no_embed_class else int(cls) + R)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(shape, device=device)).to(dtype)

    return dict(
        weight=rnd(D, C, p, p, scale=(C * p * p) ** -0.5),
        bias=rnd(D) if bias else None,
        pos_embed=rnd(1, L, D),
        cls_token=rnd(1, 1, D) if cls else None,
        reg_token=rnd(1, R, D) if R else None,
    )


def _f64(params):
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in params.items()}


def _check(x, params, kw, name, x64=None):
    """Launch into a NaN-filled buffer; judge against float64 by eager's error in the same dtype."""
    B, T = x.shape[0], None
    out64 = patch_embed_ref(x if x64 is None else x64, **_f64(params), **kw)
    T, D = out64.shape[1:]
    dtype = params["weight"].dtype
    out = launch_patch_embed(x, **params, **kw, out=poisoned((B, T, D), dtype, x.device))
    eager = patch_embed_ref(x, **params, **kw)
    assert out.dtype == dtype
    assert_within_eager(out, eager, out64, name)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_patch_embed_matches_float64(case, dtype, device):
    B, C, (H, W), p, D, cls, R, nec = CASES[case]
    params = _params(C, p, D, cls, R, nec, (H // p, W // p), dtype, device)
    x = torch.randn(B, C, H, W, device=device).to(dtype)
    kw = dict(no_embed_class=nec)
    out = _check(x, params, kw, case, x64=x.double())
    assert out.shape == (B, EXPECTED_T[case.split("-")[0]], D)
    # the custom op runs the same kernel
    torch.testing.assert_close(patch_embed(x, **params, **kw), out, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uint8_with_fused_normalisation(dtype, device):
    B, C, H, W, p, D = 2, 3, 24, 32, 8, 48
    params = _params(C, p, D, True, 2, False, (H // p, W // p), dtype, device)
    x = torch.randint(0, 256, (B, C, H, W), dtype=torch.uint8, device=device)
    mean = torch.tensor(IMAGENET_MEAN, device=device)
    std = torch.tensor(IMAGENET_STD, device=device)
    out = _check(x, params, dict(mean=mean, std=std), "uint8")
    # sequences of floats work too, and equal the normalise-then-embed path on a float image
    torch.testing.assert_close(patch_embed(x, **params, mean=IMAGENET_MEAN, std=IMAGENET_STD), out, rtol=0, atol=0)
    if dtype == torch.float32:
        x_float = (x.float() / 255 - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
        torch.testing.assert_close(patch_embed(x_float, **params), out, rtol=1e-5, atol=1e-5)


def test_float_image_with_mean_std(device):
    """A float image in 0..1 with mean/std: (x - mean) / std, no /255."""
    B, C, H, W, p, D = 2, 3, 16, 16, 4, 32
    params = _params(C, p, D, True, 0, False, (H // p, W // p), torch.float32, device)
    x = torch.rand(B, C, H, W, device=device)
    kw = dict(mean=torch.tensor(IMAGENET_MEAN, device=device), std=torch.tensor(IMAGENET_STD, device=device))
    _check(x, params, kw, "float+mean/std", x64=x.double())


def test_strided_image_and_no_bias(device):
    """im2col is address arithmetic: a channels-last image and a cropped view need no copy to be read right."""
    C, p, D = 3, 4, 32
    params = _params(C, p, D, True, 0, False, (4, 3), torch.float32, device, bias=False)
    big = torch.randn(2, 20, 16, C, device=device).permute(0, 3, 1, 2)  # channels-last [2, 3, 20, 16]
    x = big[:, :, 2:18, 2:14]  # [2, 3, 16, 12]: every stride non-trivial
    assert not x.is_contiguous()
    _check(x, params, {}, "strided", x64=x.double())


def test_gradients_match_float64(device):
    B, C, H, W, p, D = 2, 3, 8, 12, 4, 16
    params = _params(C, p, D, True, 2, False, (H // p, W // p), torch.float32, device)
    x = torch.randn(B, C, H, W, device=device)
    grad_out = torch.randn(B, 1 + 2 + 6, D, device=device)
    names = ["x", *params]

    def grads(fn, dtype):
        leaves = [x.to(dtype).requires_grad_(), *(t.detach().to(dtype).requires_grad_() for t in params.values())]
        out = fn(leaves[0], **dict(zip(params, leaves[1:], strict=True)))
        return torch.autograd.grad(out, leaves, grad_out.to(dtype))

    ours = grads(patch_embed, torch.float32)
    eager = grads(patch_embed_ref, torch.float32)
    ref64 = grads(patch_embed_ref, torch.float64)
    for name, g, g_e, g64 in zip(names, ours, eager, ref64, strict=True):
        assert_within_eager(g, g_e, g64, f"d{name}")


def test_uint8_image_gets_no_gradient(device):
    params = _params(3, 4, 16, True, 0, False, (2, 2), torch.float32, device)
    params["weight"].requires_grad_()
    x = torch.randint(0, 256, (1, 3, 8, 8), dtype=torch.uint8, device=device)
    out = patch_embed(x, **params, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    out.sum().backward()
    assert params["weight"].grad is not None and torch.isfinite(params["weight"].grad).all()


def test_torch_compile_fullgraph(device):
    params = _params(3, 4, 32, True, 4, True, (3, 4), torch.float32, device)
    x = torch.randn(2, 3, 12, 16, device=device)

    def fn(x):
        return patch_embed(x, **params, no_embed_class=True) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)


# ------------------------------------------------------------------------------- malformed inputs
def _good(device):
    params = _params(3, 4, 16, True, 2, False, (2, 2), torch.float32, device)
    return dict(x=torch.randn(2, 3, 8, 8, device=device), **params)


def _bad_cases():
    def f(**changes):
        return changes

    return [
        ("3d-x", f(x=lambda a: a["x"][0]), ValueError, r"x must be an image batch \[B, C, H, W\]"),
        ("float64-x", f(x=lambda a: a["x"].double()), TypeError, r"x has dtype torch.float64 .*x.to\(torch.float32\)"),
        ("int-x", f(x=lambda a: a["x"].int()), TypeError, "x has dtype torch.int32"),
        ("uint8-no-mean", f(x=lambda a: a["x"].to(torch.uint8)), ValueError, "x is uint8: pass mean and std"),
        ("weight-dtype", f(weight=lambda a: a["weight"].double()), TypeError, "supports float32, float16 and bfloat16"),
        ("weight-3d", f(weight=lambda a: a["weight"][0]), ValueError, r"square Conv2d kernel \[D, C, p, p\]"),
        ("channels", f(x=lambda a: a["x"][:, :2]), ValueError, "x has 2 channels .* weight expects 3"),
        ("not-divisible", f(x=lambda a: a["x"][..., :7]), ValueError, "not divisible by the patch size 4"),
        (
            "pos-rows",
            f(pos_embed=lambda a: a["pos_embed"][:, 1:]),
            ValueError,
            "pos_embed has 6 rows .*needs 7.*resample",
        ),
        ("pos-dim", f(pos_embed=lambda a: a["pos_embed"][..., :8]), ValueError, "pos_embed has dim 8"),
        ("pos-2d", f(pos_embed=lambda a: a["pos_embed"][0]), ValueError, r"pos_embed must be \[1, L, D\]"),
        ("bias-shape", f(bias=lambda a: a["bias"][:3]), ValueError, r"bias has shape \(3,\)"),
        ("cls-shape", f(cls_token=lambda a: a["cls_token"][0]), ValueError, "cls_token has shape"),
        ("reg-dim", f(reg_token=lambda a: a["reg_token"][..., :4]), ValueError, "reg_token has shape"),
        ("pos-dtype", f(pos_embed=lambda a: a["pos_embed"].half()), TypeError, r"pos_embed has dtype .*pos_embed.to\("),
        ("cls-device", f(cls_token=lambda a: a["cls_token"].to("meta")), ValueError, "cls_token is on meta"),
        ("weight-device", f(weight=lambda a: a["weight"].to("meta")), ValueError, "weight is on meta"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_malformed_inputs_raise_before_launch(case, device):
    _, changes, exc, match = case
    args = _good(device)
    args.update({k: fn(args) for k, fn in changes.items()})
    with pytest.raises(exc, match=match):
        patch_embed(**args)
    with pytest.raises(exc, match=match):
        launch_patch_embed(**args)


def test_mean_std_malformed(device):
    args = _good(device)
    x8 = args.pop("x").to(torch.uint8)
    with pytest.raises(ValueError, match=r"mean has shape \(2,\); it must be \[C\] = \[3\]"):
        patch_embed(x8, **args, mean=(0.5, 0.5), std=(0.2, 0.2))
    with pytest.raises(ValueError, match="pass both mean and std"):
        patch_embed(x8.float(), **args, mean=IMAGENET_MEAN)
    with pytest.raises(TypeError, match="mean must be a tensor"):
        patch_embed(x8, **args, mean="imagenet", std=IMAGENET_STD)


def test_cpu_tensor_without_interpreter_says_what_to_do(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the check reads it per call
    with pytest.raises(RuntimeError, match="CUDA GPU.*TRITON_INTERPRET=1"):
        patch_embed(**_good("cpu"))


def test_out_buffer_checked(device):
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.float32 tensor of shape \(2, 7, 16\)"):
        launch_patch_embed(**_good(device), out=torch.empty(2, 7, 8, device=device))
