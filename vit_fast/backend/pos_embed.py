"""Position-embedding resampling, the one home of that decision: a leaf that the model, the
converters and the triton path all call."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int],
    num_prefix_tokens: int,
) -> torch.Tensor:
    """Resize a learned position embedding ``[1, prefix + gh*gw, D]`` to another patch grid.

    Bicubic with antialiasing in float32, as timm's ``resample_abs_pos_embed`` does; prefix rows
    (class / register tokens) are kept as they are.
    """
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim = pos_embed.shape[-1]
    grid = grid.float().reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", antialias=True, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim).to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1) if num_prefix_tokens else grid


def pos_embed_for_grid(
    pos_embed: torch.Tensor,
    grid: tuple[int, int],
    native_grid: tuple[int, int],
    num_prefix_tokens: int,
    no_embed_class: bool,
) -> torch.Tensor:
    """The position embedding a forward at patch grid ``grid`` adds: ``pos_embed`` itself at the
    native grid, else resampled; prefix rows are kept unless the model embeds no class position."""
    if tuple(grid) == tuple(native_grid):
        return pos_embed
    keep = 0 if no_embed_class else num_prefix_tokens
    return resample_pos_embed(pos_embed, grid, native_grid, keep)
