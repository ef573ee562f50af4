"""Images of different sizes served by ``vit-fast serve --variable-size``: which models take them (those with
``ViTConfig.dynamic_img_size``), the checks every request passes before any work, and one packed forward
(:meth:`vit_fast.VisionTransformer.forward_packed`) per batch of ragged requests the server hands over, each request
getting its own rows back in order. How Triton batches them: docs/deploy.md, "Images of any size"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vit_fast.model.packing import check_images
from vit_fast.model.vit import VisionTransformer
from vit_fast.serve.settings import VARIABLE_MAX_SIDE
from vit_fast.util.limits import CEILINGS, check_batch_fits


def check_variable_size(model: VisionTransformer, max_side: int | None, element_size: int) -> int:
    """Raise a ValueError (a TypeError for a block a packed forward cannot run) unless ``model`` can serve images of
    other sizes than its config's, up to ``max_side`` pixels a side (None: :data:`VARIABLE_MAX_SIDE`); returns the
    largest side. On the CPU one image at that size must fit the memory available here
    (:func:`vit_fast.util.limits.check_batch_fits`)."""
    cfg = model.cfg
    h, w = cfg.img_hw
    if not cfg.dynamic_img_size:
        raise ValueError(
            f"variable-size serving needs a model whose position embedding is resampled for other image sizes "
            f"(ViTConfig.dynamic_img_size=True); this model takes {h}x{w} images only: serve it without "
            "--variable-size (clients resize to that size), or serve a checkpoint whose config has "
            "dynamic_img_size=True"
        )
    side = VARIABLE_MAX_SIDE if max_side is None else max_side
    p = cfg.patch_size
    ceiling = CEILINGS["img_size"][0]
    if isinstance(side, bool) or not isinstance(side, int) or not p <= side <= ceiling:
        raise ValueError(f"max image size must be an int from the patch size ({p}) to {ceiling} pixels, got {side!r}")
    # the rules a packed forward applies (and blocks it can run), on one image of the model's own size
    check_images(model, [torch.zeros(cfg.in_chans, h, w, dtype=model.dtype, device=model.device)])
    if model.device.type == "cpu":
        largest = side - side % p
        check_batch_fits(
            cfg,
            1,
            largest,
            largest,
            element_size,
            f"variable-size serving up to {side} px a side",
            "serve with a smaller --max-image-size",
        )
    return side


def request_problem(model: VisionTransformer, images: Any, input_name: str, max_side: int) -> str | None:
    """Why the model cannot take ``images`` (one request's array, which must be an image batch ``[B >= 1, C, H, W]``:
    its channels, each side a multiple of the patch size from one patch to ``max_side`` pixels), naming its shape and
    the fix; None when it can. Runs before any work; Triton has checked the channels and the dtype against the config
    already (this guards the model should that change)."""
    cfg = model.cfg
    p = cfg.patch_size
    shape = tuple(getattr(images, "shape", ()))
    where = f"{input_name} {list(shape)}"
    if len(shape) != 4:
        return f"{where}: {input_name} must be [B, C, H, W] (B images of one size, B >= 1)"
    b, c, h, w = shape
    if b < 1:
        return f"{where}: no image; send [1, {cfg.in_chans}, H, W]"
    if c != cfg.in_chans:
        return f"{where}: the model takes {cfg.in_chans} channels in dim 1 of [B, C, H, W]"
    if h < p or w < p:
        return f"{where}: {h}x{w} is smaller than one {p}x{p} patch; resize it to at least {p}x{p}"
    if h > max_side or w > max_side:
        return (
            f"{where}: {h}x{w} is larger than this server's {max_side} px a side (--max-image-size); "
            f"resize it to at most {max_side - max_side % p} px a side (a multiple of {p})"
        )
    if h % p or w % p:
        return (
            f"{where}: {h}x{w} is not a multiple of the {p}-px patch; resize or crop it to "
            f"{max(p, h - h % p)}x{max(p, w - w % p)} (or pad it up to the next multiple of {p})"
        )
    return None


def forward_requests(model: VisionTransformer, arrays: Sequence[Any], counts: Sequence[int]) -> list[Any]:
    """The rows of one packed forward of every image of ``arrays`` (each passed :func:`request_problem`; ``counts``:
    their image counts), split back per request: ``[B_r, num_classes]`` (or ``[B_r, D]``) numpy arrays, in order."""
    import numpy as np

    images: list[torch.Tensor] = []
    for array in arrays:
        # PyTriton's arrays are read-only views of its message or shared memory, which torch warns about
        array = np.ascontiguousarray(array) if array.flags.writeable else np.array(array)
        x = torch.from_numpy(array).to(model.device, model.dtype)
        images.extend(x.unbind(0))
    with torch.inference_mode():
        rows = model.forward_packed(images).cpu().numpy()
    out, start = [], 0
    for count in counts:
        out.append(rows[start : start + count])
        start += count
    return out


__all__ = ["VARIABLE_MAX_SIDE", "check_variable_size", "forward_requests", "request_problem"]
