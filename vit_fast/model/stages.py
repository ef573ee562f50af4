"""The forward of :class:`vit_fast.model.vit.VisionTransformer`, written once as stages both backends run: embed
(image -> tokens), the blocks (:func:`vit_fast.model.layers.run_block`), the final norm. What a call runs comes in as
one :class:`ForwardPlan` the model resolved (backend, ops, fusion, tuning); the stages read the plan, never the
model's methods. See docs/development.md, "The path of one image".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from vit_fast.backend.ops import Ops
from vit_fast.backend.pos_embed import pos_embed_for_grid
from vit_fast.model.layers import (
    block_functional,
    gamma,
    norm,
    observed,
    run_block,
    runs_functional,
    skip_identity,
)
from vit_fast.model.validation import check_kernel_params

#: ``on_stage(name, tokens)``: called after each stage ("patch embedding", "block i", "final norm")
OnStage = Callable[[str, torch.Tensor], None] | None


@dataclass(frozen=True)
class ForwardPlan:
    """What one forward runs, resolved by the model once per call shape
    (:meth:`vit_fast.model.vit.VisionTransformer.forward_plan`) and read by the stages and the packed forward. Fields:
    docs/development.md, "The forward, planned once"."""

    backend: str  # "torch" or "triton"
    ops: Ops  # what embed, the blocks and the final norm call (a packed forward's carry its layout)
    fused: bool = True  # the kernels: LayerNorm folded into the GEMM after it
    tune: bool | None = False  # the forward times autotune candidates (inside kernels.autotune.tuning; None: traced)
    first_token: bool = False  # the torch backend may run the last block for token 0 alone
    packed: bool = False  # the ops carry an attention context: every block runs through run_block on them
    check_params: bool = False  # the ops launch unchecked: every parameter is checked once per forward
    done: Callable[[nn.Module, torch.Tensor], None] | None = None  # after the forward: its shapes cleared the net


def eager_shortcuts(model: nn.Module) -> bool:
    """Whether the torch backend's blocks may run their eager shortcuts, both the same numbers: each plain block in
    its functional form (no module calls) and, when only the pooled class token is wanted, the last block for token
    0 alone. Not while an exporter traces or a compiler runs, and not when a hook could watch a block run."""
    busy = torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.compiler.is_compiling()
    return not busy and len(model.blocks) > 0 and not observed(model.blocks)


def position_embedding(model: nn.Module, grid: tuple[int, int]) -> torch.Tensor:
    """The position embedding a forward at patch grid ``grid`` adds (resampled off the native grid)."""
    cfg = model.cfg
    return pos_embed_for_grid(model.pos_embed, grid, cfg.grid_size, model.num_prefix_tokens, cfg.no_embed_class)


def embed(plan: ForwardPlan, model: nn.Module, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Tokens ``[B, T, D]`` after the patch embedding and ``norm_pre``. On the kernels one launch (a uint8 image
    normalised inside it); on the torch backend the modules (a strided convolution where export traces)."""
    raw = x.dtype == torch.uint8
    if plan.backend == "triton":
        ops, proj = plan.ops, model.patch_embed.proj
        tokens = ops.patch_embed(
            x,
            proj.weight,
            proj.bias,
            position_embedding(model, grid),
            model.cls_token,
            model.reg_token,
            no_embed_class=model.cfg.no_embed_class,
            mean=model.input_mean if raw else None,
            std=model.input_std if raw else None,
        )
        return norm(ops, model.norm_pre, tokens)
    if raw:
        mean, std = model.input_mean.view(1, -1, 1, 1), model.input_std.view(1, -1, 1, 1)
        x = ((x.float() / 255.0 - mean) / std).to(model.pos_embed.dtype)
    tokens, pos = model.patch_embed(x), position_embedding(model, grid)
    prefix = [t.expand(tokens.shape[0], -1, -1) for t in (model.cls_token, model.reg_token) if t is not None]
    if model.cfg.no_embed_class:
        tokens = tokens + pos
        tokens = torch.cat([*prefix, tokens], dim=1) if prefix else tokens
    else:
        tokens = (torch.cat([*prefix, tokens], dim=1) if prefix else tokens) + pos
    return skip_identity(model.norm_pre, tokens)


def run_blocks(plan: ForwardPlan, model: nn.Module, tokens: torch.Tensor, on_stage: OnStage = None) -> torch.Tensor:
    """Every block on ``tokens [B, T, D]``. The kernels (and ops carrying a packed layout) run each through
    :func:`run_block`. The torch backend runs a plain block the same way (:func:`block_functional`, with the plan's
    ``first_token`` the last block for token 0 alone) when :func:`eager_shortcuts` allows, else the modules
    themselves: under gradient checkpointing, a hook, an exporter or a compiler."""
    ops, on_torch = plan.ops, plan.backend == "torch" and not plan.packed
    if on_torch and on_stage is None and model.grad_checkpointing and torch.is_grad_enabled():
        for block in model.blocks:  # timm's set_grad_checkpointing
            tokens = torch.utils.checkpoint.checkpoint(block, tokens, use_reentrant=False)
        return tokens
    shortcuts = on_torch and eager_shortcuts(model)
    if on_torch and on_stage is None and not shortcuts:
        return model.blocks(tokens)
    last = len(model.blocks) - 1
    for i, block in enumerate(model.blocks):
        token0 = plan.first_token and i == last
        if not on_torch:  # the kernels, or ops carrying an attention context (a packed batch's, on either backend)
            act = block.mlp.act if ops.modules else model.cfg.act
            tokens = run_block(ops, block, tokens, act, plan.fused)
        elif shortcuts and runs_functional(block):
            tokens = block_functional(block, tokens, first_token=token0)
        else:
            tokens = block.forward_first_token(tokens) if token0 else block(tokens)
        if on_stage is not None:
            on_stage(f"block {i}", tokens)
    return tokens


