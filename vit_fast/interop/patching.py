"""In-place acceleration: ``vit_fast.apply_vit_fast(timm_or_hf_vit)`` runs its blocks on our Triton kernels, and
``vit_fast.remove_vit_fast`` puts the original forwards back. The object, its class and its ``state_dict`` stay the
user's; only each block's ``forward`` is replaced. Which path a call takes, what is refused, how a patched model
pickles: docs/usage.md, "Patched in place: which path runs, and pickling".
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from vit_fast.backend import runtime
from vit_fast.interop.forwards import (
    PATCHED_BACKEND,
    SAID,
    drop_patch,
    is_patched,
    original_forward,
    patch_forward,
    share_said,
    step_aside,
)

#: a patched module's ``__dict__`` key of how its kernels run (a :class:`vit_fast.interop.timm_blocks.BlockPlan` /
#: ``PoolPlan``)
_PLAN = "_vit_fast_plan"
BACKENDS = ("auto", "triton")


def _unpatched_copy(module: nn.Module) -> nn.Module:
    """``module`` as torch.jit.script may see it: patched modules replaced by shallow copies with their own class's
    forward (parameters and buffers shared, nothing copied), the user's module tree left as it is. The module itself
    when nothing under it is patched."""
    if not any(is_patched(m) for m in module.modules()):
        return module
    copy = object.__new__(type(module))
    copy.__dict__.update(module.__dict__)
    copy.__dict__.pop(_SCRIPTABLE, None)
    drop_patch(copy.__dict__)
    copy._modules = {name: None if m is None else _unpatched_copy(m) for name, m in module._modules.items()}
    return copy


#: the instance attribute torch.jit.script calls before compiling a module (torch.jit._script's
#: call_prepare_scriptable_func): a patched model is scripted as its unpatched self, timm's own forwards, since
#: TorchScript cannot compile our forwards (``*args``, custom-op launchers); the scripted model computes what timm
#: computes, on torch
_SCRIPTABLE = "__prepare_scriptable__"


def apply_vit_fast(model: nn.Module, backend: str = "auto") -> nn.Module:
    """Make a timm ``VisionTransformer`` / ``VisionTransformerDistilled`` / ``NaFlexVit`` or a transformers vision model
    run its blocks on our kernels, in place; returns the same object. Everything is checked first: a model, block,
    attention or activation the kernels do not run is refused by name (a ValueError or TypeError), and
    ``backend="triton"`` refuses a head dim our attention does not take. See docs/usage.md, sections "What is patched,
    and what is refused" and "Patched in place: which path runs, and pickling"."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton":
        runtime.require_triton()
    module = type(model).__module__
    if module.startswith("timm."):
        from vit_fast.interop.timm_reading import plan_attention_pool, plan_timm_model

        plans = plan_timm_model(model, backend)  # refuses, by name, every feature the kernels do not run
        pool_plan = plan_attention_pool(model, backend)  # the map head (None: not an AttentionPoolLatent)
        for block, plan in zip(model.blocks, plans, strict=True):
            block.__dict__[_PLAN] = plan
            patch_forward(block, _fast_timm, backend)
        if pool_plan is not None:
            model.attn_pool.__dict__[_PLAN] = pool_plan
            patch_forward(model.attn_pool, _fast_timm_pool, backend)
        share_said(model, [*model.blocks, *([model.attn_pool] if pool_plan is not None else [])])
        model.__dict__[_SCRIPTABLE] = functools.partial(_unpatched_copy, model)  # pickles; a deepcopy binds the copy
        model.__dict__.setdefault(PATCHED_BACKEND, backend)  # a second call keeps the first's forwards
        return model
    if module.startswith("transformers."):
        from vit_fast.interop.hf_patch import apply_hf

        return apply_hf(model, backend)  # the vision towers of ViT, DeiT, DINOv2, CLIP and SigLIP
    raise TypeError(
        f"apply_vit_fast does not know {module}.{type(model).__name__}: it patches timm VisionTransformer and "
        "transformers ViT models (for vit-fast's own, use model.set_backend('triton'))"
    )


def _fast_timm(block: nn.Module, backend: str, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The forward of a patched timm block: its plan on the kernels, or timm's own forward where
    :func:`vit_fast.interop.forwards.step_aside` says so. A key-padding ``attn_mask`` (NaFlexVit's) runs on the
    kernels as ``lengths``. In eval mode the kernels run with autograd on too: the custom ops' backward recomputes
    through the eager references, exact gradients."""
    plan = block.__dict__[_PLAN]
    mask = kwargs.get("attn_mask") if not args else args[0]
    rope = kwargs.get("rope") if plan.rope_layout is not None else None  # an EvaBlock's table: the kernels apply it
    rest = (*args[1:], *(v for k, v in kwargs.items() if k != "attn_mask" and (k != "rope" or rope is None)))
    eva_positional = plan.rope_layout is not None and bool(args)  # EvaBlock(x, rope, ...): timm's own forward
    foreign = eva_positional or any(a is not None and a is not False for a in rest)  # is_causal, another's rope
    reason, lengths = step_aside(
        block, "timm_block", x, backend, head_dim=plan.head_dim, foreign=foreign, mask=mask,
        takes_lengths=mask is None or not _differential(block),  # walked only for a mask
    )  # fmt: skip
    if reason is not None:
        return original_forward(block)(x, *args, **kwargs)
    tables = {} if rope is None else {"rope": rope}
    return plan.run(block, x, **tables) if lengths is None else plan.run(block, x, lengths, **tables)


def _differential(block: nn.Module) -> bool:
    """Whether a block runs differential attention (its kernel takes no key-padding lengths)."""
    return any(type(m).__name__ in ("DiffAttention", "DiffParallelScalingBlock") for m in block.modules())


def _fast_timm_pool(pool: nn.Module, backend: str, x: torch.Tensor, attn_mask: Any = None) -> torch.Tensor:
    """The forward of a patched timm ``AttentionPoolLatent``: its plan on the kernels (under autograd too, as the
    blocks), or timm's own forward where :func:`vit_fast.interop.forwards.step_aside` says so."""
    plan = pool.__dict__[_PLAN]
    reason, lengths = step_aside(pool, "timm_pool", x, backend, head_dim=plan.head_dim, mask=attn_mask)
    if reason is not None:
        return original_forward(pool)(x, attn_mask=attn_mask)
    return plan.run(pool, x) if lengths is None else plan.run(pool, x, lengths)


def remove_vit_fast(model: nn.Module) -> int:
    """Undo :func:`apply_vit_fast`; returns how many modules were restored (blocks, and an attention-pool head)."""
    restored = 0
    model.__dict__.pop(_SCRIPTABLE, None)
    model.__dict__.pop(PATCHED_BACKEND, None)
    model.__dict__.pop(SAID, None)
    for module in model.modules():
        if drop_patch(module.__dict__):
            for name in ("_vit_fast_view", "_vit_fast_returns_tensor", _PLAN, SAID):
                module.__dict__.pop(name, None)
            restored += 1
    return restored
