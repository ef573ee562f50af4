"""Images of different sizes in one forward: each image patch-embedded at its own grid, all tokens packed into one
sequence ``[1, S, D]`` with ``cu_seqlens``, then the model's stages (:mod:`vit_fast.model.stages`) with attention
kept within each image (:class:`PackedOps`), pooling per image. Behind
:meth:`vit_fast.model.vit.VisionTransformer.forward_packed`; see docs/usage.md, "Images of different sizes in one
call".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vit_fast.backend.ops import AttentionMasks, ForwardingOps, Ops
from vit_fast.model import stages
from vit_fast.model.layers import Attention, Block, Mlp, TorchOps, skip_identity
from vit_fast.model.validation import check_model_input, finite_check, finite_check_from_env, require_finite


@dataclass(frozen=True)
class PackedLayout:
    """Where each image's tokens lie in the packed sequence. Images are packed grouped by size, each group in the
    order its first image comes; ``spans[i]`` is image ``i``'s ``(start, end)`` in the sequence (the images' own
    order)."""

    groups: tuple[tuple[tuple[int, ...], tuple[int, int]], ...]  # (image indices, patch grid) per size, packed order
    spans: tuple[tuple[int, int], ...]  # per image, in the images' order: its tokens [start, end) of the sequence
    cu_seqlens: tuple[int, ...]  # [N + 1] segment offsets in packed order (cu_seqlens[0] = 0, cu_seqlens[N] = S)

    @property
    def total_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def max_seqlen(self) -> int:
        return max(end - start for start, end in self.spans)

    def runs(self) -> Iterator[tuple[int, int, int]]:
        """``(start, images, tokens per image)`` for each size group: consecutive segments of one length."""
        start = 0
        for indices, _ in self.groups:
            length = self.spans[indices[0]][1] - self.spans[indices[0]][0]
            yield start, len(indices), length
            start += len(indices) * length


def check_images(model: nn.Module, images: Sequence[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """Raise a TypeError or ValueError that names what is wrong with ``images`` and how to fix it; return each
    image's patch grid. Runs before any compute. The rules per image are those of an ordinary forward
    (:func:`vit_fast.model.validation.check_image_batch`): channels, a multiple of the patch size (any such size when
    the model has ``dynamic_img_size``, else its own), the weights' dtype (or uint8 with input normalisation) and
    device."""
    if isinstance(images, torch.Tensor) or not isinstance(images, (list, tuple)):
        raise TypeError(
            f"a packed forward takes a list of images [C, H, W] (each its own size), got {type(images).__name__}; "
            "a batch tensor [B, C, H, W] of one size goes to model(x)"
        )
    if not images:
        raise ValueError("empty list of images: pass at least one image [C, H, W]")
    for i, image in enumerate(images):
        if not isinstance(image, torch.Tensor):
            raise TypeError(
                f"expected a torch.Tensor image [C, H, W] as images[{i}], got {type(image).__name__}: pass a "
                "torch.Tensor image batch [B, C, H, W], or a list of torch.Tensor images [C, H, W] of any sizes (a "
                "list or tuple given to the model runs as one packed forward)"
            )
        if image.dim() != 3:
            hint = ""
            if image.dim() == 4 and image.shape[0] == 1:
                hint = f" Drop its batch dimension: images[{i}][0]."
            elif image.dim() == 4:
                hint = " Split a batch into images with list(x), or call model(x) on it."
            elif image.dim() == 2:
                hint = f" Add a channel dimension: images[{i}][None] (or repeat it to the model's channels)."
            raise ValueError(f"images[{i}] has shape {tuple(image.shape)}; each image must be [C, H, W].{hint}")
    first = images[0]
    for i, image in enumerate(images):
        if image.dtype != first.dtype or image.device != first.device:
            raise ValueError(
                f"images[0] is {first.dtype} on {first.device} but images[{i}] is {image.dtype} on {image.device}: "
                f"one packed forward takes images of one dtype on one device (the weights' {model.dtype} on "
                f"{model.device}): convert them with image.to(...)"
            )
    cfg = model.cfg
    p = cfg.patch_size
    grids = []
    for i, image in enumerate(images):
        C, H, W = image.shape
        if C != cfg.in_chans:
            hint = (
                f" It looks like channels-last (HWC): pass images[{i}].permute(2, 0, 1)." if W == cfg.in_chans else ""
            )
            raise ValueError(
                f"images[{i}] has {C} channels in dim 0 of [C, H, W] (shape {tuple(image.shape)}), the "
                f"model takes {cfg.in_chans}.{hint}"
            )
        if H < p or W < p:
            raise ValueError(
                f"images[{i}] is {H}x{W}, smaller than one {p}x{p} patch: resize it to at least {p}x{p} (a multiple "
                f"of {p} on each side)"
            )
        try:
            grids.append(check_model_input(model, image[None]))
        except ValueError as error:
            raise ValueError(f"images[{i}] ({H}x{W}): {error}") from None
    for block in model.blocks:
        attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
        if not isinstance(block, Block) or not isinstance(attn, Attention) or not isinstance(mlp, Mlp):
            raise TypeError(
                f"a packed forward runs vit_fast.model.layers.Block with its Attention and Mlp, got "
                f"{type(block).__name__} ({type(attn).__name__} attention, {type(mlp).__name__} MLP): run each "
                "image with model(image[None])"
            )
    return tuple(grids)


def layout_of(model: nn.Module, images: Sequence[torch.Tensor], grids: Sequence[tuple[int, int]]) -> PackedLayout:
    """The packed layout of ``images`` (checked, with their ``grids``): grouped by size, each size group's images in
    their order."""
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, image in enumerate(images):
        by_size.setdefault(tuple(image.shape[1:]), []).append(i)
    prefix = model.num_prefix_tokens
    groups, spans, offsets = [], [None] * len(images), [0]
    for indices in by_size.values():
        grid = grids[indices[0]]
        length = prefix + grid[0] * grid[1]
        for i in indices:
            spans[i] = (offsets[-1], offsets[-1] + length)
            offsets.append(offsets[-1] + length)
        groups.append((tuple(indices), tuple(grid)))
    return PackedLayout(groups=tuple(groups), spans=tuple(spans), cu_seqlens=tuple(offsets))


# --------------------------------------------------------------------------- torch backend
def attention_packed(qkv: torch.Tensor, num_heads: int, scale: float, layout: PackedLayout) -> torch.Tensor:
    """Packed self-attention, ``qkv [1, S, 3 * H * Dh]`` -> ``[1, S, H * Dh]``, each image attending within its own
    tokens: one ``scaled_dot_product_attention`` per size group (its images side by side as a batch)."""
    width = qkv.shape[-1]
    head_dim = width // (3 * num_heads)
    out = []
    for start, count, length in layout.runs():
        rows = qkv[0, start : start + count * length].reshape(count, length, 3, num_heads, head_dim)
        q, k, v = rows.permute(2, 0, 3, 1, 4).unbind(0)  # [count, H, length, Dh]
        o = F.scaled_dot_product_attention(q, k, v, scale=scale)
        out.append(o.transpose(1, 2).reshape(count * length, num_heads * head_dim))
    return torch.cat(out)[None]


class PackedOps(ForwardingOps):
    """``ops`` (the torch backend's or the kernels') whose attention keeps each image of a packed sequence to its own
    tokens: :func:`attention_packed` on the torch ops, the attention kernel's ``cu_seqlens`` path on the kernels.
    Every other op is ``ops``' own."""

    def __init__(self, ops: Ops, layout: PackedLayout, device: torch.device) -> None:
        super().__init__(ops)
        self.layout, self.on_torch = layout, isinstance(ops, TorchOps)
        self.cu_seqlens = None if self.on_torch else torch.tensor(layout.cu_seqlens, dtype=torch.int32, device=device)

    def attend(self, qkv, num_heads: int, scale: float, masks: AttentionMasks) -> torch.Tensor:
        if any(value is not None for value in masks[:4]) or masks.first_token:
            raise TypeError("a packed sequence's attention takes its segments from the layout, no other mask or RoPE")
        if self.on_torch:
            return attention_packed(qkv, num_heads, scale, self.layout)
        packed = AttentionMasks(cu_seqlens=self.cu_seqlens, max_seqlen=self.layout.max_seqlen)
        return self.ops.attend(qkv, num_heads, scale, packed)

    def diff_attention(self, qkv, lambda_full, norm_weight, num_heads: int, lambda_init, scale, eps) -> torch.Tensor:
        raise TypeError("differential attention takes no packed sequences")


