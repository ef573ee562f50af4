"""In-place acceleration, in the spirit of Liger-Kernel's ``apply_liger_kernel_to_*``:

    vit_fast.apply_vit_fast(timm_or_hf_vit)     # its blocks now run our Triton kernels
    vit_fast.remove_vit_fast(timm_or_hf_vit)    # back to the original forwards

The object, its class and its ``state_dict`` stay the user's: only each transformer block's
``forward`` is replaced, by one that runs LayerNorm, the qkv GEMM, flash-style attention, the
projection with its residual, and the MLP with its residual on the block's own parameters. It
takes the kernel path where ``VisionTransformer``'s ``backend="auto"`` would (a CUDA tensor on a card
with tensor cores, sm_80 and up), or for any tensor with ``backend="triton"`` (on a CPU: Triton's
interpreter), and the block's original forward otherwise (and for anything the kernels do not
cover: an attention mask, dropout in training, autograd).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from . import runtime

_ORIGINAL = "_vit_fast_original_forward"
BACKENDS = ("auto", "triton")


def _kernels_can_run(x: torch.Tensor, backend: str) -> bool:
    if backend == "triton":
        return True
    return runtime.auto_backend(x.device) == "triton"  # the model's rule: CUDA cards with tensor cores only


def _needs_original(module: nn.Module, x: torch.Tensor) -> bool:
    return (module.training and torch.is_grad_enabled()) or (torch.is_grad_enabled() and x.requires_grad)


def _timm_act(block: nn.Module) -> str:
    act = getattr(block.mlp, "act", None)
    if not isinstance(act, nn.GELU):
        raise ValueError(f"apply_vit_fast: block activation {type(act).__name__} is not GELU; the kernels run GELU")
    return "gelu_tanh" if act.approximate == "tanh" else "gelu"


def _patch(module: nn.Module, fast: Any) -> None:
    if _ORIGINAL in module.__dict__:
        return  # already patched
    module.__dict__[_ORIGINAL] = module.forward
    module.forward = types.MethodType(fast, module)


def _unpatch(module: nn.Module) -> bool:
    original = module.__dict__.pop(_ORIGINAL, None)
    if original is None:
        return False
    module.__dict__.pop("forward", None)
    return True


def apply_vit_fast(model: nn.Module, backend: str = "auto") -> nn.Module:
    """Make a timm ``VisionTransformer`` or a transformers vision model (ViT, DeiT, DINOv2, CLIP, SigLIP:
    :mod:`vit_fast.hf_patch`) run its blocks on our kernels, in place; returns the same object."""
    from .triton_path import _block

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton":
        runtime.require_triton()
    module = type(model).__module__
    if module.startswith("timm."):
        from .convert import timm_config

        cfg = timm_config(model)  # refuses, by name, every feature the kernels do not run
        act = cfg.act

        def fast_timm(block: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if args or kwargs or not _kernels_can_run(x, backend) or _needs_original(block, x):
                return block.__dict__[_ORIGINAL](x, *args, **kwargs)
            return _block(block, x, act)

        for block in model.blocks:
            _timm_act(block)
            _patch(block, fast_timm)
        return model
    if module.startswith("transformers."):
        from .hf_patch import apply_hf

        return apply_hf(model, backend)  # the vision towers of ViT, DeiT, DINOv2, CLIP and SigLIP
    raise TypeError(
        f"apply_vit_fast does not know {module}.{type(model).__name__}: it patches timm VisionTransformer and "
        "transformers ViT models (for vit-fast's own, use model.set_backend('triton'))"
    )


def remove_vit_fast(model: nn.Module) -> int:
    """Undo :func:`apply_vit_fast`; returns how many blocks were restored."""
    restored = 0
    for module in model.modules():
        if _unpatch(module):
            module.__dict__.pop("_vit_fast_view", None)
            module.__dict__.pop("_vit_fast_returns_tensor", None)
            restored += 1
    return restored
