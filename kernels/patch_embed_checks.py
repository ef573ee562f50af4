"""The patch embedding's inputs: mean / std as given (:func:`as_channel_stats`), empty register tokens
(:func:`no_empty`), the token counts (:func:`token_counts`) and the checks run before any launch
(:func:`check_patch_embed_inputs`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._launch import check_device
from .launches import SUPPORTED_DTYPES


def as_channel_stats(v, name: str, x: torch.Tensor) -> torch.Tensor | None:
    """Accept mean/std as a tensor or a sequence of floats (e.g. ImageNet's (0.485, 0.456, 0.406))."""
    if v is None or isinstance(v, torch.Tensor):
        return v
    if isinstance(v, Sequence) and all(isinstance(e, (int, float)) for e in v):
        return torch.tensor([float(e) for e in v], dtype=torch.float32, device=x.device)
    raise TypeError(f"{name} must be a tensor [C] or a sequence of C floats, got {type(v).__name__}")


def no_empty(reg_token: torch.Tensor | None) -> torch.Tensor | None:
    """Zero register tokens (``[1, 0, D]``, as a model without registers may hold them) mean none."""
    if reg_token is not None and reg_token.dim() == 3 and reg_token.shape[1] == 0:
        return None
    return reg_token


def token_counts(
    x: torch.Tensor, weight: torch.Tensor, cls_token: torch.Tensor | None, reg_token: torch.Tensor | None
) -> tuple[int, int, int]:
    """(num_prefix, num_reg, T) of checked inputs: T = num_prefix + (H/p) * (W/p)."""
    p = weight.shape[-1]
    num_reg = reg_token.shape[1] if reg_token is not None else 0
    num_prefix = int(cls_token is not None) + num_reg
    return num_prefix, num_reg, num_prefix + (x.shape[2] // p) * (x.shape[3] // p)


def check_patch_embed_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pos_embed: torch.Tensor,
    cls_token: torch.Tensor | None,
    reg_token: torch.Tensor | None,
    mean: torch.Tensor | None,
    std: torch.Tensor | None,
    no_embed_class: bool,
) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be an image batch [B, C, H, W], got {got}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4 or weight.shape[-1] != weight.shape[-2]:
        got = f"shape {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a square Conv2d kernel [D, C, p, p], got {got}")
    if weight.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"weight has dtype {weight.dtype}; patch_embed supports float32, float16 and bfloat16 weights")
    B, C, H, W = x.shape
    D, Cw, p, _ = weight.shape
    if C != Cw:
        raise ValueError(
            f"x has {C} channels (shape {tuple(x.shape)}) but weight expects {Cw} (shape {tuple(weight.shape)})"
        )
    if H % p or W % p:
        raise ValueError(
            f"image size {H}x{W} is not divisible by the patch size {p}: resize or crop to "
            f"{max(p, H // p * p)}x{max(p, W // p * p)}"
        )
    if x.dtype == torch.uint8:
        if mean is None or std is None:
            raise ValueError(
                "x is uint8: pass mean and std per channel in 0..1 units (e.g. mean=(0.485, 0.456, 0.406), "
                "std=(0.229, 0.224, 0.225)) so the kernel can normalise it, or pass a float image"
            )
    elif x.dtype != weight.dtype:
        raise TypeError(
            f"x has dtype {x.dtype} but weight has {weight.dtype}: pass x.to({weight.dtype}) "
            "(or uint8 pixels with mean and std)"
        )
    if (mean is None) != (std is None):
        raise ValueError("pass both mean and std, or neither")
    for name, t in (("mean", mean), ("std", std)):
        if t is not None:
            if tuple(t.shape) != (C,):
                raise ValueError(f"{name} has shape {tuple(t.shape)}; it must be [C] = [{C}], one value per channel")
            if not t.is_floating_point():
                raise TypeError(f"{name} has dtype {t.dtype}; pass a float tensor")
    gh, gw = H // p, W // p
    num_prefix, num_reg, _ = token_counts(x, weight, cls_token, reg_token)
    L = gh * gw + (0 if no_embed_class else num_prefix)
    for name, t, shape in (
        ("bias", bias, (D,)),
        ("cls_token", cls_token, (1, 1, D)),
        ("reg_token", reg_token, (1, num_reg, D)),
    ):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; with weight {tuple(weight.shape)} it must be {shape}")
    if not isinstance(pos_embed, torch.Tensor) or pos_embed.dim() != 3 or pos_embed.shape[0] != 1:
        got = f"shape {tuple(pos_embed.shape)}" if isinstance(pos_embed, torch.Tensor) else type(pos_embed).__name__
        raise ValueError(f"pos_embed must be [1, L, D], got {got}")
    if pos_embed.shape[2] != D:
        raise ValueError(f"pos_embed has dim {pos_embed.shape[2]} but weight has D = {D}")
    if pos_embed.shape[1] != L:
        covered = "patches only (no_embed_class=True)" if no_embed_class else f"{num_prefix} prefix tokens + patches"
        raise ValueError(
            f"pos_embed has {pos_embed.shape[1]} rows but a {H}x{W} image is a {gh}x{gw} grid of {p}-px patches, "
            f"so it needs {L} rows ({covered}): resample it to this grid first with "
            "vit_fast.backend.pos_embed.resample_pos_embed, or check no_embed_class"
        )
    for name, t in (("bias", bias), ("pos_embed", pos_embed), ("cls_token", cls_token), ("reg_token", reg_token)):
        if t is not None and t.dtype != weight.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but weight has {weight.dtype}: pass {name}.to({weight.dtype})")
    for name, t in (
        ("weight", weight),
        ("bias", bias),
        ("pos_embed", pos_embed),
        ("cls_token", cls_token),
        ("reg_token", reg_token),
        ("mean", mean),
        ("std", std),
    ):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}: put all inputs on one device")
    check_device("patch_embed", x)


__all__ = ["as_channel_stats", "check_patch_embed_inputs", "no_empty", "token_counts"]
