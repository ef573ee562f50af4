"""Input checks that run before any compute, with messages that say how to fix the input."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from operator import attrgetter

import torch
from torch import nn

from vit_fast.base.switches import switch
from vit_fast.model.config import ViTConfig


def _nearest_multiple(n: int, p: int) -> int:
    return max(p, int(round(n / p)) * p)


def check_image_batch(
    x: torch.Tensor, cfg: ViTConfig, dtype: torch.dtype, device: torch.device, takes_uint8: bool
) -> tuple[int, int]:
    """Validate an image batch for a model of ``cfg`` whose weights are ``dtype`` on ``device`` (``takes_uint8``:
    it normalises raw images itself); return its patch grid ``(H / p, W / p)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor image batch [B, C, H, W], got {type(x).__name__}")
    if x.dim() != 4:
        hint = " Add a batch dimension with x.unsqueeze(0)." if x.dim() == 3 else ""
        raise ValueError(
            f"expected a 4-D image batch [B, C, H, W], got a {x.dim()}-D tensor of shape {tuple(x.shape)}.{hint}"
        )
    B, C, H, W = x.shape
    if C != cfg.in_chans:
        if x.shape[-1] == cfg.in_chans:
            hint = " It looks like channels-last (NHWC): pass x.permute(0, 3, 1, 2)."
        elif C == 4 and cfg.in_chans == 3:
            hint = " It looks like RGBA: drop the alpha channel with x[:, :3]."
        elif x.shape[-1] == 4 and cfg.in_chans == 3:
            hint = " It looks like channels-last RGBA: pass x[..., :3].permute(0, 3, 1, 2)."
        else:
            hint = ""
        raise ValueError(
            f"expected {cfg.in_chans} channels in dim 1 of [B, C, H, W], got shape {tuple(x.shape)}.{hint}"
        )
    p = cfg.patch_size
    if H % p or W % p:
        if not cfg.dynamic_img_size:  # one size fits: suggest it, not a nearest multiple the model would refuse
            eh, ew = cfg.img_hw
            raise ValueError(
                f"image size {H}x{W} is not divisible by the patch size {p}, and this model takes {eh}x{ew} "
                f"images only: resize to {eh}x{ew}"
            )
        raise ValueError(
            f"image size {H}x{W} is not divisible by the patch size {p}; the nearest valid size is "
            f"{_nearest_multiple(H, p)}x{_nearest_multiple(W, p)}"
        )
    if not cfg.dynamic_img_size and (H, W) != cfg.img_hw:
        eh, ew = cfg.img_hw
        raise ValueError(
            f"expected {eh}x{ew} images (a {cfg.grid_size[0]}x{cfg.grid_size[1]} grid of {p}-px patches), "
            f"got {H}x{W}: resize to {eh}x{ew}, or build the model with dynamic_img_size=True to accept any "
            f"size that is a multiple of {p} (nearest: {_nearest_multiple(H, p)}x{_nearest_multiple(W, p)})"
        )
    if B == 0:
        raise ValueError(f"empty batch: got shape {tuple(x.shape)}; pass at least one image")
    if x.dtype == torch.uint8 and takes_uint8:
        pass  # raw pixels, normalised inside the model (set_input_normalization)
    elif not x.dtype.is_floating_point:
        raise ValueError(
            f"input dtype {x.dtype}: the model takes normalised float images in {dtype}. Convert and normalise "
            f"first, e.g. x = ((x.float() / 255 - mean) / std).to({dtype}) with mean and std the "
            "model's per-channel values as [1, C, 1, 1] tensors (ImageNet: mean 0.485, 0.456, 0.406; "
            "std 0.229, 0.224, 0.225), or let the model do it: model.set_input_normalization(mean, std)"
        )
    elif x.dtype != dtype:
        raise ValueError(
            f"input dtype {x.dtype} differs from the weights' {dtype}: pass x.to({dtype}) "
            f"or convert the model with model.to({x.dtype})"
        )
    if x.device != device:
        raise ValueError(
            f"input is on {x.device} but the weights are on {device}: pass x.to('{device}') "
            f"or move the model with model.to('{x.device}')"
        )
    return (H // p, W // p)


def check_model_input(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """:func:`check_image_batch` for ``model`` (a ViT with ``cfg``, ``dtype``, ``device`` and ``input_mean``, set where
    it normalises raw images); returns the patch grid."""
    return check_image_batch(x, model.cfg, model.dtype, model.device, model.input_mean is not None)


class NonFiniteError(ValueError):
    """A forward produced NaN or Inf; the message names the first stage where it appeared."""


def finite_check_from_env() -> bool:
    """``VIT_FAST_CHECK_FINITE=1`` (true, yes, on) turns the per-stage finite check on for every model; a value
    that is not a switch raises ValueError (SwitchError) naming it."""
    return bool(switch("VIT_FAST_CHECK_FINITE", False))


def require_finite(stage: str, tensor: torch.Tensor, previous: str | None) -> None:
    """Raise :class:`NonFiniteError` naming ``stage`` when ``tensor`` holds NaN or Inf."""
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return
    nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    first = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
    if previous is None:
        where = "the input images already hold them: check the data and its preprocessing (decoding, normalisation)"
    else:
        where = f"everything up to {previous} was finite, so {stage} produced them"
    raise NonFiniteError(
        f"non-finite values first appear at {stage}: {nan} NaN and {inf} Inf of {tensor.numel()} values "
        f"(first at index {first}); {where}"
    )


def finite_check(first: str = "input") -> Callable[[str, torch.Tensor], None]:
    """An ``on_stage(stage, tokens)`` for a forward's stages that raises :class:`NonFiniteError` at the first stage
    whose tokens hold NaN or Inf, naming the finite stage before it (``first``: what came before the first)."""
    previous = [first]

    def check(stage: str, tokens: torch.Tensor) -> None:
        require_finite(stage, tokens, previous[0])
        previous[0] = stage

    return check


#: per module, the fingerprint of its parameters when they last passed :func:`check_kernel_params` (weak: no module
#: is kept)
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _parameters(module: nn.Module) -> list[torch.Tensor]:
    """Every parameter under ``module``, read straight from the modules' dicts: faster than ``module.parameters()``,
    which goes through named_modules (see docs/development.md, section "Parameter checks (`model/validation.py`)")."""
    found, stack = [], [module]
    while stack:
        mod = stack.pop()
        if mod is not None:  # a submodule slot may hold None
            found += mod._parameters.values()
            stack += mod._modules.values()
    return [p for p in found if p is not None]


#: a tensor's dtype, read through C (the fingerprint below is taken every forward)
_DTYPE = attrgetter("dtype")


def check_kernel_params(
    owner: nn.Module,
    x: torch.Tensor,
    dtype: torch.dtype,
    expected: Callable[[], list[tuple[torch.Tensor | None, tuple | None]]],
) -> None:
    """What the kernels' own per-launch checks would find: every tensor of ``expected()`` (tensor, shape or None)
    has ``dtype``, x's device, that shape and a contiguous last dim; a ValueError naming the parameter otherwise.

    Run in full once per ``owner``, then again only when its parameters' fingerprint changes: which tensors they
    are (a replaced layer or parameter), where their data lives, their dtypes, shapes and strides, and x's device."""
    params = _parameters(owner)
    fingerprint = (
        x.device,
        tuple(map(id, params)),
        tuple(map(torch.Tensor.data_ptr, params)),
        tuple(map(_DTYPE, params)),  # attrgetter, not a generator: every forward asks (host time)
        tuple(map(torch.Tensor.size, params)),
        tuple(map(torch.Tensor.stride, params)),
    )
    if _CHECKED.get(owner) == fingerprint:
        return
    device = x.device
    for t, shape in expected():
        if t is None:
            continue
        if t.dtype != dtype or t.device != device or (shape is not None and t.shape != shape) or t.stride(-1) != 1:
            name = next((n for n, p in owner.named_parameters() if p is t), "a parameter")
            raise ValueError(
                f"triton backend: {name} is {t.dtype} {tuple(t.shape)} on {t.device} (stride {t.stride(-1)}), but "
                f"the forward needs {dtype} {shape or ''} on {device}, contiguous: move the whole model at once "
                "(model.to(device, dtype)) and keep its layers' shapes"
            )
    _CHECKED[owner] = fingerprint
