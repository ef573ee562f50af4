"""The blocks a ViT is built of, with timm's module and parameter names (``attn.qkv``,
``ls1.gamma``, ``mlp.fc1`` ...), so timm state dicts load as they are. Plain PyTorch: the
reference path that the kernels are judged against and export traces."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from vit_fast.backend.ops import FIRST_TOKEN, NO_MASKS, AttentionMasks, Ops
from vit_fast.kernels.activations import gate_split
from vit_fast.kernels.attention import attention_ref
from vit_fast.kernels.attention_pool import attention_pool_ref
from vit_fast.kernels.diff_attention import diff_attention_ref
from vit_fast.kernels.layer_norm import rms_norm_ref
from vit_fast.kernels.linear import activation_ref
from vit_fast.kernels.patch_embed import patch_embed_ref
from vit_fast.model.config import ViTConfig
from vit_fast.model.stacking import LinearWeights, stacked_for


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
        return run_block(TORCH_MODULES, self, x, self.mlp.act, first_token=True)


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


class TorchOps(Ops):
    """The torch backend's ops (the :class:`~vit_fast.backend.ops.Ops` interface), as :func:`run_block` calls them:
    the same torch calls a :class:`Block`'s modules make, in the same order, so a block run on them gives
    ``block(x)`` bit for bit; the ops a Block lacks run the kernels' eager references. ``modules``: each Linear,
    norm and activation called as its module; else the functional form on the modules' parameters."""

    def __init__(self, modules: bool) -> None:
        self.modules = modules

    def linear(self, x, lin: nn.Module, act=None, residual=None, gamma=None) -> torch.Tensor:
        """``residual + gamma * act(lin(x))``; ``act`` a module or a kernel's activation name, ``gamma`` a tensor or
        (``modules``) the LayerScale module."""
        y = lin(x) if self.modules else F.linear(x, lin.weight, lin.bias)
        if isinstance(act, nn.Module) and self.modules:
            y = act(y)
        elif act is not None:
            y = _act(act, y)
        if isinstance(gamma, nn.Module):
            y = skip_identity(gamma, y)
        elif gamma is not None:
            y = y * gamma
        return y if residual is None else residual + y

    def layer_norm(self, norm: nn.LayerNorm, x) -> torch.Tensor:
        return norm(x) if self.modules else F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    def rms_norm(self, norm: nn.Module, x) -> torch.Tensor:
        return norm(x) if self.modules else rms_norm_ref(x, norm.weight, None, norm.eps)

    def norm_linear(self, norm: nn.LayerNorm, x, lin: nn.Module, act) -> torch.Tensor:
        return self.linear(self.layer_norm(norm, x), lin, act)

    def rms_norm_linear(self, norm: nn.Module, x, lin: nn.Module, act) -> torch.Tensor:
        return self.linear(self.rms_norm(norm, x), lin, act)

    def attend(self, qkv, num_heads: int, scale: float, masks: AttentionMasks) -> torch.Tensor:
        """``qkv [B, T, 3 * H * Dh]`` -> ``[B, T, H * Dh]`` (``[B, 1, H * Dh]`` with ``first_token``: token 0's query
        alone). Masks or RoPE tables: the attention kernel's eager reference."""
        lengths, cu_seqlens, _, rope, first_token = masks
        if lengths is not None or cu_seqlens is not None or rope is not None:
            out = attention_ref(qkv, num_heads, scale, lengths=lengths, cu_seqlens=cu_seqlens, rope=rope)
            return out[:, :1] if first_token else out
        B, T, width = qkv.shape
        q, k, v = qkv.reshape(B, T, 3, num_heads, width // (3 * num_heads)).permute(2, 0, 3, 1, 4).unbind(0)
        if first_token:
            q = q[:, :, :1]
        o = F.scaled_dot_product_attention(q, k, v, scale=scale)
        return o.transpose(1, 2).reshape(B, q.shape[2], width // 3)

    def diff_attention(self, qkv, lambda_full, norm_weight, num_heads: int, lambda_init, scale, eps) -> torch.Tensor:
        return diff_attention_ref(qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, eps)

    def attention_pool(self, q, kv, num_heads: int, scale: float) -> torch.Tensor:
        return attention_pool_ref(q, kv, num_heads, scale)

    def patch_embed(
        self, x, weight, bias, pos_embed, cls_token=None, reg_token=None, *, no_embed_class=False, mean=None, std=None
    ) -> torch.Tensor:
        args = (x, weight, bias, pos_embed, cls_token, reg_token)
        return patch_embed_ref(*args, no_embed_class=no_embed_class, mean=mean, std=std)


#: the torch ops without module calls (the eager shortcut) and with them (what hooks, export and compilers see)
TORCH_FUNCTIONAL, TORCH_MODULES = TorchOps(modules=False), TorchOps(modules=True)


def _act_name(act) -> str:
    """An activation module (or a kernel's activation name) as the kernels' name."""
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    if isinstance(act, (nn.SiLU, QuickGELU)):
        return "silu" if isinstance(act, nn.SiLU) else "quick_gelu"
    return act


def _act(act, x: torch.Tensor) -> torch.Tensor:
    """``act`` by the kernels' name (``gelu``, ``gelu_tanh``, ``quick_gelu``, ``silu``, or a gated ``<act>_glu`` /
    ``<act>_glu_last`` over ``x``'s two halves) or as one of its modules."""
    plain, gate = gate_split(_act_name(act))
    if gate:
        x1, x2 = x.chunk(2, dim=-1)
        return _act(plain, x1) * x2 if gate == 1 else x1 * _act(plain, x2)
    return activation_ref(plain, x)


def is_rms_norm(module: nn.Module) -> bool:
    """timm's ``RmsNorm`` or ``RmsNormFp32`` (recognised by type; timm is imported wherever such a module exists, and
    never imported here). Both compute ``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim, with no bias."""
    norms = sys.modules.get("timm.layers.norm")
    types = tuple(getattr(norms, name) for name in ("RmsNorm", "RmsNormFp32") if hasattr(norms, name))
    return bool(types) and isinstance(module, types)


def norm(ops, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` on ``ops``: a LayerNorm, a timm RmsNorm, or nothing for an Identity."""
    if isinstance(module, nn.Identity):
        return x
    if isinstance(module, nn.LayerNorm):
        return ops.layer_norm(module, x)
    if is_rms_norm(module):
        return ops.rms_norm(module, x)
    raise TypeError(
        f"the triton backend runs nn.LayerNorm, timm RmsNorm or nn.Identity norms, got {type(module).__name__}"
    )


def gamma(module) -> torch.Tensor | None:
    """LayerScale's per-channel gamma, or None where the block has no LayerScale (nn.Identity)."""
    value = getattr(module, "gamma", None)  # ours or timm's LayerScale (apply_vit_fast runs timm blocks)
    if isinstance(module, LayerScale) or isinstance(value, torch.Tensor):
        return value
    if isinstance(module, nn.Identity):
        return None
    raise TypeError(f"the triton backend runs LayerScale or nn.Identity, got {type(module).__name__}")


def _scale(ops, ls) -> torch.Tensor | nn.Module | None:
    # the torch ops with module calls call the LayerScale module itself, as Block.forward does
    return ls if getattr(ops, "modules", False) else gamma(ls)


def norm_linear(ops, norm_module: nn.Module, x: torch.Tensor, lin, act, fused: bool) -> torch.Tensor:
    """``lin(norm(x))`` (then ``act``): one launch when fused and the norm is a LayerNorm or timm RmsNorm, else two."""
    if fused and isinstance(norm_module, nn.LayerNorm):
        return ops.norm_linear(norm_module, x, lin, act)
    if fused and is_rms_norm(norm_module):
        return ops.rms_norm_linear(norm_module, x, lin, act)
    return ops.linear(norm(ops, norm_module, x), lin, act)


def diff_attention(ops, attn, qkv: torch.Tensor) -> torch.Tensor:
    """timm ``DiffAttention`` from its qkv output to before proj (``[B, T, 3D] -> [B, T, D]``): both softmaxes,
    lambda, the sub_norm RmsNorm and ``1 - lambda_init`` in one kernel. lambda is timm's own ``_compute_lambda()``,
    cast to qkv's dtype as timm casts it, and stays on the device (the kernel reads it)."""
    lambda_full = attn._compute_lambda().to(qkv.dtype)
    sub_norm = attn.sub_norm
    return ops.diff_attention(
        qkv, lambda_full, sub_norm.weight, attn.num_heads, float(attn.lambda_init), attn.scale, sub_norm.eps
    )


def attention_branch(ops, norm1, attn, x, residual, ls, fused: bool, first_token: bool = False) -> torch.Tensor:
    """``residual + ls(attn(norm1(x)))`` (``attn(norm1(x))`` when residual is None); with ``first_token`` for token
    0 alone (the torch ops only). On the kernels: 3 launches, the norm in the qkv GEMM."""
    qkv = norm_linear(ops, norm1, x, attn.qkv, None, fused)  # [B, T, 3 * H * Dh], read in place as [B, T, 3, H, Dh]
    if type(attn).__name__ == "DiffAttention":
        a = diff_attention(ops, attn, qkv)
    elif first_token:
        a, residual = ops.attend(qkv, attn.num_heads, attn.scale, FIRST_TOKEN), residual[:, :1]
    else:
        a = ops.attend(qkv, attn.num_heads, attn.scale, NO_MASKS)  # [B, T, H * Dh]
    if residual is None:
        return ops.linear(a, attn.proj)
    return ops.linear(a, attn.proj, residual=residual, gamma=_scale(ops, ls))


def mlp_fc1(mlp) -> nn.Module | LinearWeights:
    """An MLP's first GEMM: its ``fc1``, or timm ``SwiGLU``'s ``fc1_g`` stacked over ``fc1_x`` (gate rows first)."""
    fc1 = getattr(mlp, "fc1", None)
    return fc1 if fc1 is not None else stacked_for(mlp, "fc1", [mlp.fc1_g, mlp.fc1_x])


def mlp_branch(ops, norm2, mlp, x, residual, ls, fused: bool, act, gated=False, gate_last=False, torch_act=None):
    """``residual + ls(mlp(norm2(x)))`` (``mlp(norm2(x))`` when residual is None). The activation rides in fc1's
    epilogue, a SwiGLU gate too (``gated``: ``act(x1) * x2``, or ``x1 * act(x2)`` with ``gate_last``, fc1 the stacked
    halves: :func:`mlp_fc1`); a ``torch_act`` the epilogue does not have runs in torch between fc1 and fc2; an MLP's
    own ``norm`` (timm's scale_mlp_norm, EVA-02) runs before fc2."""
    if gated:  # one GEMM over the stacked halves, the gate in its epilogue (the torch ops chunk as timm does)
        h = norm_linear(ops, norm2, x, mlp_fc1(mlp), f"{_act_name(act)}_glu{'_last' if gate_last else ''}", fused)
    elif torch_act is not None:
        h = torch_act(norm_linear(ops, norm2, x, mlp.fc1, None, fused))
    else:
        h = norm_linear(ops, norm2, x, mlp.fc1, act, fused)
    inner = getattr(mlp, "norm", None)
    if inner is not None:
        h = norm(ops, inner, h)
    if residual is None:
        return ops.linear(h, mlp.fc2)
    return ops.linear(h, mlp.fc2, residual=residual, gamma=_scale(ops, ls))


def run_block(
    ops, block, x: torch.Tensor, act, fused: bool = True, *, first_token: bool = False, **mlp
) -> torch.Tensor:
    """A pre-norm block, ``x [B, T, D]`` -> ``[B, T, D]``: ``x + ls1(attn(norm1(x)))``, then
    ``x + ls2(mlp(norm2(x)))``, on ``ops`` (the kernels: 5 launches with the norms folded into the GEMMs; or the
    torch ops). Ours, timm's and a transformers layer seen with timm's names all run here. An attention context (a
    padded batch's lengths) rides in ``ops``; ``mlp``: :func:`mlp_branch`'s gate arguments."""
    x = attention_branch(ops, block.norm1, block.attn, x, x, block.ls1, fused, first_token)
    return mlp_branch(ops, block.norm2, block.mlp, x, x, block.ls2, fused, act, **mlp)


def block_functional(block: Block, x: torch.Tensor, first_token: bool = False) -> torch.Tensor:
    """``block(x)`` (``block.forward_first_token(x)`` with ``first_token``): :func:`run_block` on the torch ops
    without module calls. Eager only: a hook, an exporter or a compiler gets the module calls;
    :func:`runs_functional` says which blocks qualify."""
    return run_block(TORCH_FUNCTIONAL, block, x, block.mlp.act, first_token=first_token)


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
