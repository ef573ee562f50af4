"""Native-resolution towers for ONNX export: timm's ``NaFlexVit`` and transformers' ``Siglip2VisionModel``, each image
at its own size as patches packed per image (vit_fast.interop.naflex), graphs dynamic in batch and token count.
timm's per-image position-embedding resize is replaced in the exported copy by :class:`ResizeTable`; what stops each
from tracing, and what is refused by name: docs/development.md, "Native-resolution towers"."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: the graphs' input names, in order, per family
INPUTS = {
    "naflexvit": ("patches", "patch_coord", "patch_valid"),
    "siglip2": ("pixel_values", "pixel_attention_mask", "spatial_shapes"),
}
#: the outputs each family's graph can return
NATIVE_OUTPUTS = ("logits", "pooled", "last_hidden_state")
#: the largest image side, in patches, an exported NaFlexVit takes by default (its resize table's size), unless its
#: position table is larger (RADIO's 128): then the table's own side
DEFAULT_MAX_GRID = 64
#: the default mixes' large image exceeds the position table by a few patches where the table is at most this side
LARGE_BEYOND = 24


def native_family(model: Any) -> str | None:
    """``"naflexvit"`` for timm's ``NaFlexVit``, ``"siglip2"`` for transformers' ``Siglip2VisionModel``, else None."""
    name = type(model).__name__
    if name == "NaFlexVit" and type(model).__module__.startswith("timm."):
        return "naflexvit"
    if name == "Siglip2VisionModel" and type(model).__module__.startswith("transformers."):
        return "siglip2"
    return None


def native_refusal(model: nn.Module, exporter: str) -> str | None:
    """Why this native-resolution model cannot be exported dynamically (by name, with what to do instead), or None."""
    family = native_family(model)
    what = type(model).__name__
    if exporter == "torchscript" and family == "siglip2":
        return (
            f"{what} on the TorchScript exporter: its tracer keeps the example batch's sizes as constants in the "
            "attention-pool head's reshape (nn.MultiheadAttention), so ONNX Runtime refuses the graph at any other "
            "size mix: use exporter='dynamo' (the default)"
        )
    if family != "naflexvit":
        return None
    from vit_fast.interop.naflex import naflex_refusal

    rope = naflex_refusal(model)
    if rope is not None:
        return f"{rope}; its RoPE tables are built per image at sizes read with .item(), which does not trace"
    embeds = model.embeds
    if embeds.pos_embed_type == "factorized":
        return (
            "timm NaFlexVit with factorized position embeddings (pos_embed_type='factorized'): its per-image 1-D "
            "resizes at sizes read with .item() do not trace, and vit-fast rewrites only the learned 2-D table; "
            "export a NaFlexVit with a learned position embedding"
        )
    if embeds.pos_embed_type not in ("learned", "none"):
        return f"timm NaFlexVit with pos_embed_type={embeds.pos_embed_type!r} is not one vit-fast exports"
    if not embeds.is_linear:
        return (
            "timm NaFlexVit with a convolutional patch embedding takes images, not packed patches: export it with "
            "vit_fast.optimize(model) and the plain exporter"
        )
    if getattr(embeds, "enable_patch_interpolator", False):
        return "timm NaFlexVit with a patch-size interpolator (enable_patch_interpolator=True) is not exported"
    return None


def _axis_weights(length: int, sizes: int, mode: str, align_corners: bool | None, antialias: bool) -> torch.Tensor:
    """``[sizes + 1, sizes, length]`` float32: entry ``[s, i]`` weighs the ``length`` table rows into row ``i`` of
    a resize to ``s`` rows (zeros past ``s``; ``s = 0`` unused), as timm's ``F.interpolate`` computes it: one-hot
    rows in, one image each, resized along the width with the height kept at 1 (every mode copies an axis it keeps).
    One image per row, not one channel per row: a ``[1, L, L, 1]`` basis has ambiguous strides, and the antialiased
    kernels then take a channels-last path that mixes the channels."""
    basis = torch.eye(length, dtype=torch.float32)[:, None, None, :].contiguous()  # [length, 1, 1, length]
    table = torch.zeros(sizes + 1, sizes, length, dtype=torch.float32)
    for s in range(1, sizes + 1):
        if s == length:  # timm uses the table as it is at its own size
            table[s, :s] = torch.eye(length)
            continue
        resized = F.interpolate(basis, size=(1, s), mode=mode, align_corners=align_corners, antialias=antialias)
        table[s, :s] = resized[:, 0, 0, :].T  # [s, length]
    return table


class ResizeTable(nn.Module):
    """Traceable stand-in for timm's ``NaFlexEmbeds._apply_learned_naflex_pos_embed``: adds to ``x [B, T, D]``
    (in place, as timm does) each image's learned position table resized to its grid, token ``t`` of an image of
    ``h x w`` patches taking row ``t // w``, column ``t % w`` and tokens from ``h * w`` on nothing; the grid is
    read from ``patch_coord`` (its maximum plus one, padding included, as timm reads it). Sides up to
    ``max_grid`` patches (an image beyond reads past the weights table: ONNX Runtime refuses the gather)."""

    def __init__(self, embeds: nn.Module, max_grid: int) -> None:
        super().__init__()
        self.pos_embed = embeds.pos_embed  # [1, Gh, Gw, D]
        self.ar_preserving = bool(embeds.pos_embed_ar_preserving)
        _, gh, gw, _ = embeds.pos_embed.shape
        mode, corners, aa = embeds.pos_embed_interp_mode, embeds.pos_embed_align_corners, embeds.pos_embed_antialias
        corners = corners if mode in ("linear", "bilinear", "bicubic", "trilinear") else None
        self.register_buffer("rows", _axis_weights(gh, max_grid, mode, corners, aa), persistent=False)
        self.register_buffer("cols", _axis_weights(gw, max_grid, mode, corners, aa), persistent=False)

    def forward(self, x: torch.Tensor, patch_coord: torch.Tensor) -> None:
        B, T, _ = x.shape
        grid = patch_coord.amax(dim=1) + 1  # [B, 2]: rows, columns
        h, w = grid[:, 0], grid[:, 1]
        th, tw = (grid.amax(-1), grid.amax(-1)) if self.ar_preserving else (h, w)  # the size resized to
        table = self.pos_embed[0].float()  # [Gh, Gw, D]
        # columns first, then rows, as PyTorch's separable resize runs: [B, S, Gw] x [Gh, Gw, D] -> [B, Gh, S, D]
        across = torch.einsum("bsj,ijd->bisd", self.cols[tw], table)
        resized = torch.einsum("bri,bisd->brsd", self.rows[th], across)  # [B, S, S, D]
        t = torch.arange(T, device=x.device)[None, :]
        row, col = t // w[:, None], t % w[:, None]  # [B, T]
        inside = t < (h * w)[:, None]
        row, col = row.clamp(max=resized.shape[1] - 1), col.clamp(max=resized.shape[2] - 1)
        pos = resized[torch.arange(B, device=x.device)[:, None], row, col]  # [B, T, D]
        x.add_((pos * inside[..., None]).to(x.dtype))


class NativeGraph(nn.Module):
    """What an exported native-resolution graph computes: the model's outputs asked for, in order, from its three
    inputs (:data:`INPUTS`). ``logits`` (timm, with a head), ``pooled`` (timm: before the head; SigLIP 2: its
    ``pooler_output``), ``last_hidden_state`` (every token after the final norm: timm's prefix tokens first, then
    the patches; padding positions hold whatever the model leaves there)."""

    def __init__(self, model: nn.Module, outputs: Sequence[str]) -> None:
        super().__init__()
        self.model, self.outputs = model, tuple(outputs)
        self.family = native_family(model)
        self.eval()

    def forward(self, values: torch.Tensor, where: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
        got: dict[str, torch.Tensor] = {}
        if self.family == "naflexvit":
            feats = self.model.forward_features(values, patch_coord=where, patch_valid=valid)["patches"]
            got["last_hidden_state"] = feats
            if "pooled" in self.outputs or "logits" in self.outputs:
                pooled = self.model.forward_head(feats, pre_logits=True, patch_valid=valid)
                got["pooled"] = pooled
                got["logits"] = self.model.head(pooled)
        else:  # SigLIP 2: (pixel_values, pixel_attention_mask, spatial_shapes)
            out = self.model(pixel_values=values, pixel_attention_mask=where, spatial_shapes=valid)
            got["last_hidden_state"], got["pooled"] = out.last_hidden_state, out.pooler_output
        return tuple(got[k] for k in self.outputs)

    def all_outputs(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(self.outputs, self(*inputs), strict=True))


def default_outputs(model: nn.Module) -> tuple[str, ...]:
    """timm with a head: ``logits``; timm without: ``pooled``; SigLIP 2: ``last_hidden_state`` and ``pooled``."""
    if native_family(model) == "siglip2":
        return ("last_hidden_state", "pooled")
    return ("logits",) if getattr(model, "num_classes", 0) else ("pooled",)


def check_native_outputs(model: nn.Module, outputs: Any) -> tuple[str, ...]:
    """Validate an ``outputs`` request for a native-resolution model; returns the kinds in order."""
    if outputs is None:
        return default_outputs(model)
    items = (outputs,) if isinstance(outputs, str) else tuple(outputs)
    allowed = NATIVE_OUTPUTS if native_family(model) == "naflexvit" else ("last_hidden_state", "pooled")
    if not items or len(set(items)) != len(items) or any(i not in allowed for i in items):
        raise ValueError(
            f"outputs of a {type(model).__name__} are one or more of {', '.join(allowed)}, got {outputs!r}"
        )
    if "logits" in items and not getattr(model, "num_classes", 0):
        raise ValueError("this model has no classifier head (num_classes=0), so no 'logits': ask for 'pooled'")
    return items


def plain_copy(model: nn.Module, dtype: torch.dtype, max_grid: int | None) -> nn.Module:
    """A CPU copy of ``model`` in eval mode and ``dtype`` on PyTorch's own forwards (vit-fast's patches removed);
    with ``max_grid`` (the exported copy) timm's per-image position-embedding resize is :class:`ResizeTable`."""
    from vit_fast.interop.patching import remove_vit_fast

    m = copy.deepcopy(model).cpu().to(dtype).eval()
    remove_vit_fast(m)
    for p in m.parameters():
        p.requires_grad_(False)
    if max_grid is not None and native_family(m) == "naflexvit" and m.embeds.pos_embed_type == "learned":
        embeds = m.embeds
        if not embeds.pos_embed_use_grid_sample:  # timm's grid_sample route traces as it is
            embeds.pos_resize = ResizeTable(embeds, max_grid)
            embeds.__dict__["_apply_learned_naflex_pos_embed"] = embeds.pos_resize.forward  # shadows the method
    return m


