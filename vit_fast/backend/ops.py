"""The one interface between the model and the kernels: :class:`Ops`, the nine ops a forward calls, which the torch
ops (``vit_fast.model.layers.TorchOps``) and the kernel ops (:mod:`vit_fast.backend.triton_path`) implement in full,
and :class:`ForwardingOps`, the base of an ops that changes a few of them (a padded batch's lengths, a packed
sequence). Attention's masks travel as one :class:`AttentionMasks`. See docs/kernels.md, "The ops interface".
"""

from __future__ import annotations

import abc
from typing import NamedTuple

import torch
from torch import nn


class AttentionMasks(NamedTuple):
    """What an attention takes besides qkv, its heads and scale: a padded batch's ``lengths [B]``, a packed
    sequence's ``cu_seqlens [N + 1]`` and ``max_seqlen``, RoPE tables ``(cos, sin, num_prefix, layout)``, and
    ``first_token`` (token 0's row alone). Meanings: docs/kernels.md, "The ops interface"."""

    lengths: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None
    rope: tuple | None = None
    first_token: bool = False


#: attention over every token of every sample, each token's row returned
NO_MASKS = AttentionMasks()
#: the same keys, token 0's query alone
FIRST_TOKEN = AttentionMasks(first_token=True)


class Ops(abc.ABC):
    """What a block, a stage or a patched layer calls; modules (a Linear, a norm) are passed, not their tensors, so
    the torch ops can call them as modules. ``modules``: whether a LayerScale is passed as its module."""

    modules = False

    @abc.abstractmethod
    def linear(self, x, lin: nn.Module, act=None, residual=None, gamma=None) -> torch.Tensor:
        """``residual + gamma * act(lin(x))``; ``act`` a kernel's activation name (gated ones too)."""

    @abc.abstractmethod
    def norm_linear(self, norm: nn.LayerNorm, x, lin: nn.Module, act) -> torch.Tensor:
        """``act(lin(norm(x)))``, the LayerNorm folded into the GEMM on the kernels."""

    @abc.abstractmethod
    def rms_norm_linear(self, norm: nn.Module, x, lin: nn.Module, act) -> torch.Tensor:
        """``act(lin(norm(x)))`` for a timm RmsNorm."""

    @abc.abstractmethod
    def layer_norm(self, norm: nn.LayerNorm, x) -> torch.Tensor:
        """``norm(x)``."""

    @abc.abstractmethod
    def rms_norm(self, norm: nn.Module, x) -> torch.Tensor:
        """``norm(x)`` for a timm RmsNorm (weight or none, no bias)."""

    def attention(
        self,
        qkv,
        num_heads: int,
        scale: float,
        lengths: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        rope: tuple | None = None,
        first_token: bool = False,
    ) -> torch.Tensor:
        """``qkv [B, T, 3HDh]`` -> ``[B, T, HDh]``, the masks by name: :meth:`attend`, which every ops class
        implements, with them as one :class:`AttentionMasks`."""
        return self.attend(qkv, num_heads, scale, AttentionMasks(lengths, cu_seqlens, max_seqlen, rope, first_token))

    @abc.abstractmethod
    def attend(self, qkv, num_heads: int, scale: float, masks: AttentionMasks) -> torch.Tensor:
        """``qkv [B, T, 3HDh]`` -> ``[B, T, HDh]`` (``[B, 1, HDh]`` with ``masks.first_token``)."""

    @abc.abstractmethod
    def diff_attention(self, qkv, lambda_full, norm_weight, num_heads: int, lambda_init, scale, eps) -> torch.Tensor:
        """timm ``DiffAttention`` from qkv to before proj."""

    @abc.abstractmethod
    def attention_pool(self, q, kv, num_heads: int, scale: float) -> torch.Tensor:
        """Latent queries ``q [1 or B, L, D]`` against ``kv [B, T, 2D]`` -> ``[B, L, D]``."""

    @abc.abstractmethod
    def patch_embed(
        self, x, weight, bias, pos_embed, cls_token=None, reg_token=None, *, no_embed_class=False, mean=None, std=None
    ) -> torch.Tensor:
        """Image ``[B, C, H, W]`` -> tokens ``[B, T, D]`` with prefix tokens and position embedding."""


#: the interface's op names, in the order above
OP_NAMES = tuple(name for name in vars(Ops) if getattr(getattr(Ops, name), "__isabstractmethod__", False))


class ForwardingOps(Ops):
    """``ops`` with every call passed on as it is; a subclass overrides the ops it changes."""

    def __init__(self, ops: Ops) -> None:
        self.ops = ops
        self.modules = ops.modules

    def linear(self, x, lin: nn.Module, act=None, residual=None, gamma=None) -> torch.Tensor:
        return self.ops.linear(x, lin, act, residual, gamma)

    def norm_linear(self, norm: nn.LayerNorm, x, lin: nn.Module, act) -> torch.Tensor:
        return self.ops.norm_linear(norm, x, lin, act)

    def rms_norm_linear(self, norm: nn.Module, x, lin: nn.Module, act) -> torch.Tensor:
        return self.ops.rms_norm_linear(norm, x, lin, act)

    def layer_norm(self, norm: nn.LayerNorm, x) -> torch.Tensor:
        return self.ops.layer_norm(norm, x)

    def rms_norm(self, norm: nn.Module, x) -> torch.Tensor:
        return self.ops.rms_norm(norm, x)

    def attend(self, qkv, num_heads: int, scale: float, masks: AttentionMasks) -> torch.Tensor:
        return self.ops.attend(qkv, num_heads, scale, masks)

    def diff_attention(self, qkv, lambda_full, norm_weight, num_heads: int, lambda_init, scale, eps) -> torch.Tensor:
        return self.ops.diff_attention(qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, eps)

    def attention_pool(self, q, kv, num_heads: int, scale: float) -> torch.Tensor:
        return self.ops.attention_pool(q, kv, num_heads, scale)

    def patch_embed(
        self, x, weight, bias, pos_embed, cls_token=None, reg_token=None, *, no_embed_class=False, mean=None, std=None
    ) -> torch.Tensor:
        return self.ops.patch_embed(
            x, weight, bias, pos_embed, cls_token, reg_token, no_embed_class=no_embed_class, mean=mean, std=std
        )


__all__ = ["FIRST_TOKEN", "NO_MASKS", "OP_NAMES", "AttentionMasks", "ForwardingOps", "Ops"]
