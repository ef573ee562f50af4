"""Rotary position embeddings (RoPE) for the attention kernel: the ``@triton.jit`` rotation it applies to q and k as it
loads them (:func:`rope_rotate`), the tables' checks (:func:`check_rope`), timm's sin|cos table read as two views
(:func:`split_sin_cos`) and the eager reference (:func:`apply_rope_ref`). Layouts and tables: docs/kernels.md, section
"RoPE"."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._tl import to_bf16_rtne

#: the pair layouts, by the name the attention op takes, and the ``ROPE`` constexpr of the kernel (0: no RoPE)
LAYOUTS = {"interleaved": 1, "half": 2}


@triton.jit
def rope_rotate(
    x,  # [BLOCK_M, BLOCK_D] the tile as loaded (q or k), zero in masked lanes
    x_ptrs,  # [BLOCK_M, BLOCK_D] pointers the tile was loaded from, column d at offs_d
    rows,  # [BLOCK_M] each row's place in its sequence (image or packed segment)
    row_mask,  # [BLOCK_M] rows that were loaded
    offs_d,  # [BLOCK_D] head-dim lanes
    d_mask,  # [BLOCK_D] lanes < HEAD_DIM
    cos_ptr,  # this head's cos table [T_rot, Dh] (row stride stride_rope_t, unit stride along Dh)
    sin_ptr,  # this head's sin table, same strides
    stride_rope_t,  # elements between table rows
    num_prefix,  # rows before the first rotated one (class and register tokens): left as they are
    num_rot,  # table rows: rows num_prefix .. num_prefix + num_rot - 1 are rotated
    HEAD_DIM,  # Dh (even)
    ROPE: tl.constexpr,  # 1: interleaved pairs (timm's rot), 2: halves (rope_rotate_half)
    ROUND_BF16: tl.constexpr,  # round to bf16 by hand (the interpreter's cast truncates)
):
    """``x * cos + rotate(x) * sin`` in fp32 (rows outside the table: ``x``), rounded to x's dtype as eager rounds it;
    ``rotate(x)`` is read from the same rows at the partner lanes (cache hits, no second pass over q/k in HBM)."""
    if ROPE == 1:  # rot(x) = [-x1, x0, -x3, x2, ...]
        partner = offs_d ^ 1
        sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
    else:  # rotate_half(x) = [-x[h:], x[:h]]
        half = HEAD_DIM // 2
        partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
        sign = tl.where(offs_d < half, -1.0, 1.0)
    mask = row_mask[:, None] & d_mask[None, :]
    x_partner = tl.load(x_ptrs + (partner - offs_d)[None, :], mask=mask, other=0.0).to(tl.float32)
    pos = rows - num_prefix
    rotated = row_mask & (pos >= 0) & (pos < num_rot)
    table_mask = rotated[:, None] & d_mask[None, :]
    table = pos[:, None] * stride_rope_t + offs_d[None, :]
    cos = tl.load(cos_ptr + table, mask=table_mask, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + table, mask=table_mask, other=0.0).to(tl.float32)
    out = x.to(tl.float32) * cos + x_partner * sign[None, :] * sin
    return to_bf16_rtne(out) if ROUND_BF16 else out.to(x.dtype)


# ---------------------------------------------------------------------------------- host side
def split_sin_cos(embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's rotary table ``[..., T_rot, 2 * Dh]`` (sin then cos, as ``apply_rot_embed_cat`` reads it) as ``(cos,
    sin)``, two views of it: nothing copied, the kernel reads them by strides."""
    sin, cos = embed.chunk(2, dim=-1)
    return cos, sin