def grid_of(model: nn.Module) -> tuple[int, int]:
    """The model's learned position table, in patches (rows, columns); SigLIP 2's is square."""
    if native_family(model) == "naflexvit":
        pos = getattr(model.embeds, "pos_embed", None)
        return (int(pos.shape[1]), int(pos.shape[2])) if pos is not None else (16, 16)
    side = int(round(model.config.num_patches**0.5))
    return side, side


def patch_size(model: nn.Module) -> int:
    if native_family(model) == "naflexvit":
        return int(model.embeds.patch_size[0])
    return int(model.config.patch_size)


def max_grid_of(model: nn.Module, max_grid: int | None) -> int:
    """``max_grid`` as given, or the default: :data:`DEFAULT_MAX_GRID`, or the position table's side if larger."""
    return max(DEFAULT_MAX_GRID, *grid_of(model)) if max_grid is None else max_grid


def default_mixes(model: nn.Module) -> list[list[tuple[int, int]]]:
    """Three image-size mixes (pixels, h x w) to verify at: two shapes of one token count (no padding); three sizes
    padded to the longest, one smaller than the position table (a downsample) and, for timm, one that is not whole
    patches; and one large image, past the table (an upsample) where the table is at most :data:`LARGE_BEYOND`
    patches a side (RADIO's 128: a large downsample, at a size a CPU verifies)."""
    p = patch_size(model)
    gh, gw = (min(g, LARGE_BEYOND) for g in grid_of(model))
    odd = (5 * p // 2, 5 * p // 2) if native_family(model) == "naflexvit" else (3 * p, 3 * p)
    return [
        [(2 * p, 3 * p), (3 * p, 2 * p)],
        [(p, p), (4 * p, 3 * p), odd],
        [((gh + 2) * p, (gw + 3) * p)],
    ]


def example_batch(
    model: nn.Module, sizes: Sequence[tuple[int, int]], dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random images of ``sizes`` (pixels) as the model's three inputs (:data:`INPUTS`)."""
    p = patch_size(model)
    images = [torch.randn(3, h, w, generator=gen) for h, w in sizes]
    if native_family(model) == "naflexvit":
        from vit_fast.interop.naflex import pack_images

        packed = pack_images(images, p)
        return packed["patches"].to(dtype), packed["patch_coord"], packed["patch_valid"]
    shapes = []
    for h, w in sizes:
        if h % p or w % p:
            raise ValueError(f"SigLIP 2 takes whole patches: image size {h}x{w} is not a multiple of the patch {p}")
        shapes.append((h // p, w // p))
    tokens = max(h * w for h, w in shapes)
    values = torch.zeros(len(sizes), tokens, 3 * p * p)
    for i, (image, (h, w)) in enumerate(zip(images, shapes, strict=True)):  # as Siglip2ImageProcessor: p, p, C
        patches = image.reshape(3, h, p, w, p).permute(1, 3, 2, 4, 0).reshape(h * w, 3 * p * p)
        values[i, : h * w] = patches
    mask = (torch.arange(tokens)[None] < torch.tensor([h * w for h, w in shapes])[:, None]).long()
    return values.to(dtype), mask, torch.tensor(shapes, dtype=torch.int64)


def valid_tokens(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``[B, T_out]`` bool: the positions of ``last_hidden_state`` that hold a real token (prefix tokens and valid
    patches), the ones verification compares."""
    if native_family(model) == "naflexvit":
        valid = inputs[2].bool()
        prefix = valid.new_ones(valid.shape[0], model.num_prefix_tokens)
        return torch.cat([prefix, valid], dim=1)
    return inputs[1].bool()


@contextlib.contextmanager
def transformers_checks_off() -> Iterator[None]:
    """transformers' ``torch_compilable_check`` off for a trace (its own switch), restored after."""
    key = "TRANSFORMERS_DISABLE_TORCH_CHECK"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


__all__ = [
    "DEFAULT_MAX_GRID",
    "INPUTS",
    "NATIVE_OUTPUTS",
    "NativeGraph",
    "ResizeTable",
    "check_native_outputs",
    "default_mixes",
    "example_batch",
    "grid_of",
    "max_grid_of",
    "native_family",
    "native_refusal",
    "plain_copy",
    "transformers_checks_off",
    "valid_tokens",
]
