"""transformers' DINOv3 (``DINOv3ViTLayer``) on our kernels: the model hands each layer its RoPE tables
``position_embeddings=(cos, sin)`` for the patch tokens; the attention kernel rotates q and k as it loads them (the
half layout, class and register tokens unrotated), 5 launches per layer as any layer. When a layer keeps its own
forward: docs/usage.md, "Hugging Face transformers: the drop-in"."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vit_fast.model.layers import mlp_branch, norm_linear

#: layer class -> the rotary pair layout of its attention (``rotate_half``: "half")
ROPE_LAYERS = {"DINOv3ViTLayer": "half"}


def rope_tables(layer: nn.Module, x: torch.Tensor, mask: Any, position_embeddings: Any) -> tuple | None:
    """``(cos, sin, num_prefix, layout)`` for the attention op, from the ``(cos, sin)`` ``[T_rot, Dh]`` the model
    passes (the first ``T - T_rot`` tokens, class and registers, unrotated); None where the layer's own forward runs:
    no tables, a mask, or tables that are not one ``[T_rot, Dh]`` pair for ``x``'s tokens."""
    if mask is not None or not isinstance(position_embeddings, tuple | list) or len(position_embeddings) != 2:
        return None
    cos, sin = position_embeddings
    tokens = x.shape[1]
    if not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)) or cos.shape != sin.shape:
        return None
    if cos.dim() != 2 or not 0 < cos.shape[0] <= tokens or cos.stride(-1) != 1 or sin.stride() != cos.stride():
        return None
    return cos, sin, tokens - cos.shape[0], ROPE_LAYERS[type(layer).__name__]


def run_rope_view(view: Any, x: torch.Tensor, rope: tuple) -> torch.Tensor:
    """One layer seen with timm's names (:class:`vit_fast.interop.hf_patch._LayerView`) on the kernels, q and k
    rotated in the attention kernel: the qkv GEMM (norm1 folded in), attention, o_proj with LayerScale and the
    residual, fc1 (norm2 folded in, the activation or SwiGLU gate in its epilogue), fc2: 5 launches."""
    from vit_fast.backend.triton_path import fuse_ln_from_env, patched_ops

    ops, fused = patched_ops(x), fuse_ln_from_env()
    x = x.contiguous()
    attn = view.attn
    qkv = norm_linear(ops, view.norm1, x, attn.qkv, None, fused)  # [B, T, 3 * H * Dh]
    a = ops.attention(qkv, attn.num_heads, attn.scale, rope=rope)
    x = ops.linear(a, attn.proj, residual=x, gamma=view.ls1.gamma)
    act = "silu" if view.gated else view.kernel_act if view.torch_act is None else None
    mlp = {"gated": view.gated, "torch_act": view.torch_act}
    return mlp_branch(ops, view.norm2, view.mlp, x, x, view.ls2, fused, act, **mlp)