def check_rope(
    qkv: torch.Tensor,
    num_heads: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    num_prefix: int,
    layout: str,
) -> None:
    """Raise, before any launch, unless ``cos`` / ``sin`` are tables the attention kernel reads for this ``qkv``:
    both or neither; ``[T_rot, Dh]`` or ``[H, T_rot, Dh]``, the same strides, unit stride along Dh, on qkv's device;
    Dh even; ``num_prefix`` in 0..T and ``T_rot >= T - num_prefix``; ``layout`` one of :data:`LAYOUTS`."""
    if cos is None and sin is None:
        return
    if cos is None or sin is None:
        raise ValueError("attention: pass both rope_cos and rope_sin (the rotary tables), or neither")
    if layout not in LAYOUTS:
        raise ValueError(f"attention: rope_layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
    batch, tokens, width = qkv.shape
    head_dim = width // (3 * num_heads)
    if head_dim % 2:
        raise ValueError(f"attention: rotary embeddings rotate pairs of lanes; head_dim {head_dim} is odd")
    for name, table in (("rope_cos", cos), ("rope_sin", sin)):
        if not isinstance(table, torch.Tensor) or not table.is_floating_point():
            raise ValueError(f"attention: {name} must be a floating-point torch.Tensor, got {type(table).__name__}")
        if table.dim() not in (2, 3) or table.shape[-1] != head_dim:
            raise ValueError(
                f"attention: {name} must be [T_rot, {head_dim}] or [{num_heads}, T_rot, {head_dim}] (head_dim "
                f"{head_dim}), got {tuple(table.shape)}"
            )
        if table.dim() == 3 and table.shape[0] != num_heads:
            raise ValueError(f"attention: {name} has {table.shape[0]} per-head tables for num_heads={num_heads}")
        if table.stride(-1) != 1:
            raise ValueError(f"attention: {name} must have a unit stride along head_dim; pass {name}.contiguous()")
        if table.device != qkv.device:
            raise ValueError(f"attention: {name} is on {table.device} but qkv on {qkv.device}; move it there")
    if cos.shape != sin.shape or cos.stride() != sin.stride():
        raise ValueError(
            f"attention: rope_cos {tuple(cos.shape)} stride {cos.stride()} and rope_sin {tuple(sin.shape)} stride "
            f"{sin.stride()} must match (e.g. both halves of one timm table, split_sin_cos)"
        )
    if isinstance(num_prefix, bool) or not isinstance(num_prefix, int) or not 0 <= num_prefix <= tokens:
        raise ValueError(f"attention: num_prefix must be an int in 0..T = 0..{tokens}, got {num_prefix!r}")
    if cos.shape[-2] < tokens - num_prefix:
        raise ValueError(
            f"attention: the rotary tables have {cos.shape[-2]} rows, fewer than the T - num_prefix = {tokens} - "
            f"{num_prefix} tokens to rotate; build them for this grid"
        )


def sequence_positions(
    batch: int, tokens: int, lengths: torch.Tensor | None, cu_seqlens: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """``[B, T]`` int64: each token's place in its own sequence (image, or packed segment); -1 for padding."""
    place = torch.arange(tokens, device=device).expand(batch, tokens)
    if cu_seqlens is None:
        return place if lengths is None else torch.where(place < lengths.to(device)[:, None], place, -1)
    flat = torch.arange(batch * tokens, device=device)
    offsets = cu_seqlens.to(device, torch.int64)
    segment = torch.searchsorted(offsets[1:], flat, right=True).clamp(max=offsets.shape[0] - 2)
    return torch.where(flat < offsets[-1], flat - offsets[segment], -1).view(batch, tokens)


def rotate_ref(x: torch.Tensor, layout: str) -> torch.Tensor:
    """timm's ``rot`` (``"interleaved"``) or ``rope_rotate_half`` (``"half"``) over the last dim."""
    if layout == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)


def apply_rope_ref(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, num_prefix: int, layout: str
) -> torch.Tensor:
    """Eager RoPE as timm's ``apply_rot_embed_cat`` computes it (tables' dtype promotion, then cast to x's dtype):
    ``x [B, H, T, Dh]``; ``positions [B, T]`` each token's place in its sequence (-1: padding, left as it is); rows
    ``num_prefix`` on take table row ``position - num_prefix`` of ``cos`` / ``sin`` (``[T_rot, Dh]`` or per head)."""
    rel = positions - num_prefix
    rotated = (rel >= 0) & (rel < cos.shape[-2])
    index = rel.clamp(0, cos.shape[-2] - 1)
    if cos.dim() == 2:
        c, s = cos[index][:, None], sin[index][:, None]  # [B, 1, T, Dh]
    else:
        c, s = cos[:, index].transpose(0, 1), sin[:, index].transpose(0, 1)  # [B, H, T, Dh]
    out = (x * c + rotate_ref(x, layout) * s).to(x.dtype)
    return torch.where(rotated[:, None, :, None], out, x)


__all__ = [
    "LAYOUTS",
    "apply_rope_ref",
    "check_rope",
    "rope_rotate",
    "rotate_ref",
    "sequence_positions",
    "split_sin_cos",
]