def run(plan: ForwardPlan, model: nn.Module, x: torch.Tensor, grid: tuple[int, int], on_stage: OnStage = None):
    """The forward's stages as ``plan`` says: image ``x [B, C, H, W]`` (checked) -> tokens ``[B, T, D]`` after the
    final norm (``[B, 1, D]`` with ``first_token`` on the torch backend's shortcut); ``on_stage`` sees each stage's
    tokens."""
    tokens = embed(plan, model, x, grid)
    if on_stage is not None:
        on_stage("patch embedding", tokens)
    tokens = run_blocks(plan, model, tokens, on_stage)
    tokens = final_norm(plan, model, tokens)
    if on_stage is not None:
        on_stage("final norm", tokens)
    return tokens


def final_norm(plan: ForwardPlan, model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The model's final norm on ``tokens``: its module on the torch backend, the kernel otherwise."""
    return norm(plan.ops, model.norm, tokens) if plan.backend == "triton" else skip_identity(model.norm, tokens)


def kernel_parameters(model: nn.Module) -> list[tuple[torch.Tensor | None, tuple[int, ...] | None]]:
    """Every tensor the kernels read in a forward of ``model``, with the shape its config gives it (None: any)."""
    cfg = model.cfg
    D, hidden = cfg.embed_dim, model.blocks[0].mlp.fc1.weight.shape[0] if len(model.blocks) else 0
    expected = [(model.pos_embed, None), (model.cls_token, None), (model.reg_token, None)]
    for module in (model.norm_pre, model.norm):
        if isinstance(module, nn.LayerNorm):
            expected += [(module.weight, (D,)), (module.bias, (D,))]
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        expected += [
            (block.norm1.weight, (D,)),
            (block.norm1.bias, (D,)),
            (attn.qkv.weight, (3 * D, D)),
            (attn.qkv.bias, (3 * D,)),
            (attn.proj.weight, (D, D)),
            (attn.proj.bias, (D,)),
            (gamma(block.ls1), (D,)),
            (block.norm2.weight, (D,)),
            (block.norm2.bias, (D,)),
            (mlp.fc1.weight, (hidden, D)),
            (mlp.fc1.bias, (hidden,)),
            (mlp.fc2.weight, (D, hidden)),
            (mlp.fc2.bias, (D,)),
            (gamma(block.ls2), (D,)),
        ]
    return expected


def check_parameters(model: nn.Module, x: torch.Tensor) -> None:
    """Every parameter the kernels read, checked once where the plan's ops launch unchecked (see
    :func:`vit_fast.model.validation.check_kernel_params`)."""
    check_kernel_params(model, x, model.patch_embed.proj.weight.dtype, lambda: kernel_parameters(model))


def features_triton(
    model: nn.Module, x: torch.Tensor, grid: tuple[int, int], plan: ForwardPlan, on_stage: OnStage = None
) -> torch.Tensor:
    """:func:`run` on the kernels with the plan's ops (direct launches after one check of the parameters, or the
    custom ops, under the first-use safety net until the plan's shapes are cleared)."""
    if plan.check_params:
        check_parameters(model, x)
    tokens = run(plan, model, x, grid, on_stage)
    if plan.done is not None:
        plan.done(model, x)
    return tokens


def tuned(tune: bool | None) -> contextlib.AbstractContextManager:
    """``kernels.autotune.tuning(tune)``: the plan's tuning mode, read once for the forward instead of by each launch;
    nothing where ``tune`` is None (traced: each launch reads it)."""
    if tune is None:
        return contextlib.nullcontext()
    from vit_fast.kernels.autotune import tuning  # triton is there: the plan runs the kernels

    return tuning(tune)


def features(
    plan: ForwardPlan, model: nn.Module, x: torch.Tensor, grid: tuple[int, int], on_stage: OnStage = None
) -> torch.Tensor:
    """Tokens ``[B, T, D]`` after the final norm of a checked image batch ``x``, as ``plan`` says (inside
    ``kernels.autotune.tuning()`` where it tunes); with its ``first_token`` the torch backend may return token 0
    alone (``[B, 1, D]``)."""
    if plan.backend == "torch":
        return features_torch(model, x, grid, plan, on_stage)
    with tuned(plan.tune):
        return features_triton(model, x, grid, plan, on_stage)


def features_torch(
    model: nn.Module, x: torch.Tensor, grid: tuple[int, int], plan: ForwardPlan, on_stage: OnStage = None
) -> torch.Tensor:
    """:func:`run` on the torch backend: plain PyTorch, the reference the kernels are judged against."""
    return run(plan, model, x, grid, on_stage)


__all__ = [
    "ForwardPlan",
    "check_parameters",
    "eager_shortcuts",
    "embed",
    "features",
    "features_torch",
    "position_embedding",
]
__all__ += ["features_triton", "final_norm", "kernel_parameters", "run", "run_blocks", "tuned"]
