"""timm's transformer blocks and attention-pool head on our kernels: :class:`BlockPlan` and :class:`PoolPlan` say how
one runs (what :func:`vit_fast.apply_vit_fast` runs in place of its forward), built of the branches of
:mod:`vit_fast.model.layers`. Reading a timm model into plans: :mod:`vit_fast.interop.timm_reading`. The block kinds,
MLPs and heads that run: docs/usage.md, "What is patched, and what is refused".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from vit_fast.model.layers import (
    attention_branch,
    diff_attention,
    gamma,
    mlp_branch,
    norm,
    norm_linear,
    run_block,
)
from vit_fast.model.stacking import LinearWeights, stacked_for


def is_identity(module) -> bool:
    """Whether ``module`` is absent: None or ``nn.Identity`` (timm's way of leaving a part out)."""
    return module is None or isinstance(module, nn.Identity)


@dataclass(frozen=True)
class MlpPlan:
    act: str  # the linear kernel's activation name
    gated: bool = False  # timm GluMlp: fc1 gives [x1 | x2], then act(x1) * x2 (or x1 * act(x2) with gate_last)
    gate_last: bool = False


@dataclass(frozen=True)
class BlockPlan:
    """How one timm block runs on the kernels: its kind, each MLP's activation, its attention head dim, and for an
    ``EvaBlock`` its rotary embedding's layout and unrotated prefix tokens."""

    kind: str  # "Block", "ResPostBlock", "ParallelThingsBlock", "ParallelScalingBlock", "DiffParallelScalingBlock", ...
    mlps: tuple[MlpPlan, ...]
    head_dim: int
    rope_layout: str | None = None  # "EvaBlock": "interleaved" or "half" (its attention's rotate_half); else None
    num_prefix: int = 0  # "EvaBlock": its attention's num_prefix_tokens (class, registers), left unrotated

    def run(self, block: nn.Module, x: torch.Tensor, lengths: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        """The block's forward on the kernels, ``x [B, T, D]`` -> ``[B, T, D]``; ``lengths [B]``: a padded batch's
        valid tokens per sample (:func:`vit_fast.backend.triton_path.attention_with_lengths`); ``rope``: the rotary
        table timm hands an ``EvaBlock`` (``[(H,) T_rot, 2 * Dh]``, sin then cos). A pre-norm ``Block`` is
        :func:`vit_fast.model.layers.run_block`, as ours; the other kinds are built of the same branches."""
        from vit_fast.backend.triton_path import fuse_ln_from_env, patched_ops

        ops, fused = patched_ops(x, lengths), fuse_ln_from_env()
        x = x.contiguous()  # a model without prefix tokens hands its patch embedding's transposed view to block 0
        if self.kind == "EvaBlock":
            return _eva_block(ops, block, self, x, rope, fused)
        if self.kind == "Block":
            return run_block(ops, block, x, self.mlps[0].act, fused, **_gate(self.mlps[0]))
        if self.kind == "ResPostBlock":
            x = x + norm(ops, block.norm1, attention_branch(ops, nn.Identity(), block.attn, x, None, None, fused))
            mlp = mlp_branch(ops, nn.Identity(), block.mlp, x, None, None, fused, **_act_and_gate(self.mlps[0]))
            return x + norm(ops, block.norm2, mlp)
        if self.kind in ("ParallelScalingBlock", "DiffParallelScalingBlock"):
            return _parallel_scaling(ops, block, self.mlps[0], x, fused)
        # ParallelThingsBlock: each branch reads the block's input; the residual chain sums their outputs
        out = x
        for branch in block.attns:
            out = attention_branch(ops, branch.norm, branch.attn, x, out, branch.ls, fused)
        x = out
        for branch, mlp_plan in zip(block.ffns, self.mlps, strict=True):
            out = mlp_branch(ops, branch.norm, branch.mlp, x, out, branch.ls, fused, **_act_and_gate(mlp_plan))
        return out


def _gate(plan: MlpPlan) -> dict:
    return {"gated": plan.gated, "gate_last": plan.gate_last}


def _act_and_gate(plan: MlpPlan) -> dict:
    return {"act": plan.act, **_gate(plan)}


class _Gamma(NamedTuple):
    """An ``EvaBlock``'s LayerScale parameter (``gamma_2``) as the branches read a LayerScale: its ``gamma``."""

    gamma: torch.Tensor


def _eva_qkv(attn: nn.Module) -> nn.Linear | LinearWeights:
    """An Eva attention's q, k and v projections as one GEMM: its fused ``qkv`` (with EvaAttention's ``q_bias``, zero
    ``k_bias`` and ``v_bias`` joined as timm joins them), or its three Linears stacked (:func:`stacked_for`: made
    again when a weight changes)."""
    if attn.qkv is not None:
        if getattr(attn, "q_bias", None) is None:
            return attn.qkv
        return LinearWeights(attn.qkv.weight, torch.cat((attn.q_bias, attn.k_bias, attn.v_bias)))
    return stacked_for(attn, "qkv", [attn.q_proj, attn.k_proj, attn.v_proj])


def _eva_block(ops, block, plan: BlockPlan, x: torch.Tensor, rope, fused: bool) -> torch.Tensor:
    """timm's ``EvaBlock`` (``x + gamma_1 * attn(norm1(x), rope)``, then ``x + gamma_2 * mlp(norm2(x))``) on the
    kernels: 5 launches as a ``Block``; the rotary table is read by the attention kernel as two views, no copy."""
    from vit_fast.kernels.rope import split_sin_cos  # triton's: imported where the kernels run

    attn = block.attn
    qkv = norm_linear(ops, block.norm1, x, _eva_qkv(attn), None, fused)  # [B, T, 3 * H * Dh]
    tables = None if rope is None else (*split_sin_cos(rope), plan.num_prefix, plan.rope_layout)
    a = ops.attention(qkv, attn.num_heads, attn.scale, rope=tables)
    x = ops.linear(a, attn.proj, residual=x, gamma=block.gamma_1)
    ls2 = nn.Identity() if block.gamma_2 is None else _Gamma(block.gamma_2)
    return mlp_branch(ops, block.norm2, block.mlp, x, x, ls2, fused, **_act_and_gate(plan.mlps[0]))


def _parallel_scaling(ops, block, plan: MlpPlan, x: torch.Tensor, fused: bool) -> torch.Tensor:
    """timm's ``ParallelScalingBlock`` on the kernels, ``x [B, T, D]`` -> ``[B, T, D]``: fc1 and qkv as two GEMMs over
    row slices of ``in_proj`` with ``in_norm`` folded in, qk-norm (:func:`_qk_norm`), then the attention and MLP
    projections, each adding its residual with the same gamma. See docs/development.md, section "timm blocks on the
    kernels (`timm_blocks.py`)".
    """
    width = x.shape[-1]
    hidden = block.in_proj.out_features - 3 * width
    weight, bias = block.in_proj.weight, block.in_proj.bias
    mlp_bias = getattr(block, "mlp_bias", None)
    if mlp_bias is None and bias is not None:
        mlp_bias = bias[:hidden]  # qkv_bias=True: in_proj.bias holds fc1's bias too
    fc1 = LinearWeights(weight[:hidden], mlp_bias)
    qkv_proj = LinearWeights(weight[hidden:], bias[hidden:] if bias is not None else None)
    if fused:  # the norm's statistics are taken in both GEMMs' prologues: cheaper than a launch and a round trip
        m = norm_linear(ops, block.in_norm, x, fc1, plan.act, fused)
        qkv = norm_linear(ops, block.in_norm, x, qkv_proj, None, fused)
    else:
        y = norm(ops, block.in_norm, x)
        m, qkv = ops.linear(y, fc1, plan.act), ops.linear(y, qkv_proj)
    qkv = _qk_norm(ops, block, qkv)
    if type(block).__name__ == "DiffParallelScalingBlock":  # the block holds DiffAttention's lambda and sub_norm
        a = diff_attention(ops, block, qkv)
    else:
        a = ops.attention(qkv, block.num_heads, block.scale)  # [B, T, D]
    scale = gamma(block.ls)
    if getattr(block, "out_proj", None) is not None:
        # fuse_out_proj: out_proj(cat(a, m)) == a @ W[:, :D]^T + m @ W[:, D:]^T + b
        out_weight = block.out_proj.weight
        x = ops.linear(a, LinearWeights(out_weight[:, :width], block.out_proj.bias), residual=x, gamma=scale)
        return ops.linear(m, LinearWeights(out_weight[:, width:], None), residual=x, gamma=scale)
    x = ops.linear(a, block.attn_out_proj, residual=x, gamma=scale)
    return ops.linear(m, block.mlp_out_proj, residual=x, gamma=scale)


def _qk_norm(ops, block, qkv: torch.Tensor) -> torch.Tensor:
    """``qkv [B, T, 3 * D]`` with ``q_norm`` / ``k_norm`` (LayerNorm or RmsNorm over head_dim, or Identity) applied to
    its q and k heads: one norm-kernel launch each, then ``torch.cat`` repacks ``[q | k | v]`` for the attention kernel.
    Why the repack, and what would remove it: docs/development.md, section "timm blocks on the kernels
    (`timm_blocks.py`)".
    """
    if is_identity(block.q_norm) and is_identity(block.k_norm):
        return qkv
    batch, tokens, features = qkv.shape
    head_dim = block.head_dim  # differential attention: 2 x heads q/k heads of head_dim each
    q, k, v = qkv.split(features // 3, dim=-1)
    q = norm(ops, block.q_norm, q.reshape(batch, tokens, -1, head_dim))
    k = norm(ops, block.k_norm, k.reshape(batch, tokens, -1, head_dim))
    return torch.cat((q.reshape(batch, tokens, -1), k.reshape(batch, tokens, -1), v), dim=-1)


# --------------------------------------------------------------------------- attention-pool heads
@dataclass(frozen=True)
class PoolPlan:
    """How an attention-pool head (timm's ``AttentionPoolLatent``, ``global_pool='map'``; transformers' SigLIP pooling
    head through :mod:`vit_fast.interop.hf_patch`) runs on the kernels: the q and kv projections, the attention-pool
    kernel and its projection, then the MLP with its LayerNorm folded into fc1, pooled as ``"token"``, ``"avg"`` or
    ``""``. See docs/development.md, section "timm blocks on the kernels (`timm_blocks.py`)".
    """

    num_heads: int
    head_dim: int
    scale: float
    mlp: MlpPlan | None  # None: no MLP (timm's out_features=0)
    pool: str  # "token", "avg" or "" (every latent)

    def run(self, head, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B, T, D]`` -> the pooled ``[B, D]`` (``[B, L, D]`` with pool ""); ``lengths [B]``: a padded batch's
        valid tokens per sample. ``head`` has timm's names:
        ``latent`` ``[1, L, D]``, ``q`` (a Linear, or None / nn.Identity: the latent is the query), ``kv``,
        ``proj`` (None / nn.Identity: none), ``norm``, ``mlp`` (``fc1``, ``fc2``; None: none), and ``torch_act``
        where the plan's MLP activation is ``"torch"`` (run in PyTorch between fc1 and fc2)."""
        from vit_fast.backend.triton_path import fuse_ln_from_env, patched_ops

        ops = patched_ops(x, lengths)
        x = x.contiguous()
        latent = head.latent
        q = latent if is_identity(head.q) else ops.linear(latent, head.q)  # [1, L, D]: once, not per image
        kv = ops.linear(x, head.kv)  # [B, T, 2 * D], read in place as [B, T, 2, H, Dh]
        a = ops.attention_pool(q, kv, self.num_heads, self.scale)  # [B, L, D]
        if not is_identity(head.proj):
            a = ops.linear(a, head.proj)
        if self.mlp is not None and self.mlp.act == "torch":  # an activation fc1's epilogue does not have
            a = mlp_branch(
                ops, head.norm, head.mlp, a, a, nn.Identity(), fuse_ln_from_env(), None, torch_act=head.torch_act
            )
        elif self.mlp is not None:
            a = mlp_branch(ops, head.norm, head.mlp, a, a, nn.Identity(), fuse_ln_from_env(), **_act_and_gate(self.mlp))
        if self.pool == "token":
            return a[:, 0]
        if self.pool == "avg":
            return a.mean(1)
        return a
