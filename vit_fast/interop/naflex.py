"""Native resolution: padded batches of images of different sizes (timm's ``NaFlexVit``, SigLIP 2) on our kernels.

:func:`key_padding_lengths` reads a key-padding mask as per-sample lengths (None for any other mask: the layer keeps
its own forward), :func:`naflex_refusal` names what is refused, :func:`pack_images` packs images as NaFlexVit takes
them. What is patched and refused: docs/usage.md, "Native resolution: NaFlexVit and SigLIP 2"."""

from __future__ import annotations

import threading
import weakref

import torch
from torch import nn

#: timm model class -> why its blocks are read here (the list :mod:`vit_fast.interop.timm_reading` accepts it from)
MODEL_CLASSES = ("NaFlexVit",)


def naflex_refusal(model: nn.Module) -> str | None:
    """Why ``apply_vit_fast`` refuses this timm ``NaFlexVit`` as a whole (rotary position embeddings); None when its
    blocks are read like a ``VisionTransformer``'s."""
    rope = getattr(model, "rope", None)
    if rope is not None:
        return (
            f"timm NaFlexVit uses rotary position embeddings (RoPE, {type(rope).__name__}) inside attention, which "
            "vit-fast's kernels do not run"
        )
    return None


_CACHE = threading.local()  # .last: (weakref to a mask, its version, batch, tokens, lengths or None)


def key_padding_lengths(mask: torch.Tensor, batch: int, tokens: int) -> torch.Tensor | None:
    """``lengths [B]`` (int32, on the mask's device) when ``mask`` is key padding of a prefix of each row (sample b's
    keys ``[0, lengths[b])`` valid, the rest padding, and every valid query sees exactly those); None otherwise (the
    caller runs the layer's own forward). Reads ``[B, T]`` key masks and ``[B, 1, Tq, T]`` boolean or additive ones; a
    sample with no valid token is refused. Which masks, and when the answer is reused: see docs/development.md, section
    "Key-padding masks (`naflex.py`)"."""
    if torch.compiler.is_compiling() or not isinstance(mask, torch.Tensor) or mask.is_inference():
        return _read_lengths(mask, batch, tokens)  # traced: no cache (its weak reference and versions are not)
    last = getattr(_CACHE, "last", None)
    if last is not None and last[0]() is mask and last[1:4] == (mask._version, batch, tokens):
        return last[4]
    lengths = _read_lengths(mask, batch, tokens)
    _CACHE.last = (weakref.ref(mask), mask._version, batch, tokens, lengths)
    return lengths


def _attend(mask: torch.Tensor) -> torch.Tensor | None:
    """``mask`` as booleans (True: attend), or None when its values are not those of a padding mask."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point():
        attend = mask == 0
        masked = mask <= torch.finfo(mask.dtype).min / 2  # -inf too
        return attend if bool((attend | masked).all()) else None
    attend = mask == 1  # an integer 0/1 key mask
    return attend if bool((attend | (mask == 0)).all()) else None


def _read_lengths(mask: torch.Tensor, batch: int, tokens: int) -> torch.Tensor | None:
    if torch.compiler.is_exporting() or not isinstance(mask, torch.Tensor):
        return None  # a data-dependent answer; an exported graph keeps the layer's own forward
    square = mask.ndim == 4 and mask.shape[1] == 1 and mask.shape[2] in (1, tokens)
    if tuple(mask.shape[:1]) != (batch,) or mask.shape[-1] != tokens or not (mask.ndim == 2 or square):
        return None
    if torch.compiler.is_compiling():
        return _traced_lengths(mask, tokens)
    attend = _attend(mask)
    if attend is None:
        return None
    keys = attend if mask.ndim == 2 else attend[:, 0, 0]  # [B, T]: the first query's keys (a valid query)
    lengths = keys.sum(-1, dtype=torch.int32)
    prefix = torch.arange(tokens, device=mask.device) < lengths[:, None]  # [B, T]
    if not bool(lengths.min() > 0) or not torch.equal(keys, prefix):
        return None
    if mask.ndim == 4:
        key_only = prefix[:, None, None, :]
        padding_query = ~prefix[:, None, :, None] if mask.shape[2] == tokens else torch.zeros_like(key_only)
        if not bool(((attend == key_only) | (padding_query & ~attend)).all()):
            return None
    return lengths


def _traced_lengths(mask: torch.Tensor, tokens: int) -> torch.Tensor:
    """:func:`_read_lengths` as torch.compile traces it: the same lengths, read in the graph, and the same checks as
    one assertion in the graph (``torch._assert_async``) instead of a branch on the data, which a graph cannot take:
    a mask other than key padding of a prefix of each row raises at run time instead of running the layer's own
    forward."""
    if mask.dtype == torch.bool:
        attend, values_ok = mask, torch.ones((), dtype=torch.bool, device=mask.device)
    elif mask.is_floating_point():
        attend = mask == 0
        values_ok = (attend | (mask <= torch.finfo(mask.dtype).min / 2)).all()
    else:
        attend = mask == 1
        values_ok = (attend | (mask == 0)).all()
    keys = attend if mask.ndim == 2 else attend[:, 0, 0]
    lengths = keys.sum(-1, dtype=torch.int32)
    prefix = torch.arange(tokens, device=mask.device) < lengths[:, None]
    ok = values_ok & (lengths.min() > 0) & (keys == prefix).all()
    if mask.ndim == 4:
        key_only = prefix[:, None, None, :]
        padding_query = ~prefix[:, None, :, None] if mask.shape[2] == tokens else torch.zeros_like(key_only)
        ok = ok & ((attend == key_only) | (padding_query & ~attend)).all()
    torch._assert_async(
        ok,
        "vit-fast: under torch.compile a patched layer reads its attention mask as key padding of a prefix of each "
        "row (SigLIP 2's and NaFlexVit's padding); this mask is not: run this model with remove_vit_fast(model)",
    )
    return lengths


def pack_images(images: list[torch.Tensor], patch_size: int) -> dict[str, torch.Tensor]:
    """Images ``[C, H, W]`` of any sizes as timm's NaFlex loader hands them to a ``NaFlexVit``: each image's patches
    (zero-padded to whole patches; timm's ``patchify_image``, imported here) packed row-major, then zeros at the end
    up to the longest image: ``patches [B, T, p * p * C]`` in the images' dtype (timm's collator would make them
    float32), ``patch_coord [B, T, 2]`` (row, column), ``patch_valid [B, T]``. Call the model as ``model(patches,
    patch_coord=..., patch_valid=...)``, or with this dict."""
    from timm.data.naflex_transforms import patchify_image

    packed = [patchify_image(image, (patch_size, patch_size)) for image in images]
    longest = max(patches.shape[0] for patches, _, _ in packed)
    first = packed[0][0]
    patches = first.new_zeros(len(images), longest, first.shape[1])
    coord = torch.zeros(len(images), longest, 2, dtype=torch.int64)
    valid = torch.zeros(len(images), longest, dtype=torch.bool)
    for i, (p, c, v) in enumerate(packed):
        patches[i, : len(p)], coord[i, : len(p)], valid[i, : len(p)] = p, c, v
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}
