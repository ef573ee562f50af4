"""The forward of :class:`vit_fast.model.vit.VisionTransformer`, written once as stages both backends run: embed
(image -> tokens), the blocks (:func:`vit_fast.model.layers.run_block`), the final norm. The ops come in as an
argument: the torch backend's (:class:`vit_fast.model.layers.TorchOps`, the reference) or the kernels'
(:func:`kernel_ops`); an attention context (a padded or packed batch's) rides in the ops. See docs/development.md,
"The path of one image".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.utils.checkpoint
from torch import nn

from vit_fast.model.layers import (
    TORCH_FUNCTIONAL,
    TorchOps,
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


def eager_shortcuts(model: nn.Module) -> bool:
    """Whether the torch backend's blocks may run their eager shortcuts, both the same numbers: each plain block in
    its functional form (no module calls) and, when only the pooled class token is wanted, the last block for token
    0 alone. Not while an exporter traces or a compiler runs, and not when a hook could watch a block run."""
    busy = torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.compiler.is_compiling()
    return not busy and len(model.blocks) > 0 and not observed(model.blocks)


def embed(ops, model: nn.Module, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Tokens ``[B, T, D]`` after the patch embedding and ``norm_pre``. On the kernels one launch (a uint8 image
    normalised inside it); on the torch ops the modules (a strided convolution where export traces)."""
    raw = x.dtype == torch.uint8
    if not isinstance(ops, TorchOps):
        proj = model.patch_embed.proj
        tokens = ops.patch_embed(
            x,
            proj.weight,
            proj.bias,
            model.pos_embed_at(grid),
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
    tokens, pos = model.patch_embed(x), model.pos_embed_at(grid)
    prefix = [t.expand(tokens.shape[0], -1, -1) for t in (model.cls_token, model.reg_token) if t is not None]
    if model.cfg.no_embed_class:
        tokens = tokens + pos
        tokens = torch.cat([*prefix, tokens], dim=1) if prefix else tokens
    else:
        tokens = (torch.cat([*prefix, tokens], dim=1) if prefix else tokens) + pos
    return skip_identity(model.norm_pre, tokens)


def run_blocks(
    ops, model: nn.Module, tokens: torch.Tensor, fused: bool = True, first_token: bool = False, on_stage: OnStage = None
) -> torch.Tensor:
    """Every block on ``tokens [B, T, D]``. The kernels run each through :func:`run_block`. The torch ops run a
    plain block the same way (:func:`block_functional`, with ``first_token`` the last block for token 0 alone) when
    :func:`eager_shortcuts` allows, else the modules themselves: under gradient checkpointing, a hook, an exporter
    or a compiler."""
    on_torch = isinstance(ops, TorchOps)
    if on_torch and on_stage is None and model.grad_checkpointing and torch.is_grad_enabled():
        for block in model.blocks:  # timm's set_grad_checkpointing
            tokens = torch.utils.checkpoint.checkpoint(block, tokens, use_reentrant=False)
        return tokens
    shortcuts = on_torch and eager_shortcuts(model)
    if on_torch and on_stage is None and not shortcuts:
        return model.blocks(tokens)
    last = len(model.blocks) - 1
    for i, block in enumerate(model.blocks):
        token0 = first_token and i == last
        if not on_torch:  # the kernels, or ops carrying an attention context (a packed batch's, on either backend)
            act = block.mlp.act if getattr(ops, "modules", False) else model.cfg.act
            tokens = run_block(ops, block, tokens, act, fused)
        elif shortcuts and runs_functional(block):
            tokens = block_functional(block, tokens, first_token=token0)
        else:
            tokens = block.forward_first_token(tokens) if token0 else block(tokens)
        if on_stage is not None:
            on_stage(f"block {i}", tokens)
    return tokens


def run(
    ops,
    model: nn.Module,
    x: torch.Tensor,
    grid: tuple[int, int],
    fused: bool = True,
    first_token=False,
    on_stage: OnStage = None,
):
    """The forward's stages on ``ops``: image ``x [B, C, H, W]`` (checked) -> tokens ``[B, T, D]`` after the final
    norm (``[B, 1, D]`` with ``first_token`` on the torch ops' shortcut); ``on_stage`` sees each stage's tokens."""
    tokens = embed(ops, model, x, grid)
    if on_stage is not None:
        on_stage("patch embedding", tokens)
    tokens = run_blocks(ops, model, tokens, fused, first_token, on_stage)
    tokens = final_norm(ops, model, tokens)
    if on_stage is not None:
        on_stage("final norm", tokens)
    return tokens


def final_norm(ops, model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The model's final norm on ``tokens``: its module on the torch ops, the kernel otherwise."""
    return skip_identity(model.norm, tokens) if isinstance(ops, TorchOps) else norm(ops, model.norm, tokens)


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


def kernel_ops(model: nn.Module, x: torch.Tensor, shape: tuple | None = None) -> tuple:
    """``(ops, fused)`` for a forward of ``model`` on the kernels: the ops
    :func:`vit_fast.backend.triton_path.ops_for` picks for input ``x`` (``shape``: what stands for its shape, see
    there), after one check of every parameter where they launch directly, and whether LayerNorm folds into GEMMs."""
    from vit_fast.backend import triton_path  # triton is needed now: the kernels run next

    ops = triton_path.ops_for(model, x, shape)
    if ops.params_checked:  # the calls skip their own checks: every parameter is checked here once
        check_kernel_params(model, x, model.patch_embed.proj.weight.dtype, lambda: kernel_parameters(model))
    return ops, triton_path.layer_norm_fused(model)


def kernels_done(model: nn.Module, x: torch.Tensor, ops, shape: tuple | None = None) -> None:
    """After a forward of :func:`kernel_ops`' ``ops``: its shapes cleared the first-use safety net."""
    from vit_fast.backend import triton_path

    triton_path.forward_done(model, x, ops, shape)


def features_triton(model: nn.Module, x: torch.Tensor, grid: tuple[int, int], on_stage: OnStage = None) -> torch.Tensor:
    """:func:`run` on the kernels, with the ops :func:`kernel_ops` picks for this call (direct launches after one
    check of the parameters, or the custom ops, under the first-use safety net until cleared)."""
    ops, fused = kernel_ops(model, x)
    tokens = run(ops, model, x, grid, fused, on_stage=on_stage)
    kernels_done(model, x, ops)
    return tokens


def features(
    model: nn.Module, x: torch.Tensor, grid, backend: str, first_token=False, on_stage: OnStage = None
) -> torch.Tensor:
    """Tokens ``[B, T, D]`` after the final norm of a checked image batch ``x``, on ``backend``; with
    ``first_token`` the torch backend may return token 0 alone (``[B, 1, D]``)."""
    if backend == "triton":
        return features_triton(model, x, grid) if on_stage is None else features_triton(model, x, grid, on_stage)
    return features_torch(model, x, grid, first_token, on_stage)


def features_torch(model: nn.Module, x: torch.Tensor, grid, first_token=False, on_stage: OnStage = None):
    """:func:`run` on the torch ops: plain PyTorch, the reference the kernels are judged against."""
    return run(TORCH_FUNCTIONAL, model, x, grid, first_token=first_token, on_stage=on_stage)


__all__ = ["eager_shortcuts", "embed", "features", "features_torch", "features_triton"]
__all__ += ["final_norm", "kernel_ops", "kernels_done", "kernel_parameters", "run", "run_blocks"]
