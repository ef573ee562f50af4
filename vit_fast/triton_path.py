"""``forward_features`` of :class:`vit_fast.model.VisionTransformer` on our Triton kernels.

The model's own parameters (timm names) go through the fused ops, nothing is copied or
re-laid-out:

    patch_embed   im2col + GEMM + bias + pos-embed + cls/reg tokens    -> x [B, T, D]
    norm_pre      layer_norm (when the model has one)
    block         h = LN1(x); qkv = linear(h); a = attention(qkv)
                  x = linear(a, proj, residual=x, gamma=ls1)
                  h = LN2(x); m = linear(h, fc1, act); x = linear(m, fc2, residual=x, gamma=ls2)
    norm          layer_norm (Identity when the model pools with fc_norm)

Why plain ``layer_norm`` and not ``add_layer_norm`` here: every residual add in a ViT block
directly follows a GEMM, and the GEMM epilogue adds it (and LayerScale) for free while the
output tile is in registers: the sum is written once and LN reads it once. Moving the add into
the norm instead would make the GEMM write the bare branch and the norm read branch *and*
residual: one more [B, T, D] read per add. ``add_layer_norm`` is for adds with no GEMM before them.

Input checks already ran in ``VisionTransformer.check_input``; pooling and the head stay in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from vit_fast.kernels.attention import attention
from vit_fast.kernels.layer_norm import layer_norm
from vit_fast.kernels.linear import linear
from vit_fast.kernels.patch_embed import patch_embed

from .layers import LayerScale

if TYPE_CHECKING:
    from .layers import Block
    from .model import VisionTransformer


def _norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.Identity):
        return x
    if isinstance(module, nn.LayerNorm):
        return layer_norm(x, module.weight, module.bias, module.eps)
    raise TypeError(f"the triton backend runs nn.LayerNorm or nn.Identity norms, got {type(module).__name__}")


def _gamma(module: nn.Module) -> torch.Tensor | None:
    """LayerScale's per-channel gamma, or None where the block has no LayerScale (nn.Identity)."""
    gamma = getattr(module, "gamma", None)  # ours or timm's LayerScale (apply_vit_fast runs timm blocks)
    if isinstance(module, LayerScale) or isinstance(gamma, torch.Tensor):
        return gamma
    if isinstance(module, nn.Identity):
        return None
    raise TypeError(f"the triton backend runs LayerScale or nn.Identity, got {type(module).__name__}")


def _block(block: Block, x: torch.Tensor, act: str) -> torch.Tensor:
    attn, mlp = block.attn, block.mlp
    h = layer_norm(x, block.norm1.weight, block.norm1.bias, block.norm1.eps)
    qkv = linear(h, attn.qkv.weight, attn.qkv.bias)  # [B, T, 3*D], read in place as [B, T, 3, H, Dh]
    a = attention(qkv, attn.num_heads, attn.scale)  # [B, T, D]
    x = linear(a, attn.proj.weight, attn.proj.bias, residual=x, gamma=_gamma(block.ls1))
    h = layer_norm(x, block.norm2.weight, block.norm2.bias, block.norm2.eps)
    m = linear(h, mlp.fc1.weight, mlp.fc1.bias, activation=act)
    return linear(m, mlp.fc2.weight, mlp.fc2.bias, residual=x, gamma=_gamma(block.ls2))


def features_triton(model: VisionTransformer, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Tokens ``[B, T, D]`` after the final norm, as ``model._features_torch(x, grid)`` computes them.

    ``x [B, C, H, W]`` in the model's dtype and device, already validated; ``grid`` = ``(H/p, W/p)``.
    """
    cfg = model.cfg
    pos_embed = model.pos_embed_at(grid)
    proj = model.patch_embed.proj
    tokens = patch_embed(
        x, proj.weight, proj.bias, pos_embed, model.cls_token, model.reg_token, no_embed_class=cfg.no_embed_class
    )
    tokens = _norm(model.norm_pre, tokens)
    for block in model.blocks:
        tokens = _block(block, tokens, cfg.act)
    return _norm(model.norm, tokens)


__all__ = ["features_triton"]
