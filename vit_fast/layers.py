"""The blocks a ViT is built of, with timm's module and parameter names (``attn.qkv``,
``ls1.gamma``, ``mlp.fc1`` ...), so timm state dicts load as they are. Plain PyTorch: the
reference path that the kernels are judged against and export traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig


class PatchEmbed(nn.Module):
    """Image ``[B, C, H, W]`` to patch tokens ``[B, H/p * W/p, D]`` (a strided convolution)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.patch_size = cfg.patch_size
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, cfg.patch_size, cfg.patch_size, bias=not cfg.pre_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim, bias=cfg.qkv_bias)
        self.proj = nn.Linear(cfg.embed_dim, cfg.embed_dim)

    def _probabilities_and_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # [B, H, T, Dh]
        return ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1), v

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """``softmax(q k^T / sqrt(head_dim))`` ``[B, heads, T, T]`` for input ``x [B, T, D]``: what forward
        computes and discards (the fused kernel never forms it; figures and inspection read it here)."""
        return self._probabilities_and_values(x)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        if torch.compiler.is_exporting() or torch.jit.is_tracing():
            # matmul, softmax, matmul: the graph ONNX, TensorRT and torch.export artifacts were verified with
            # (the dynamo ONNX exporter sets the first, the TorchScript one traces)
            attn, v = self._probabilities_and_values(x)
            x = attn @ v
        else:  # eager: the same math in one fused op, as timm's fused_attn and a plain PyTorch user run it
            q, k, v = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            x = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.proj(x.transpose(1, 2).reshape(B, T, D))

    def forward_first_query(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` for token 0's query alone, ``x [B, T, D]`` -> ``[B, 1, D]``: every token is still a key
        and a value."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q[:, :, :1], k, v, scale=self.scale)
        return self.proj(x.transpose(1, 2).reshape(B, 1, D))


def skip_identity(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``, without the call when ``module`` is an ``nn.Identity`` (a LayerScale or norm the config
    leaves out): a module call costs microseconds of Python, which a small model's CPU forward feels."""
    return x if type(module) is nn.Identity else module(x)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 x)``: OpenAI CLIP's activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def _activation(act: str) -> nn.Module:
    if act == "quick_gelu":
        return QuickGELU()
    if act == "silu":
        return nn.SiLU()
    return nn.GELU(approximate="tanh" if act == "gelu_tanh" else "none")


class Mlp(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.embed_dim, cfg.mlp_hidden_dim)
        self.act = _activation(cfg.act)
        self.fc2 = nn.Linear(cfg.mlp_hidden_dim, cfg.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.ls1 = LayerScale(cfg.embed_dim, cfg.init_values) if cfg.init_values else nn.Identity()
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(cfg)
        self.ls2 = LayerScale(cfg.embed_dim, cfg.init_values) if cfg.init_values else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + skip_identity(self.ls1, self.attn(self.norm1(x)))
        return x + skip_identity(self.ls2, self.mlp(self.norm2(x)))

    def forward_first_token(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward`'s output for token 0 alone, ``x [B, T, D]`` -> ``[B, 1, D]``: the same numbers as
        ``forward(x)[:, :1]``; the other tokens' queries, projection and MLP are not computed."""
        y = x[:, :1] + skip_identity(self.ls1, self.attn.forward_first_query(self.norm1(x)))
        return y + skip_identity(self.ls2, self.mlp(self.norm2(y)))


def observed(module: nn.Module) -> bool:
    """Whether a hook could see ``module`` or one of its submodules run (forward or backward hooks, its own or
    global ones): a shortcut that skips or reshapes their calls must not run then."""
    g = nn.modules.module
    if g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks:
        return True
    if g._global_backward_pre_hooks:
        return True
    todo = [module]  # module.modules() walks with names and a memo set: several times slower for a check per call
    while todo:
        m = todo.pop()
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return True
        todo.extend(child for child in m._modules.values() if child is not None)
    return False
