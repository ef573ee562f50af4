"""The blocks a ViT is built of, with timm's module and parameter names (``attn.qkv``,
``ls1.gamma``, ``mlp.fc1`` ...), so timm state dicts load as they are. Plain PyTorch: the
reference path that the kernels are judged against and export traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vit_fast.model.config import ViTConfig


class PatchEmbed(nn.Module):
    """Image ``[B, C, H, W]`` to patch tokens ``[B, H/p * W/p, D]`` (a strided convolution)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.patch_size = cfg.patch_size
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, cfg.patch_size, cfg.patch_size, bias=not cfg.pre_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        exporting = torch.compiler.is_exporting() or torch.jit.is_tracing()
        if exporting or type(self.proj) is not nn.Conv2d or observed(self.proj):
            # the strided convolution: what ONNX / TensorRT artifacts were verified with (and a replaced or watched
            # proj runs as itself)
            return self.proj(x).flatten(2).transpose(1, 2)
        # eager: the same sums as one GEMM over the patches (im2col), a few times faster than a CPU convolution
        # for small images (default model, batch 1: 15 against 68 us); the convolution drops a partial last patch
        B, C, H, W = x.shape
        p = self.proj.kernel_size[0]
        gh, gw = H // p, W // p
        patches = x[:, :, : gh * p, : gw * p].reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)
        weight = self.proj.weight.reshape(self.proj.out_channels, C * p * p)
        return F.linear(patches.reshape(B, gh * gw, C * p * p), weight, self.proj.bias)


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


_ACTIVATIONS = (nn.GELU, QuickGELU, nn.SiLU)
_SCALES = (LayerScale, nn.Identity)


def runs_functional(block: nn.Module) -> bool:
    """Whether :func:`block_functional` computes exactly what ``block(x)`` does: a :class:`Block` whose parts are
    all this module's own types (no subclass, no replaced layer: a LoRA ``Linear`` or a parametrization keeps the
    module calls)."""
    if type(block) is not Block:
        return False
    a, m = block.attn, block.mlp
    return (
        type(a) is Attention
        and type(m) is Mlp
        and type(block.norm1) is nn.LayerNorm
        and type(block.norm2) is nn.LayerNorm
        and type(a.qkv) is nn.Linear
        and type(a.proj) is nn.Linear
        and type(m.fc1) is nn.Linear
        and type(m.fc2) is nn.Linear
        and type(m.act) in _ACTIVATIONS
        and type(block.ls1) in _SCALES
        and type(block.ls2) in _SCALES
    )


def _norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _scale(ls: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x if type(ls) is nn.Identity else x * ls.gamma


def _act(act: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if type(act) is nn.GELU:
        return F.gelu(x, approximate=act.approximate)
    if type(act) is nn.SiLU:
        return F.silu(x)
    return x * torch.sigmoid(1.702 * x)  # QuickGELU


def block_functional(block: Block, x: torch.Tensor, first_token: bool = False) -> torch.Tensor:
    """``block(x)`` (``block.forward_first_token(x)`` with ``first_token``) as the same torch ops on the block's
    own parameters, in the same order, without its ten module calls: on a CPU they cost about a tenth of a small
    model's batch-1 forward (4 blocks of the default model: 1.10 against 1.23 ms). Eager only: a hook, an exporter
    or a compiler gets the module calls (see ``VisionTransformer._features_torch``); :func:`runs_functional` says
    which blocks qualify."""
    a, m = block.attn, block.mlp
    B, T, D = x.shape
    qkv = F.linear(_norm(block.norm1, x), a.qkv.weight, a.qkv.bias)
    q, k, v = qkv.reshape(B, T, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    rows = 1 if first_token else T
    if first_token:
        q, x = q[:, :, :1], x[:, :1]
    o = F.scaled_dot_product_attention(q, k, v, scale=a.scale).transpose(1, 2).reshape(B, rows, D)
    x = x + _scale(block.ls1, F.linear(o, a.proj.weight, a.proj.bias))
    h = _act(m.act, F.linear(_norm(block.norm2, x), m.fc1.weight, m.fc1.bias))
    return x + _scale(block.ls2, F.linear(h, m.fc2.weight, m.fc2.bias))


def observed(module: nn.Module) -> bool:
    """Whether a hook could see ``module`` or one of its submodules run (forward or backward hooks, its own or
    global ones): a shortcut that skips or reshapes their calls must not run then."""
    g = nn.modules.module
    if g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks:
        return True
    if g._global_backward_pre_hooks:
        return True
    # module.modules() walks with names and a memo set: several times slower for a check per call; a list that
    # grows while it is read walks the tree in one loop (a child registered as None is skipped)
    todo = [module]
    for m in todo:
        if m is not None and (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks):
            return True
        if m is not None:
            todo += m._modules.values()
    return False
