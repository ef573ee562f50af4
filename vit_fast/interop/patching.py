"""In-place acceleration: ``vit_fast.apply_vit_fast(timm_or_hf_vit)`` runs its blocks on our Triton kernels, and
``vit_fast.remove_vit_fast`` puts the original forwards back. The object, its class and its ``state_dict`` stay the
user's; only each block's ``forward`` is replaced. Which path a call takes, what is refused, how a patched model
pickles: docs/usage.md, "Patched in place: which path runs, and pickling".
"""

from __future__ import annotations

import functools
import warnings
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
    say_fallback,
    share_said,
)
from vit_fast.interop.naflex import key_padding_lengths

#: a patched module's ``__dict__`` key of how its kernels run (a :class:`vit_fast.interop.timm_blocks.BlockPlan` /
#: ``PoolPlan``)
_PLAN = "_vit_fast_plan"
BACKENDS = ("auto", "triton")


def _kernels_can_run(x: torch.Tensor, backend: str, head_dim: int | None = None) -> bool:
    # the model's rule (CUDA cards with tensor cores, a head dim our attention takes) and the kernels' dtypes
    return runtime.patched_runs_kernels(x, backend, head_dim)


def _say_export_runs_timm(x: torch.Tensor, backend: str) -> None:
    """torch.export of a patched model whose blocks take timm's forward here: said once, since the exported graph
    then holds none of our ops (the user may have exported to get them)."""
    key = (str(x.device), str(x.dtype), backend)
    if key in _EXPORT_WARNED:
        return
    _EXPORT_WARNED.add(key)
    warnings.warn(
        f"apply_vit_fast(backend={backend!r}): torch.export on {x.device} ({x.dtype}) records timm's own block "
        "forwards, none of vit-fast's kernels (they run for float16/bfloat16/float32 on CUDA cards with tensor "
        "cores under 'auto'); patch with backend='triton' to export our custom ops",
        UserWarning,
        stacklevel=3,
    )


_EXPORT_WARNED: set[tuple[str, str, str]] = set()


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
    """The forward of a patched timm block: its plan on the kernels, or timm's own forward where the kernels step
    aside (a mask other than key padding, ``is_causal``, ``rope``, training mode, a dtype or device the kernels
    skip). A key-padding ``attn_mask`` (NaFlexVit's) runs on the kernels as ``lengths``
    (:mod:`vit_fast.interop.naflex`). In eval mode the kernels run with autograd on too: the custom ops' backward
    recomputes through the eager references, exact gradients."""
    plan = block.__dict__[_PLAN]
    if _recording_for_elsewhere():
        return original_forward(block)(x, *args, **kwargs)
    mask = kwargs.get("attn_mask") if not args else args[0]
    rope = kwargs.get("rope") if plan.rope_layout is not None else None  # an EvaBlock's table: the kernels apply it
    tables = {} if rope is None else {"rope": rope}
    rest = (*args[1:], *(v for k, v in kwargs.items() if k != "attn_mask" and (k != "rope" or rope is None)))
    eva_positional = plan.rope_layout is not None and bool(args)  # EvaBlock(x, rope, ...): timm's own forward
    extra = any(a is not None and a is not False for a in rest) or eva_positional  # is_causal, another's rope
    exporting = torch.compiler.is_exporting()
    if extra or block.training or not _kernels_can_run(x, backend, plan.head_dim):
        if exporting and not extra and mask is None:
            _say_export_runs_timm(x, backend)
        elif not extra:  # training mode or a dtype the kernels skip, where float32 would run them: said once
            say_fallback(block, x, backend, "training" if block.training else "dtype", what="blocks")
        return original_forward(block)(x, *args, **kwargs)
    if mask is None:
        return plan.run(block, x, **tables)  # our custom ops (what torch.export records), autograd on or off
    # read only where the kernels would run: the check syncs with the device (once per mask, see key_padding_lengths)
    lengths = None if exporting or _differential(block) else key_padding_lengths(mask, x.shape[0], x.shape[1])
    if lengths is None:  # not key padding of a prefix of each row
        return original_forward(block)(x, *args, **kwargs)
    return plan.run(block, x, lengths, **tables)


def _recording_for_elsewhere() -> bool:
    """torch.jit.trace or torch.onnx.export is recording the model: a TorchScript or ONNX graph cannot hold a Triton
    kernel, so timm's own forward is what they record (the graph of the unpatched model)."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def _differential(block: nn.Module) -> bool:
    """Whether a block runs differential attention (its kernel takes no key-padding lengths)."""
    return any(type(m).__name__ in ("DiffAttention", "DiffParallelScalingBlock") for m in block.modules())


def _fast_timm_pool(pool: nn.Module, backend: str, x: torch.Tensor, attn_mask: Any = None) -> torch.Tensor:
    """The forward of a patched timm ``AttentionPoolLatent``: its plan on the kernels, or timm's own forward where
    the blocks would take theirs (a mask other than key padding, training mode, a dtype or device the kernels
    skip)."""
    plan = pool.__dict__[_PLAN]
    original = original_forward(pool)
    if _recording_for_elsewhere():
        return original(x, attn_mask=attn_mask)
    if pool.training or not _kernels_can_run(x, backend, plan.head_dim):
        say_fallback(pool, x, backend, "training" if pool.training else "dtype", what="blocks")
        return original(x, attn_mask=attn_mask)
    if attn_mask is None:
        return plan.run(pool, x)  # under autograd too, as the blocks
    if torch.compiler.is_compiling():  # padded, it runs in PyTorch anyway: whether it is, a graph cannot ask
        return original(x, attn_mask=attn_mask)
    lengths = key_padding_lengths(attn_mask, x.shape[0], x.shape[1])
    return original(x, attn_mask=attn_mask) if lengths is None else plan.run(pool, x, lengths)


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
