"""``forward_features`` of :class:`vit_fast.model.VisionTransformer` on our Triton kernels.

The model's own parameters (timm names) go through the fused ops, nothing is copied or
re-laid-out:

    patch_embed   im2col + GEMM + bias + pos-embed + cls/reg tokens    -> x [B, T, D]
                  (uint8 images normalised in the same kernel when set_input_normalization was called)
    norm_pre      layer_norm (when the model has one)
    block         qkv = linear(LN1(x)); a = attention(qkv)              5 launches: LN1 and LN2 are the
                  x = linear(a, proj, residual=x, gamma=ls1)            prologues of the qkv and fc1 GEMMs
                  m = linear(LN2(x), fc1, act); x = linear(m, fc2, residual=x, gamma=ls2)
    norm          layer_norm (Identity when the model pools with fc_norm)

A ViT-B/16 forward is 2 + 5 * 12 = 62 launches. The unfused block (LN1 and LN2 as launches of their
own, 7 per block, 86 for ViT-B/16) stays selectable for comparison: ``model.fuse_layer_norm = False``
or ``VIT_FAST_FUSE_LN=0``.

Why plain ``layer_norm`` and not ``add_layer_norm`` here: every residual add in a ViT block
directly follows a GEMM, and the GEMM epilogue adds it (and LayerScale) for free while the
output tile is in registers: the sum is written once and LN reads it once. Moving the add into
the norm instead would make the GEMM write the bare branch and the norm read branch *and*
residual: one more [B, T, D] read per add. ``add_layer_norm`` is for adds with no GEMM before them.

Input checks already ran in ``VisionTransformer.check_input``; pooling and the head stay in torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from vit_fast.kernels.attention import attention
from vit_fast.kernels.layer_norm import layer_norm
from vit_fast.kernels.linear import layer_norm_linear, linear
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


def _layer_norm_fused(model: VisionTransformer) -> bool:
    """LayerNorm folded into the next GEMM (the default), unless the model or ``VIT_FAST_FUSE_LN=0`` says not."""
    return getattr(model, "fuse_layer_norm", True) and os.environ.get("VIT_FAST_FUSE_LN", "1") != "0"


def _norm_linear(norm: nn.Module, x: torch.Tensor, lin: nn.Linear, act: str | None, fused: bool) -> torch.Tensor:
    """``lin(norm(x))`` (then ``act``): one launch when fused and ``norm`` is a LayerNorm, else two."""
    if fused and isinstance(norm, nn.LayerNorm):
        return layer_norm_linear(x, norm.weight, norm.bias, norm.eps, lin.weight, lin.bias, act)
    return linear(_norm(norm, x), lin.weight, lin.bias, activation=act)


def _block(block: Block, x: torch.Tensor, act: str, fused: bool) -> torch.Tensor:
    attn, mlp = block.attn, block.mlp
    qkv = _norm_linear(block.norm1, x, attn.qkv, None, fused)  # [B, T, 3*D], read in place as [B, T, 3, H, Dh]
    a = attention(qkv, attn.num_heads, attn.scale)  # [B, T, D]
    x = linear(a, attn.proj.weight, attn.proj.bias, residual=x, gamma=_gamma(block.ls1))
    m = _norm_linear(block.norm2, x, mlp.fc1, act, fused)
    return linear(m, mlp.fc2.weight, mlp.fc2.bias, residual=x, gamma=_gamma(block.ls2))


def _embed(model: VisionTransformer, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Tokens ``[B, T, D]`` after the patch embedding and ``norm_pre``; a uint8 image is normalised in the kernel."""
    proj = model.patch_embed.proj
    normalize = x.dtype == torch.uint8
    tokens = patch_embed(
        x,
        proj.weight,
        proj.bias,
        model.pos_embed_at(grid),
        model.cls_token,
        model.reg_token,
        no_embed_class=model.cfg.no_embed_class,
        mean=model.input_mean if normalize else None,
        std=model.input_std if normalize else None,
    )
    return _norm(model.norm_pre, tokens)


def stages_triton(
    model: VisionTransformer, x: torch.Tensor, grid: tuple[int, int]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``("patch embedding", tokens)``, ``("block i", tokens)`` for each block, ``("final norm", tokens)``:
    the triton path one stage at a time, as ``model._stages_torch`` yields them (each ``[B, T, D]``)."""
    fused = _layer_norm_fused(model)
    tokens = _embed(model, x, grid)
    yield "patch embedding", tokens
    for i, block in enumerate(model.blocks):
        tokens = _block(block, tokens, model.cfg.act, fused)
        yield f"block {i}", tokens
    yield "final norm", _norm(model.norm, tokens)


def features_triton(model: VisionTransformer, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Tokens ``[B, T, D]`` after the final norm, as ``model._features_torch(x, grid)`` computes them.

    ``x [B, C, H, W]`` in the model's dtype and device (or uint8 with the model's input normalisation),
    already validated; ``grid`` = ``(H/p, W/p)``.
    """
    # the same helpers as stages_triton, without a generator in the way of torch.compile's tracing
    fused = _layer_norm_fused(model)
    tokens = _embed(model, x, grid)
    for block in model.blocks:
        tokens = _block(block, tokens, model.cfg.act, fused)
    return _norm(model.norm, tokens)


__all__ = ["features_triton", "stages_triton"]
