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
