"""The patch embedding kernel's tiles: the autotune candidates, the prune and the no-autotune pick (host side,
read by the kernel in :mod:`.patch_embed`)."""

from __future__ import annotations

import triton

from vit_fast.base.cards import CPU_SM_COUNT
from vit_fast.base.interpret import interpreter_enabled

from ._launch import cdiv
from .autotune import (
    FMA_STAGES,
    SMALL_M,
    closest_config,
    gemm_prune_target,
    tuning_requested,
)


def patch_embed_configs() -> list[triton.Config]:
    """Autotune candidates, built as :func:`.linear_tiles.linear_configs` builds the GEMM's (the environment only;
    the prune keeps those for the tensors' card); the interpreter gets one."""
    if interpreter_enabled():
        # under the interpreter, few wide programs are fastest
        return [triton.Config({"BLOCK_M": 64, "BLOCK_D": 128, "BLOCK_K": 64}, num_warps=4)]
    return (
        [
            triton.Config({"BLOCK_M": bm, "BLOCK_D": bd, "BLOCK_K": bk}, num_warps=w, num_stages=s)
            for bm in (64, 128)
            for bd in (64, 128)
            for bk in (32, 64)
            for w, s in ((4, 3), (8, 3))
            if not (bm == 128 and bd == 128 and w == 4)
        ]
        + [
            # narrow tiles for one or two images (M = B * T <= 512): 64x16 gives ViT-B/16 at batch 1 192 programs
            triton.Config({"BLOCK_M": 64, "BLOCK_D": bd, "BLOCK_K": 64}, num_warps=4, num_stages=3)
            for bd in (16, 32)
        ]
        + [
            # cards without tensor cores (sm_75) get only these, as the GEMM's (linear_tiles.linear_configs): small
            # tiles, 4 warps, 2 stages; 16-bit 64x64 spilled 1 KB per thread on sm_75, so the prune keeps it for
            # fp32 only (autotune.fma_tile_fits)
            triton.Config({"BLOCK_M": bm, "BLOCK_D": bd, "BLOCK_K": 32}, num_warps=4, num_stages=FMA_STAGES)
            for bm in (32, 64)
            for bd in (32, 64)
        ]
    )


def prune_patch_embed_configs(configs, named_args, **kwargs):
    """The candidates for one launch, read only from its autotune key (row class ``m_class(M)``, D, K, the card
    ``ARCH``, dtypes, ``TUNE``, the device's ``SM_COUNT``): the configs for this kind of card (tensor cores or not,
    :data:`FMA_STAGES`) that fit its shared memory, narrow tiles only for few rows (:func:`~.autotune.gemm_prune_target`).
    Without tuning one heuristic config (a direct call without ``SM_COUNT`` reads as :data:`~.cards.CPU_SM_COUNT`);
    which one: docs/kernels.md, section Prunes and picks."""
    M, D = named_args.get("M"), named_args.get("D")
    if M is None or D is None or len(configs) == 1:
        return configs
    card, elem_bytes, rows, fits = gemm_prune_target(named_args, "w_ptr", "BLOCK_D")
    kept = [c for c in configs if fits(c)] or configs[:1]
    if tuning_requested(named_args) or len(kept) == 1:
        return kept
    if not card.tensor_cores:
        return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_D": 64, "BLOCK_K": 32}, 4, FMA_STAGES)]
    programs = named_args.get("SM_COUNT", CPU_SM_COUNT)
    if elem_bytes == 4:
        # fp32: 64x64x32 and 64x16x64 on 4 warps compiled without a spill on sm_80 to sm_120, triton 3.6 and 3.9;
        # every wider or deeper tile spilled somewhere: 64x128x64 (4 warps) 34 KB per thread on sm_80 (3.9),
        # 128x64x32 (8 warps) 12 B there (3.6), 64x64x64 1992 B and 64x32x64 104 B there (3.9), 64x128x32
        # (8 warps) 8-76 B on sm_120 (tools/compile_check.py, ViT-B/16)
        if rows > SMALL_M or rows // 64 * cdiv(D, 64) >= programs:
            return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_D": 64, "BLOCK_K": 32}, 4, 3)]
        return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_D": 16, "BLOCK_K": 64}, 4, 3)]
    block_d = 128
    if rows <= SMALL_M:
        block_d = next((bd for bd in (128, 64, 32) if rows // 64 * cdiv(D, bd) >= programs), 16)
    return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_D": block_d, "BLOCK_K": 64}, 4, 3)]


__all__ = ["patch_embed_configs", "prune_patch_embed_configs"]