def _run_stages(
    plan: stages.ForwardPlan,
    model: nn.Module,
    images: Sequence[torch.Tensor],
    layout: PackedLayout,
    on_stage: stages.OnStage,
) -> torch.Tensor:
    """The model's stages (:mod:`vit_fast.model.stages`) on the packed sequence as ``plan`` says (its ops carry the
    layout: :class:`PackedOps`): each size group embedded at its own grid, then every block and the final norm on
    ``[1, S, D]``."""
    first = images[0]
    if plan.check_params:
        stages.check_parameters(model, first)
    parts = []
    for indices, grid in layout.groups:
        tokens = stages.embed(plan, model, torch.stack([images[i] for i in indices]), grid)  # [count, T, D]
        parts.append(tokens.reshape(1, -1, tokens.shape[-1]))
    x = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    if on_stage is not None:
        on_stage("patch embedding", x)
    x = stages.final_norm(plan, model, stages.run_blocks(plan, model, x, on_stage))
    if plan.done is not None:
        plan.done(model, first)
    if on_stage is not None:
        on_stage("final norm", x)
    return x


# --------------------------------------------------------------------------- the model's packed forward
def _packed_tokens(
    model: nn.Module, images: Sequence[torch.Tensor], plan: stages.ForwardPlan, layout: PackedLayout
) -> torch.Tensor:
    """Tokens ``[S, D]`` after the final norm, of ``images`` (checked) laid out as ``layout``."""
    on_stage = None
    if model.check_finite or finite_check_from_env():
        for i, image in enumerate(images):
            require_finite(f"input (images[{i}])", image, None)
        on_stage = finite_check()
    with stages.tuned(plan.tune):
        return _run_stages(plan, model, images, layout, on_stage)[0]


