"""Small models shared by tests."""

from __future__ import annotations

import torch

from vit_fast import VisionTransformer, ViTConfig

TINY = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=7)


def tiny_model(seed: int = 0, **overrides) -> VisionTransformer:
    """A tiny ViT with random (non-trivial) weights: LayerNorm affine and biases are random too."""
    torch.manual_seed(seed)
    model = VisionTransformer(ViTConfig(**{**TINY, **overrides}), backend="torch").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def record_triton_forwards(monkeypatch) -> list[tuple[int, bool]]:
    """Replace the triton path's forward with one that records ``(batch, tuning on)`` per call and returns zeros:
    what a test of who tunes when (bench, serve) needs, without running the kernels."""
    from vit_fast import triton_path
    from vit_fast.kernels import _common

    seen: list[tuple[int, bool]] = []

    def features(model, x, grid):
        seen.append((x.shape[0], _common.autotune_enabled()))
        return torch.zeros(x.shape[0], model.cfg.num_tokens, model.cfg.embed_dim)

    monkeypatch.delenv("VIT_FAST_AUTOTUNE", raising=False)
    monkeypatch.setattr(triton_path, "features_triton", features)
    return seen


def check_first_use_net(monkeypatch, model, x: torch.Tensor, op: str, what: str) -> None:
    """The first-use safety net on the public op ``op`` of ``vit_fast.triton_path`` in a timm model patched in
    place: its first output is judged and recorded as passed; a wrong kernel (output + 0.5) then falls back to the
    eager reference with a RuntimeWarning, and the model still meets the numerics rule against itself in float64.
    (Patched timm blocks and heads call the public op, not the direct launcher.)"""
    import copy

    import pytest

    import vit_fast
    from vit_fast import first_use, triton_path

    from .numerics import assert_within_eager

    monkeypatch.setenv(first_use.ENV, "1")
    first_use.reset()
    with torch.no_grad():
        eager = model(x)
        expected = copy.deepcopy(model).double()(x.double())
    vit_fast.apply_vit_fast(model, backend="triton")
    try:
        with torch.no_grad():
            model(x)
        found = [f for f in first_use.report()["checked"] if f["op"] == op]
        assert len(found) == 1 and found[0]["passed"]
        first_use.reset()
        real_op = getattr(triton_path, op)
        monkeypatch.setattr(triton_path, op, lambda *a, **k: real_op(*a, **k) + 0.5)
        with pytest.warns(RuntimeWarning, match=f"'{op}' runs in eager PyTorch"), torch.no_grad():
            ours = model(x)
        assert first_use.failed_ops() == {op}
        assert_within_eager(ours, eager, expected, name=f"{what} after fallback")
    finally:
        first_use.reset()
