"""pytest-benchmark suites: each vit_fast Triton kernel against its PyTorch counterpart.

Shapes are ViT-B/16 at 224 px (T = 197 tokens, D = 768, 12 heads of 64, MLP 3072; the attention
pool: SigLIP-B/16's map head, one latent query over 196 tokens), batch 1 and 64, in the card's
native 16-bit dtype (bf16; fp16 on a card that emulates bf16, such as the T4).
Every case is a pair of tests in one benchmark group (``impl=vit_fast`` and ``impl=torch``) so
``pytest-benchmark compare`` and the terminal table show them side by side.

pytest-benchmark's own statistics are wall-clock per call including a ``torch.cuda.synchronize``;
``benchmark.extra_info`` adds the CUDA-event median (``triton.testing.do_bench``, L2 cleared
between runs), achieved TFLOP/s or GB/s from counted FLOPs and bytes, and the max abs difference
between the two implementations' outputs.

Run on a GPU machine::

    pytest benchmarks/bench_kernels.py --benchmark-only --benchmark-json=kernels.json

On a CPU-only machine every case is collected and skipped with the reason.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU: the kernels are timed compiled, never in Triton's interpreter",
    ),
]

B_VALUES = (1, 64)
T, D, HEADS, MLP, PATCH, IMG = 197, 768, 12, 3072, 16, 224
IMPLS = ("vit_fast", "torch")


def _cuda_median_ms(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _run(
    benchmark,
    group: str,
    impl: str,
    ours: Callable[[], Any],
    ref: Callable[[], Any],
    *,
    flops: float = 0.0,
    nbytes: float = 0.0,
) -> None:
    """Check the pair agree, time ``impl`` with pytest-benchmark and CUDA events, record rates."""
    fn = ours if impl == "vit_fast" else ref
    with torch.no_grad():
        a, b = ours(), ref()
        a = a[-1] if isinstance(a, tuple) else a
        b = b[-1] if isinstance(b, tuple) else b
        err = (a.float() - b.float()).abs().max().item()
    assert torch.isfinite(a).all(), "the vit_fast kernel wrote non-finite values"
    # a fast wrong answer must not be benchmarked: at most a few units in the last place of the dtype
    # (the tests hold each kernel to the 2x-eager rule; this only guards the timed pair)
    scale = max(1.0, b.float().abs().max().item())
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}[a.dtype] * scale
    assert err <= tol, f"{group}: vit_fast and PyTorch disagree by {err:.3e} (> {tol:.3e})"

    def synced() -> None:
        fn()
        torch.cuda.synchronize()

    benchmark.group = group
    ms = _cuda_median_ms(fn)
    benchmark.extra_info.update(
        {
            "impl": impl,
            "dtype": str(_dtype()).removeprefix("torch."),
            "device": torch.cuda.get_device_name(),
            "cuda_event_median_us": ms * 1e3,
            "max_abs_diff_vit_fast_vs_torch": err,
        }
    )
    if flops:
        benchmark.extra_info["TFLOP/s"] = flops / (ms * 1e-3) / 1e12
    if nbytes:
        benchmark.extra_info["GB/s"] = nbytes / (ms * 1e-3) / 1e9
    with torch.no_grad():
        benchmark.pedantic(synced, rounds=50, warmup_rounds=10, iterations=1)


@functools.cache
def _dtype() -> torch.dtype:
    """bf16 where the card has it natively, else fp16: asked of the card once, never at import (no GPU here)."""
    from vit_fast.util.dtypes import native_dtype

    return native_dtype(torch.device("cuda", torch.cuda.current_device()))


def _randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda") * scale).to(_dtype())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", B_VALUES)
def test_attention(benchmark, batch, impl):
    from vit_fast.kernels.attention import attention

    qkv = _randn(batch, T, 3 * D)
    dh = D // HEADS

    def ref() -> torch.Tensor:  # what an eager SDPA model does: split heads, SDPA, merge heads
        q, k, v = qkv.view(batch, T, 3, HEADS, dh).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, T, D)

    flops = 4 * batch * HEADS * T * T * dh
    nbytes = (qkv.numel() + batch * T * D) * qkv.element_size()
    _run(benchmark, f"attention B={batch}", impl, lambda: attention(qkv, HEADS), ref, flops=flops, nbytes=nbytes)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", B_VALUES)
def test_attention_pool(benchmark, batch, impl):
    """SigLIP-B/16's map head at 224 px: one latent query over 196 tokens (no class token), 12 heads of 64."""
    from vit_fast.kernels.attention_pool import attention_pool

    tokens, dh = T - 1, D // HEADS
    q, kv = _randn(1, 1, D), _randn(batch, tokens, 2 * D)

    def ref() -> torch.Tensor:  # timm's AttentionPoolLatent: split heads, SDPA, merge heads
        qh = q.expand(batch, -1, -1).view(batch, 1, HEADS, dh).transpose(1, 2)
        k, v = kv.view(batch, tokens, 2, HEADS, dh).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(qh, k, v).transpose(1, 2).reshape(batch, 1, D)

    flops = 4 * batch * HEADS * tokens * dh
    nbytes = (q.numel() + kv.numel() + batch * D) * kv.element_size()
    group = f"attention_pool B={batch}"
    _run(benchmark, group, impl, lambda: attention_pool(q, kv, HEADS), ref, flops=flops, nbytes=nbytes)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", B_VALUES)