def packed_features(
    model: nn.Module, images: Sequence[torch.Tensor], plan: stages.ForwardPlan, layout: PackedLayout
) -> list[torch.Tensor]:
    """Each image's tokens ``[T_i, D]`` after the final norm (views into one packed tensor), in the images' order:
    ``images`` checked, run as ``plan`` says, laid out as ``layout`` (what the model resolved for them)."""
    tokens = _packed_tokens(model, images, plan, layout)
    return [tokens[start:end] for start, end in layout.spans]


def pool_packed(model: nn.Module, features: Sequence[torch.Tensor]) -> torch.Tensor:
    """Pooled features ``[N, D]`` of each image's tokens ``[T_i, D]``, as ``forward_head`` pools one image: the class
    token, or the average of the patch tokens (``global_pool="avg"``)."""
    if model.cfg.global_pool == "avg":
        prefix = model.num_prefix_tokens
        return torch.stack([tokens[prefix:].mean(dim=0) for tokens in features])
    return torch.stack([tokens[0] for tokens in features])


def packed_forward(
    model: nn.Module,
    images: Sequence[torch.Tensor],
    plan: stages.ForwardPlan,
    layout: PackedLayout,
    pre_logits: bool = False,
) -> torch.Tensor:
    """Logits ``[N, num_classes]`` (pooled features ``[N, D]`` with ``pre_logits`` or ``num_classes == 0``) of
    ``images``, one row per image in their order (``plan``, ``layout``: as for :func:`packed_features`)."""
    x = skip_identity(model.fc_norm, pool_packed(model, packed_features(model, images, plan, layout)))
    out = x if pre_logits else model.head(x)
    if model.check_finite or finite_check_from_env():
        require_finite("head", out, "final norm")
    return out


__all__ = ["PackedLayout", "PackedOps", "check_images", "layout_of", "packed_features", "packed_forward", "pool_packed"]
