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