def test_patch_embed(benchmark, batch, impl):
    from vit_fast.kernels.patch_embed import patch_embed

    x = _randn(batch, 3, IMG, IMG)
    weight, bias = _randn(D, 3, PATCH, PATCH, scale=0.02), _randn(D, scale=0.02)
    pos_embed, cls_token = _randn(1, T, D, scale=0.02), _randn(1, 1, D, scale=0.02)

    def ref() -> torch.Tensor:  # timm: Conv2d, flatten, transpose, cat class token, add position embedding
        tokens = F.conv2d(x, weight, bias, stride=PATCH).flatten(2).transpose(1, 2)
        return torch.cat([cls_token.expand(batch, -1, -1), tokens], dim=1) + pos_embed

    patches = (IMG // PATCH) ** 2
    flops = 2 * batch * patches * D * 3 * PATCH * PATCH
    nbytes = (x.numel() + weight.numel() + pos_embed.numel() + batch * T * D) * x.element_size()
    _run(
        benchmark,
        f"patch_embed B={batch}",
        impl,
        lambda: patch_embed(x, weight, bias, pos_embed, cls_token),
        ref,
        flops=flops,
        nbytes=nbytes,
    )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", B_VALUES)
def test_add_layer_norm(benchmark, batch, impl):
    from vit_fast.kernels.layer_norm import add_layer_norm

    x, residual = _randn(batch, T, D), _randn(batch, T, D)
    weight, bias = _randn(D), _randn(D)
    eps = 1e-6

    def ref() -> tuple[torch.Tensor, torch.Tensor]:  # a separate add, then nn.LayerNorm's kernel
        summed = x + residual
        return summed, F.layer_norm(summed, (D,), weight, bias, eps)

    nbytes = 4 * batch * T * D * x.element_size()  # read x and residual, write summed and normed
    _run(
        benchmark,
        f"add_layer_norm B={batch}",
        impl,
        lambda: add_layer_norm(x, residual, weight, bias, eps),
        ref,
        nbytes=nbytes,
    )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", B_VALUES)
def test_linear_gelu(benchmark, batch, impl):
    from vit_fast.kernels.linear import linear

    x = _randn(batch, T, D)
    weight, bias = _randn(MLP, D, scale=0.02), _randn(MLP, scale=0.02)

    def ref() -> torch.Tensor:  # nn.Linear then nn.GELU (exact)
        return F.gelu(F.linear(x, weight, bias))

    flops = 2 * batch * T * D * MLP
    nbytes = (x.numel() + weight.numel() + batch * T * MLP) * x.element_size()
    _run(
        benchmark,
        f"linear_gelu (fc1) B={batch}",
        impl,
        lambda: linear(x, weight, bias, activation="gelu"),
        ref,
        flops=flops,
        nbytes=nbytes,
    )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", B_VALUES)
def test_linear_residual(benchmark, batch, impl):
    from vit_fast.kernels.linear import linear

    h, residual = _randn(batch, T, MLP), _randn(batch, T, D)
    weight, bias = _randn(D, MLP, scale=0.02), _randn(D, scale=0.02)

    def ref() -> torch.Tensor:  # nn.Linear then a separate residual add
        return residual + F.linear(h, weight, bias)

    flops = 2 * batch * T * MLP * D
    nbytes = (h.numel() + weight.numel() + 2 * residual.numel()) * h.element_size()
    _run(
        benchmark,
        f"linear_residual (fc2) B={batch}",
        impl,
        lambda: linear(h, weight, bias, residual=residual),
        ref,
        flops=flops,
        nbytes=nbytes,
    )
