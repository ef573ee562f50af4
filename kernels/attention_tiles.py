"""The attention kernel's tiles: the autotune candidates, their shared memory on each card, the prune and the
no-autotune pick (host side, read by the kernel in :mod:`.attention`); and what the attention kernels' launchers
and prunes share (:func:`head_split`, :func:`row_strides`, :func:`dtype_flags`, :func:`head_prune_target`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import triton

from vit_fast.base.cards import Card
from vit_fast.base.interpret import interpreter_enabled

from ._launch import dot_in_fp32, interpret_bf16, next_power_of_2
from .autotune import closest_config, prune_target, tuning_requested


def attention_configs() -> list[triton.Config]:
    """Autotune candidates. Built from the environment only (never a device query), so importing
    this module touches no GPU driver; the prune keeps those that suit the card of the tensors' device. The
    interpreter cannot time configs: it gets one."""
    if interpreter_enabled():
        # BLOCK_M != BLOCK_N on purpose: a query-tail mask swapped with a key-tail mask fails tests
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=1)]
    return (
        [
            triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=num_warps, num_stages=num_stages)
            for block_m in (64, 128)
            for block_n in (32, 64, 128)
            for num_stages in (2, 3)
            for num_warps in (4, 8)
            if not (block_m == 128 and num_warps == 4)  # 128 rows of fp32 state spill with 4 warps
        ]
        + [
            # cards without tensor cores (sm_75) get only these, and only they run there: the configs above spill up
            # to 32.6 KB per thread on sm_75 and two need 96 KB of its 64 KB (offline compiles, tools/compile_check.py). Small
            # tiles, 4 warps, no pipelining (sm_75 has no asynchronous copies to overlap); the prune keeps those not
            # expected to spill (fma_attention_fits)
            triton.Config({"BLOCK_M": block_m, "BLOCK_N": 32}, num_warps=4, num_stages=FMA_ATTENTION_STAGES)
            for block_m in (16, 32)
        ]
        + [  # fp32 with RoPE on cards with tensor cores gets only these, and only it
            triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in FP32_ROPE_TILES
        ]
    )


#: fp32 attention with RoPE where ``tl.dot`` has tensor cores (fp32 dots run on FMA there too): (BLOCK_M, BLOCK_N,
#: num_warps, num_stages) -> the largest ``BLOCK_D`` it compiled for with no spill on sm_80 and sm_90, both layouts
#: (triton 3.9, 12 heads, 197 tokens). The rotation keeps q's partner lanes and the table rows live: every config of
#: the set above spilled 1.0-82 KB per thread at Dh 64; at Dh 128 only 16x16 with 8 warps did not. Measured:
#: benchmarks/results/compile-check/NOTES.md, section "fp32 attention with RoPE".
FP32_ROPE_TILES = {
    (64, 16, 8, 2): 64,
    (64, 16, 8, 3): 64,
    (32, 32, 8, 2): 64,
    (32, 16, 8, 2): 64,
    (32, 16, 4, 2): 64,
    (16, 16, 8, 2): 128,
    (16, 16, 8, 3): 128,
}


def _tile(config: triton.Config) -> tuple[int, int, int, int]:
    return config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages


#: num_stages of the configs meant for cards without tensor cores: every other config has more
FMA_ATTENTION_STAGES = 1


def fma_attention_fits(config: triton.Config, block_d: int, elem_bytes: int) -> bool:
    """Whether a config is expected not to spill where ``tl.dot`` is FMA (sm_75): its q / accumulator and score
    tiles, ``BLOCK_M * (BLOCK_D + BLOCK_N)`` elements, at most 5120 in fp32 and 3072 in 16-bit. From triton
    3.9's compiles for sm_75 (spilled bytes per thread): fp32 Dh 64 64x32 836, 32x32 none; fp32 Dh 128 64x32
    5376, 32x32 none; fp16 Dh 64 64x32 1012, 32x32 and 16x32 none (bf16 32x32 none); fp16 Dh 128 64x32 21136,
    32x32 1356, 16x32 none."""
    elements = config.kwargs["BLOCK_M"] * (block_d + config.kwargs["BLOCK_N"])
    return elements <= (5120 if elem_bytes == 4 else 3072)


def block_d_for(head_dim: int) -> int:
    """The kernel's ``BLOCK_D``: the head dim padded to a power of two, at least 16 (the dot's minimum)."""
    return max(16, next_power_of_2(head_dim))


def head_split(x: torch.Tensor, parts: int, heads: int, scale: float | None) -> tuple[int, int, float]:
    """``(embed_dim, head_dim, scale)`` of a fused projection ``x [..., parts * heads * Dh]`` (qkv: 3 parts, kv: 2):
    ``embed_dim = heads * Dh``; ``scale`` defaults to ``Dh ** -0.5``."""
    embed_dim = x.shape[-1] // parts
    head_dim = embed_dim // heads
    return embed_dim, head_dim, head_dim**-0.5 if scale is None else float(scale)


def row_strides(*tensors: torch.Tensor) -> tuple[int, ...]:
    """The batch and token strides of each ``[B, T, ...]`` tensor, in order: what the attention kernels take."""
    strides: list[int] = []
    for t in tensors:  # a loop, not a generator: every launch asks (host time)
        strides += t.stride()[:2]
    return tuple(strides)


def dtype_flags(dtype: torch.dtype) -> dict[str, bool]:
    """The attention kernels' dtype constexprs: ``DOT_IN_FP32`` and ``ROUND_BF16`` (Triton's interpreter)."""
    return {"DOT_IN_FP32": dot_in_fp32(dtype), "ROUND_BF16": interpret_bf16(dtype)}


def attention_shared_bytes(config: triton.Config, block_d: int, elem_bytes: int, card: Card) -> int:
    """Shared memory of a config on ``card``, as the prune compares it with ``card.shared_memory``. On the wgmma /
    tcgen05 cards (sm_90, sm_100): 2 * num_stages - 1 k/v tiles, plus the q tile at 128 rows, as Triton 3.9 lays it
    out on sm_90. Other cards: the k/v tiles, plus a padded q tile and a padded p tile, an upper bound of triton
    3.9's figures for sm_86; without tensor cores (sm_75) every tile counts as fp32. The compiles behind it:
    docs/kernels.md, section Shared memory and spills."""
    block_m, block_n, stages = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], max(config.num_stages, 1)
    if card.dot in ("wgmma", "tcgen05"):
        kv = (2 * stages - 1) * block_n * block_d * elem_bytes
        return kv + (block_m * block_d * elem_bytes if block_m > 64 else 0)
    if card.dot == "fma":  # k and v apart at every stage, and every tile counted as fp32
        return 2 * stages * block_n * block_d * 4 + block_m * (block_d + 1) * 4 + block_m * (block_n + 1) * 4
    kv = (2 * stages - 1) * block_n * block_d * elem_bytes
    return kv + block_m * (block_d + 1) * elem_bytes + block_m * (block_n + 1) * elem_bytes


def head_prune_target(named_args: dict, kwargs: dict, operand: str, shared_bytes: Callable) -> tuple | None:
    """``(BLOCK_D, card, elem_bytes, shared)`` an attention prune decides for (:func:`~.autotune.prune_target`),
    ``shared(config)`` being ``shared_bytes(config, BLOCK_D, elem_bytes, card)``; None where no ``BLOCK_D`` is set."""
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    if block_d is None:
        return None
    card, elem_bytes = prune_target(named_args, operand)
    return block_d, card, elem_bytes, lambda config: shared_bytes(config, block_d, elem_bytes, card)


def prune_attention_configs(configs, named_args, **kwargs):
    """The candidates for one launch, read only from its autotune key (T, the head dim, the card ``ARCH``, the dtype,
    ``TUNE``, the mask flags ``HAS_LENGTHS`` / ``PACKED``, ``ROPE``): the configs for this kind of card and launch
    (:data:`FMA_ATTENTION_STAGES`, :data:`FP32_ROPE_TILES`) that fit its shared memory and registers. Without tuning
    one config, the fitting one nearest 64x64, 4 warps, 2 stages. Rules and exceptions: docs/kernels.md, section
    Prunes and picks."""
    target = head_prune_target(named_args, kwargs, "qkv_ptr", attention_shared_bytes)
    if target is None:
        return configs
    block_d, card, elem_bytes, shared = target
    rope = bool(kwargs.get("ROPE", named_args.get("ROPE")))
    rope_fp32 = rope and elem_bytes == 4 and card.tensor_cores

    def fits(config: triton.Config) -> bool:
        kw = config.kwargs
        if rope_fp32:
            return FP32_ROPE_TILES.get(_tile(config), 0) >= block_d and shared(config) <= card.shared_memory
        if card.tensor_cores and block_d > 128 and not (kw["BLOCK_M"] == 64 and kw["BLOCK_N"] <= 64):
            return False
        if rope and card.dot == "mma.sync" and kw["BLOCK_N"] > 64:  # 16-bit, Dh 64: 360-992 B spilled on sm_80
            return False
        if not card.tensor_cores and not fma_attention_fits(config, block_d, elem_bytes):
            return False
        return shared(config) <= card.shared_memory

    # nothing fits (Dh 256 on sm_75): the smallest config for the card, which may spill or fail to launch there
    same_kind = [
        c
        for c in configs
        if (c.num_stages > FMA_ATTENTION_STAGES) == card.tensor_cores and (_tile(c) in FP32_ROPE_TILES) == rope_fp32
    ] or configs
    kept = [c for c in same_kind if fits(c)] or [min(same_kind, key=shared)]
    if tuning_requested(named_args) or len(kept) == 1:
        return kept
    if not card.tensor_cores:
        return [closest_config(kept, {"BLOCK_M": 32, "BLOCK_N": 32}, 4, FMA_ATTENTION_STAGES)]
    if rope_fp32:  # the largest rows that did not spill: 64x16 at Dh 64 (3 stages, as without RoPE), else 16x16
        return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_N": 16}, 8, 3 if block_d <= 64 else 2)]
    if elem_bytes == 4:
        # fp32: 64x64 with 4 warps spilled 4.4-4.7 KB per thread on every target (33 KB on sm_80), 64x32 with 8
        # warps nothing on any, sm_75 to sm_120 (tools/compile_check.py, triton 3.9, Dh 64). On triton 3.6 that
        # 64x32 spilled at 2 stages with Dh 64 (sm_90 56 bytes, sm_86/89 36) and not at 3 (80-92 registers on
        # sm_80 to sm_120, 3.6 and 3.9 alike); Dh 128 the other way round on 3.6 (3 stages: 40 bytes on sm_80, 2:
        # none; 3.9: 64 bytes there either way), and 3 stages overflow the 99 KB cards there
        return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_N": 32}, 8, 3 if block_d <= 64 else 2)]
    if kwargs.get("PACKED", named_args.get("PACKED")) and card.dot == "mma.sync" and block_d > 64:
        # packed images, 16-bit, Dh 128 on mma.sync cards: 64x64 with 4 warps spilled 32 bytes per thread on sm_80
        # (255 registers, triton 3.6 and 3.9; the unmasked kernel and the padded batch there: none), 8 warps none
        return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_N": 64}, 8, 2)]
    return [closest_config(kept, {"BLOCK_M": 64, "BLOCK_N": 64}, 4, 2)]


# ---------------------------------------------------------------------------------- compile-check variants
# what tools/compile_check.py compiles of this kernel (KERNELS[name].compile_variants / .compile_launch): its
# cases (kernel, label, params, which configs) per variant set, and one launch per case recorded through v.record;
# ``v`` is the tool's vocabulary (DTYPES, PICK_MODELS, PICK_BATCHES, EVERY_CONFIG_DTYPES, which, empty, torch_dtype)
_ATTENTION_HEADS = {32: 12, 64: 12, 80: 16, 96: 12, 128: 16, 256: 4}  # head_dim -> num_heads (256: MAX_HEAD_DIM)


#: the attention kernel's masked variants (its HAS_LENGTHS / PACKED flags): a padded batch, packed images
_ATTENTION_MASKS = ("lengths", "packed")

#: the attention kernel's rotary variants (its ROPE flag): timm's interleaved pairs with one table for every head
#: ('cat', EVA-02), the half layout with a table per head ('mixed' with rotate_half); a class token left unrotated
_ATTENTION_ROPES = ("rope", "rope-half")


def _attention_variant(dtype, head_dim, b, which, mask=None, heads=None):
    label = f"{dtype}{f' H{heads}' if heads else ''} Dh{head_dim} b{b}{f' | {mask}' if mask else ''}"
    params = {"dtype": dtype, "head_dim": head_dim, "B": b, **({"heads": heads} if heads else {})}
    return ("attention", label, {**params, **({"mask": mask} if mask else {})}, which)


def compile_variants(v, variant_set: str, full: bool) -> list[tuple]:
    if variant_set == "picks":  # 6 (ViT-S/16) and 12 (ViT-B/16) heads of 64, 197 tokens
        return [
            _attention_variant(dtype, 64, b, "pick", heads=H)
            for dtype, (_, _, H), b in itertools.product(v.DTYPES, v.PICK_MODELS, v.PICK_BATCHES)
        ]
    if variant_set == "vit-b16":  # 12 heads of 64, 197 tokens, batch 1 and 8; the masked variants at batch 8
        return [
            _attention_variant(dtype, 64, b, v.which(dtype)) for dtype, b in itertools.product(v.DTYPES, (1, 8))
        ] + [
            _attention_variant(dtype, 64, 8, v.which(dtype), mask)
            for dtype, mask in itertools.product(v.DTYPES, (*_ATTENTION_MASKS, *_ATTENTION_ROPES))
        ]
    cases = []
    for head_dim, dtype in itertools.product(_ATTENTION_HEADS, v.DTYPES):
        # Dh 80 and 96 have the same tiles as Dh 128 (BLOCK_D 128), only the masks differ
        which = "all" if full else ("ends" if head_dim in (80, 96) else "kept")
        cases.append(_attention_variant(dtype, head_dim, 8, which))
        # the masked variants: the smallest and largest kept tile (and the pick) unless --full
        cases += [_attention_variant(dtype, head_dim, 8, "all" if full else "ends", mask) for mask in _ATTENTION_MASKS]
        if head_dim in (64, 128):  # the rotary variants: every config of the set, so new tiles can be judged
            cases += [_attention_variant(dtype, head_dim, 8, "all", rope) for rope in _ATTENTION_ROPES]
    return cases


def compile_launch(v, params: dict) -> tuple:
    from .attention import launch_attention

    B, T, Dh = params.get("B", 8), 197, params["head_dim"]
    H = params.get("heads", _ATTENTION_HEADS[Dh])
    mask = params.get("mask")
    # 196 patch tokens after the class token: one table [T - 1, Dh] for every head, or one per head [H, T - 1, Dh]
    rope = {"num_prefix": 1, **{k: v.empty((T - 1, Dh), params["dtype"]) for k in ("rope_cos", "rope_sin")}}
    rope_half = {
        "num_prefix": 1,
        "rope_layout": "half",
        **{k: v.empty((H, T - 1, Dh), params["dtype"]) for k in ("rope_cos", "rope_sin")},
    }
    masks = {
        "lengths": {"lengths": v.empty((B,), "i32")},
        # four images in each row's 197 tokens; the launcher reads no values (checked=True)
        "packed": {"cu_seqlens": v.empty((4 * B + 1,), "i32"), "max_seqlen": 64},
        "rope": rope,
        "rope-half": rope_half,
    }
    return v.record(
        launch_attention,
        v.empty((B, T, 3 * H * Dh), params["dtype"]),
        H,
        **(masks[mask] if mask else {}),
    )


__all__ = [
    "FMA_ATTENTION_STAGES",
    "FP32_ROPE_TILES",
    "attention_configs",
    "attention_shared_bytes",
    "block_d_for",
    "dtype_flags",
    "fma_attention_fits",
    "head_prune_target",
    "head_split",
    "prune_attention_configs",
    "row_strides",
]
