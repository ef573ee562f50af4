"""Kernels that know the card: for every card of ``cards.CARDS``, every dtype and the ViT-S/B/L/H shapes, each
config a prune keeps for tuning and the one the heuristic picks fits the card's shared memory (by the kernels'
own estimates), and none needs TMA where the card has none or tensor cores where it has none.

The launchers run on meta tensors under ``cards.pretend_arch`` with their kernel swapped for a recorder (as
tools/compile_check.py does), so the arguments the prunes see, ``ARCH`` included, are the ones a launch on that
card would pass; the prunes then run on the compiled-mode config lists (the interpreter's are one config).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from vit_fast.base import cards
from vit_fast.kernels import (
    KERNELS,
    attention,
    attention_tiles,
    autotune,
    linear,
    linear_tiles,
    patch_embed,
    patch_embed_tiles,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (name, embed dim, heads, patch, tokens at 224 px)
MODELS = (
    ("vit_small_patch16_224", 384, 6, 16, 197),
    ("vit_base_patch16_224", 768, 12, 16, 197),
    ("vit_large_patch16_224", 1024, 16, 16, 197),
    ("vit_huge_patch14_224", 1280, 16, 14, 257),
)
BATCHES = (1, 2, 8, 64)


def _recorded(monkeypatch, name: str, launcher, *args, **kwargs) -> tuple[dict, dict]:
    """(named arguments, constexprs) of the launch ``launcher(*args, **kwargs)`` of kernel ``name`` makes, launching
    nothing."""
    seen = {}
    entry = KERNELS[name]
    kernel = entry.kernel

    def record(grid, grid_key, *a, **constexprs):
        seen["named"], seen["constexprs"] = dict(zip(kernel.arg_names, a, strict=False)), constexprs

    with monkeypatch.context() as m:
        m.setattr(entry.module, entry.launches_name, record)
        launcher(*args, checked=True, **kwargs)
    return seen["named"], seen["constexprs"]


def _recorded_on(arch: int, monkeypatch, name: str, launcher, *args, **kwargs) -> tuple[dict, dict]:
    """:func:`_recorded` on a card of ``arch`` (``cards.pretend_arch``), whose launch passes that ``ARCH``."""
    with cards.pretend_arch(arch):
        named, constexprs = _recorded(monkeypatch, name, launcher, *args, **kwargs)
    assert named["ARCH"] == arch
    return named, constexprs


def _compiled_configs(monkeypatch, module, factory) -> list:
    monkeypatch.setattr(module, "interpreter_enabled", lambda: False)
    return factory()


def _pruned(monkeypatch, kernel, configs, named, constexprs, tune: bool) -> list:
    named = {**named, "TUNE": int(tune)}
    return kernel.early_config_prune(configs, named, **constexprs)


def _kept_tuned_or_not(monkeypatch, kernel, configs, named, constexprs) -> list:
    """The configs the pruner keeps with autotuning on (at least one) and off (exactly one), together."""
    kept = []
    for tune in (True, False):
        some = _pruned(monkeypatch, kernel, configs, named, constexprs, tune)
        assert some and (tune or len(some) == 1)
        kept += some
    return kept


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def _check_gemm_like(card, config, block_n_name: str, elem_bytes: int, what: str) -> None:
    kw = config.kwargs
    shared = autotune.gemm_shared_bytes(card, config, kw["BLOCK_M"], kw[block_n_name], kw["BLOCK_K"], elem_bytes)
    assert shared <= card.shared_memory, (what, str(config), shared)
    assert not kw.get("TMA") or card.tma, (what, str(config))
    # tensor-core tiles never run where tl.dot is FMA, and the FMA set only there
    assert (config.num_stages <= autotune.FMA_STAGES) == (not card.tensor_cores), (what, str(config))
    if not card.tensor_cores:
        assert config.num_warps == 4 and autotune.fma_tile_fits(kw["BLOCK_M"], kw[block_n_name], elem_bytes), what


@pytest.mark.parametrize("arch", sorted(cards.CARDS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_configs_fit_every_card(monkeypatch, arch, dtype):
    card = cards.CARDS[arch]
    configs = _compiled_configs(monkeypatch, linear_tiles, linear_tiles.linear_configs)
    kernel = KERNELS["linear"].kernel
    for name, dim, _, _, tokens in MODELS:
        for batch in BATCHES:
            M = batch * tokens
            for gemm, (N, K) in {"qkv": (3 * dim, dim), "proj": (dim, dim), "fc1": (4 * dim, dim)}.items():
                x, w = _meta((M, K), dtype), _meta((N, K), dtype)
                named, constexprs = _recorded_on(arch, monkeypatch, "linear", linear.launch_linear, x, w)
                for config in _kept_tuned_or_not(monkeypatch, kernel, configs, named, constexprs):
                    _check_gemm_like(card, config, "BLOCK_N", x.element_size(), f"{name} b{batch} {gemm}")


@pytest.mark.parametrize("arch", sorted(cards.CARDS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_patch_embed_configs_fit_every_card(monkeypatch, arch, dtype):
    card = cards.CARDS[arch]
    configs = _compiled_configs(monkeypatch, patch_embed_tiles, patch_embed_tiles.patch_embed_configs)
    kernel = KERNELS["patch_embed"].kernel
    for name, dim, _, patch, tokens in MODELS:
        for batch in BATCHES:
            x, weight = _meta((batch, 3, 224, 224), dtype), _meta((dim, 3, patch, patch), dtype)
            pos, cls = _meta((1, tokens, dim), dtype), _meta((1, 1, dim), dtype)
            launch = patch_embed.launch_patch_embed
            named, constexprs = _recorded_on(arch, monkeypatch, "patch_embed", launch, x, weight, None, pos, cls)
            for config in _kept_tuned_or_not(monkeypatch, kernel, configs, named, constexprs):
                _check_gemm_like(card, config, "BLOCK_D", weight.element_size(), f"{name} b{batch}")


@pytest.mark.parametrize("arch", sorted(cards.CARDS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("mask", [None, "lengths", "packed", "rope"])
def test_attention_configs_fit_every_card(monkeypatch, arch, dtype, head_dim, mask):
    """The unmasked kernel, its masked variants (a padded batch, packed images) and RoPE: their flags are in the key.
    fp32 with RoPE on cards with tensor cores takes only tiles of ``FP32_ROPE_TILES`` meant for its head dim."""
    card = cards.CARDS[arch]
    configs = _compiled_configs(monkeypatch, attention_tiles, attention_tiles.attention_configs)
    kernel = KERNELS["attention"].kernel
    for heads in (6, 12, 16):
        for batch, tokens in ((1, 197), (8, 197), (8, 257)):
            qkv = _meta((batch, tokens, 3 * heads * head_dim), dtype)
            masks = {
                None: {},
                "lengths": {"lengths": _meta((batch,), torch.int32)},
                "packed": {"cu_seqlens": _meta((3 * batch + 1,), torch.int32)},
                "rope": {
                    "num_prefix": 1,
                    **{t: _meta((tokens - 1, head_dim), dtype) for t in ("rope_cos", "rope_sin")},
                },
            }[mask]
            named, constexprs = _recorded_on(
                arch, monkeypatch, "attention", attention.launch_attention, qkv, heads, **masks
            )
            flags = (constexprs["HAS_LENGTHS"], constexprs["PACKED"], constexprs["ROPE"])
            assert flags == (mask == "lengths", mask == "packed", int(mask == "rope"))
            block_d = constexprs["BLOCK_D"]
            for config in _kept_tuned_or_not(monkeypatch, kernel, configs, named, constexprs):
                tile = (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages)
                rope_fp32 = mask == "rope" and dtype == torch.float32 and card.tensor_cores
                assert (tile in attention_tiles.FP32_ROPE_TILES) == rope_fp32, (heads, batch, str(config))
                assert not rope_fp32 or attention_tiles.FP32_ROPE_TILES[tile] >= block_d, str(config)
                # 16-bit with RoPE on mma.sync cards: 128-key tiles spilled 360-992 bytes per thread on sm_80
                assert not (mask == "rope" and card.dot == "mma.sync" and config.kwargs["BLOCK_N"] > 64), str(config)
                shared = attention_tiles.attention_shared_bytes(config, block_d, qkv.element_size(), card)
                assert shared <= card.shared_memory, (heads, batch, str(config), shared)
                assert (config.num_stages <= attention_tiles.FMA_ATTENTION_STAGES) == (not card.tensor_cores)
                if not card.tensor_cores:  # not expected to spill there
                    assert attention_tiles.fma_attention_fits(config, block_d, qkv.element_size()), str(config)


def test_fp32_attention_heuristic_fits_and_does_not_spill(monkeypatch):
    """The config that failed to launch on sm_86/89/120 (fp32, Dh 80-128: 64x64, 2 stages, 112 KB reported by
    triton 3.9 for sm_86), and that spilled 4.4-33 KB per thread on every target at Dh 64 (64x64, 4 warps), is no
    longer the heuristic's fp32 pick anywhere: 64x32 with 8 warps, which compiled spill-free on sm_75 to sm_120
    with triton 3.9; 3 stages at Dh 64 (2 spilled 36-56 bytes on sm_86/89/90 with triton 3.6, 3 nothing), 2 at
    Dh 128 (3 spilled 40 bytes on sm_80 with triton 3.6, and needs more than the 99 KB cards' shared memory)."""
    configs = _compiled_configs(monkeypatch, attention_tiles, attention_tiles.attention_configs)
    named = {"qkv_ptr": torch.empty(1), "TUNE": 0}
    for arch, card in cards.CARDS.items():
        if not card.tensor_cores:
            continue
        for block_d in (64, 128):
            (picked,) = attention_tiles.prune_attention_configs(configs, {**named, "ARCH": arch}, BLOCK_D=block_d)
            shape = (picked.kwargs["BLOCK_M"], picked.kwargs["BLOCK_N"], picked.num_warps, picked.num_stages)
            assert shape == (64, 32, 8, 3 if block_d == 64 else 2), (arch, block_d, shape)
            assert attention_tiles.attention_shared_bytes(picked, block_d, 4, card) <= card.shared_memory


def test_packed_attention_heuristic_on_mma_sync_takes_8_warps(monkeypatch):
    """Packed images in 16 bits with Dh 80-128 (BLOCK_D 128): the usual pick, 64x64 with 4 warps, spilled 32 bytes
    per thread on sm_80 (triton 3.6 and 3.9); with 8 warps nothing there or on sm_86 (174-176 registers). Only the
    packed variant on mma.sync cards moves: the unmasked kernel and the padded batch keep 4 warps, and so does
    every variant on sm_90 (wgmma, 188-190 registers, no spills)."""
    configs = _compiled_configs(monkeypatch, attention_tiles, attention_tiles.attention_configs)
    named = {"qkv_ptr": torch.empty(1, dtype=torch.float16), "TUNE": 0}
    for arch, card in cards.CARDS.items():
        if not card.tensor_cores:
            continue
        for block_d, has_lengths, packed in (
            (64, False, True),
            (128, False, False),
            (128, True, False),
            (128, False, True),
        ):
            flags = {"BLOCK_D": block_d, "HAS_LENGTHS": has_lengths, "PACKED": packed}
            (picked,) = attention_tiles.prune_attention_configs(configs, {**named, "ARCH": arch}, **flags)
            warps = 8 if packed and block_d > 64 and card.dot == "mma.sync" else 4
            shape = (picked.kwargs["BLOCK_M"], picked.kwargs["BLOCK_N"], picked.num_warps, picked.num_stages)
            assert shape == (64, 64, warps, 2), (arch, flags, shape)


#: fp32 attention tiles with RoPE that compiled with no spill on sm_80 and sm_90, both layouts (interleaved with one
#: table, halves with a table per head), triton 3.9 (tools/compile_check.py --set sweep --filter "fp32 Dh64 b8 | rope"
#: and Dh128): head dim -> (BLOCK_M, BLOCK_N, warps, stages). Spilled there, and so not listed: every config of the
#: set without RoPE (Dh 64: 1.0-82 KB per thread), 4-warp 16x32, 32x32 and 64x16 (24 bytes to 8.4 KB); at Dh 128
#: every tile but 16x16 on 8 warps (444 bytes to 25.3 KB)
FP32_ROPE_SPILL_FREE = {
    64: {
        *itertools.product((16, 32), (16,), (4, 8), (2, 3)),
        *itertools.product((16, 32), (32,), (8,), (2, 3)),
        *itertools.product((64,), (16,), (8,), (2, 3)),
    },
    128: {(16, 16, 8, 2), (16, 16, 8, 3)},
}


@pytest.mark.parametrize("arch", [80, 90])
def test_fp32_rope_attention_takes_tiles_that_compiled_without_spilling(monkeypatch, arch):
    """fp32 attention with RoPE (timm's interleaved pairs with one table, or halves with a table per head) on ViT-S/16
    and ViT-B/16 shapes (Dh 64) and at Dh 80 and 128: every config the prune keeps for tuning and the heuristic's
    pick are tiles that compiled spill-free there, the pick 64x16 with 8 warps and 3 stages at Dh 64 and 16x16 with 8
    warps and 2 stages above; 16-bit with RoPE and fp32 without it keep their tiles (none of the RoPE set)."""
    configs = _compiled_configs(monkeypatch, attention_tiles, attention_tiles.attention_configs)
    kernel = KERNELS["attention"].kernel
    for (heads, head_dim), batch, dtype, layout in itertools.product(
        ((6, 64), (12, 64), (16, 80), (8, 128)), (1, 8), DTYPES, ("interleaved", "half")
    ):
        tokens = 197
        qkv = _meta((batch, tokens, 3 * heads * head_dim), dtype)
        shape = (heads, tokens - 1, head_dim) if layout == "half" else (tokens - 1, head_dim)
        rope = {"rope_cos": _meta(shape, dtype), "rope_sin": _meta(shape, dtype), "num_prefix": 1}
        for with_rope in (True, False):
            launch = attention.launch_attention
            named, constexprs = _recorded_on(
                arch, monkeypatch, "attention", launch, qkv, heads, rope_layout=layout, **(rope if with_rope else {})
            )
            (picked,) = _pruned(monkeypatch, kernel, configs, named, constexprs, tune=False)
            kept = _pruned(monkeypatch, kernel, configs, named, constexprs, tune=True)
            tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in (picked, *kept)}
            what = (arch, heads, head_dim, batch, str(dtype), layout, with_rope)
            if with_rope and dtype == torch.float32:
                assert tiles <= FP32_ROPE_SPILL_FREE[constexprs["BLOCK_D"]], what
                want = (64, 16, 8, 3) if head_dim <= 64 else (16, 16, 8, 2)
                assert (picked.kwargs["BLOCK_M"], picked.kwargs["BLOCK_N"], picked.num_warps, picked.num_stages) == want
            else:
                assert not tiles & set(attention_tiles.FP32_ROPE_TILES), what


def test_fp32_patch_embed_heuristic_for_many_rows_does_not_spill(monkeypatch):
    """fp32 patch embedding at batch 8 of ViT-B/16: 64x128x64 with 4 warps spilled 34 KB per thread on sm_80 and
    128x64x32 with 8 warps 12 bytes (triton 3.6; none on 3.9); the heuristic takes 64x64x32 with 4 warps, which
    compiled spill-free on sm_80 to sm_120 with both, on every card with tensor cores; 16-bit keeps 64x128x64."""
    configs = _compiled_configs(monkeypatch, patch_embed_tiles, patch_embed_tiles.patch_embed_configs)
    for arch, card in cards.CARDS.items():
        if not card.tensor_cores:
            continue
        for dtype, want in ((torch.float32, (64, 64, 32, 4)), (torch.float16, (64, 128, 64, 4))):
            named = {"M": 197 * 8, "D": 768, "w_ptr": torch.empty(1, dtype=dtype), "ARCH": arch, "TUNE": 0}
            (picked,) = patch_embed_tiles.prune_patch_embed_configs(configs, named)
            kw = picked.kwargs
            assert (kw["BLOCK_M"], kw["BLOCK_D"], kw["BLOCK_K"], picked.num_warps) == want, (arch, dtype, picked)


def test_tma_only_where_the_card_has_it(monkeypatch):
    """Many rows of 16-bit, aligned operands: the heuristic takes the persistent TMA tiles on sm_90/100/120 and the
    pointer tiles on sm_80/86/89."""
    configs = _compiled_configs(monkeypatch, linear_tiles, linear_tiles.linear_configs)
    for arch, card in cards.CARDS.items():
        named = {"M": 197 * 8, "N": 2304, "K": 768, "x_ptr": torch.empty(1, dtype=torch.float16), "ARCH": arch}
        (picked,) = linear_tiles.prune_linear_configs(configs, {**named, "TMA_OK": 1, "TUNE": 0})
        assert picked.kwargs["TMA"] == int(card.tma), arch
        (picked,) = linear_tiles.prune_linear_configs(configs, {**named, "TMA_OK": 0, "TUNE": 0})
        assert picked.kwargs["TMA"] == 0, arch


@pytest.mark.parametrize("sm_count, want_n, want_d", [(108, 64, 32), (132, 32, 16)])
def test_few_rows_fill_the_sms_the_launcher_reads(monkeypatch, sm_count, want_n, want_d):
    """The launchers pass the SM count of the tensors' device (``SM_COUNT``, an autotune key) and the heuristics fill
    that many SMs, not one card's: ViT-S/16's qkv GEMM at batch 2 (394 x 1152) has 7 x 18 = 126 tiles of 64x64,
    enough for 108 SMs (an A100) and too few for 132 (an H100 SXM: 64x32, 252); ViT-L/16's patch embedding at
    batch 1 (197 x 1024) has 4 x 32 = 128 tiles of 64x32 (132 SMs: 64x16, 256)."""
    linear_configs = _compiled_configs(monkeypatch, linear_tiles, linear_tiles.linear_configs)
    pe_configs = _compiled_configs(monkeypatch, patch_embed_tiles, patch_embed_tiles.patch_embed_configs)
    assert "SM_COUNT" in KERNELS["linear"].kernel.keys and "SM_COUNT" in KERNELS["patch_embed"].kernel.keys
    dtype = torch.float16
    with cards.pretend_arch(90, sm_count=sm_count):
        gemm = _recorded(
            monkeypatch,
            "linear",
            linear.launch_linear,
            _meta((394, 384), dtype),
            _meta((1152, 384), dtype),
        )
        embed = _recorded(
            monkeypatch,
            "patch_embed",
            patch_embed.launch_patch_embed,
            _meta((1, 3, 224, 224), dtype),
            _meta((1024, 3, 16, 16), dtype),
            None,
            _meta((1, 197, 1024), dtype),
            _meta((1, 1, 1024), dtype),
        )
    assert gemm[0]["SM_COUNT"] == embed[0]["SM_COUNT"] == sm_count
    (picked,) = _pruned(monkeypatch, KERNELS["linear"].kernel, linear_configs, *gemm, tune=False)
    assert (picked.kwargs["BLOCK_M"], picked.kwargs["BLOCK_N"]) == (64, want_n)
    (picked,) = _pruned(monkeypatch, KERNELS["patch_embed"].kernel, pe_configs, *embed, tune=False)
    assert (picked.kwargs["BLOCK_M"], picked.kwargs["BLOCK_D"]) == (64, want_d)
    # outside the pretence a meta (or CPU) tensor reads as the stand-in, an H100 SXM's count
    assert cards.tensor_sm_count(_meta((1,), dtype)) == cards.CPU_SM_COUNT == 132


#: fp32 tiles that compiled with no spill on sm_80, sm_86 and sm_90 alike, with triton 3.6.0 and 3.9.0 alike
#: (tools/compile_check.py, ViT-S/16 and ViT-B/16 shapes at batch 1, 8 and 64 with each kernel's real epilogue;
#: the GEMM tiles also with the heaviest, LayerNorm prologue + GELU): (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
#: for the GEMM, (BLOCK_M, BLOCK_D, BLOCK_K, warps, stages) for the patch embedding, (BLOCK_M, BLOCK_N, head dim,
#: warps, stages) for attention. Spilled there (bytes per thread), and so not listed: GEMM 64x64x64 on 4 warps
#: (496-2076) and 64x64x32 (16 on sm_80, 3.9); patch embedding 128x64x32 on 8 warps (12 on sm_80, 3.6), 64x64x64
#: (1992 on sm_80, 3.9) and 64x32x64 (104 on sm_80, 3.9); attention 64x32 on 8 warps, 2 stages (36-56 on sm_86 /
#: sm_90, 3.6).
FP32_SPILL_FREE = {
    "linear": {(64, 16, 64, 4, 4), (64, 32, 64, 4, 4), (128, 128, 32, 8, 3)},
    "patch_embed": {(64, 16, 64, 4, 3), (64, 64, 32, 4, 3)},
    "attention": {(64, 32, 64, 8, 3)},
}
#: SM counts of cards of those generations: A30, RTX 3060 / 3070 / 3080 / 3090, A10, A40, A100, H100 PCIe, H100 SXM
CARD_SM_COUNTS = (28, 46, 56, 68, 72, 82, 84, 108, 114, 132)


def _tile(config, wide: str, deep) -> tuple:
    return (config.kwargs["BLOCK_M"], config.kwargs[wide], deep, config.num_warps, config.num_stages)


@pytest.mark.parametrize("arch", [80, 86, 90])
def test_default_fp32_picks_are_tiles_that_compiled_without_spilling(monkeypatch, arch):
    """Every fp32 pick the no-autotune heuristics make for ViT-S/16 and ViT-B/16 (batch 1, 2, 8, 64; each GEMM of a
    block, the patch embedding, attention) on sm_80, sm_86 and sm_90, at the SM counts of the cards users have, is
    a tile of :data:`FP32_SPILL_FREE` (compiled offline with triton 3.6.0 and 3.9.0). The launchers run on meta
    tensors under ``pretend_arch(arch, sm_count=)``, so their arguments, SM_COUNT included, are a launch's."""
    dtype = torch.float32
    configs = {
        "linear": _compiled_configs(monkeypatch, linear_tiles, linear_tiles.linear_configs),
        "patch_embed": _compiled_configs(monkeypatch, patch_embed_tiles, patch_embed_tiles.patch_embed_configs),
        "attention": _compiled_configs(monkeypatch, attention_tiles, attention_tiles.attention_configs),
    }

    def pick(kind, launcher, *args):
        named, constexprs = _recorded(monkeypatch, kind, launcher, *args)
        (picked,) = _pruned(monkeypatch, KERNELS[kind].kernel, configs[kind], named, constexprs, tune=False)
        return picked, constexprs

    seen = set()
    for name, dim, heads, patch, tokens in MODELS[:2]:
        for batch in (1, 2, 8, 64):
            M = batch * tokens
            for sm_count in CARD_SM_COUNTS:
                with cards.pretend_arch(arch, sm_count=sm_count):
                    for gemm, (N, K) in {"qkv": (3 * dim, dim), "proj": (dim, dim), "fc1": (4 * dim, dim)}.items():
                        picked, _ = pick("linear", linear.launch_linear, _meta((M, K), dtype), _meta((N, K), dtype))
                        tile = _tile(picked, "BLOCK_N", picked.kwargs["BLOCK_K"])
                        assert tile in FP32_SPILL_FREE["linear"], (name, batch, sm_count, gemm, str(picked))
                        seen.add(("linear", tile))
                    picked, _ = pick(
                        "patch_embed",
                        patch_embed.launch_patch_embed,
                        _meta((batch, 3, 224, 224), dtype),
                        _meta((dim, 3, patch, patch), dtype),
                        _meta((dim,), dtype),
                        _meta((1, tokens, dim), dtype),
                        _meta((1, 1, dim), dtype),
                    )
                    tile = _tile(picked, "BLOCK_D", picked.kwargs["BLOCK_K"])
                    assert tile in FP32_SPILL_FREE["patch_embed"], (name, batch, sm_count, str(picked))
                    seen.add(("patch_embed", tile))
                    qkv = _meta((batch, tokens, 3 * dim), dtype)
                    picked, constexprs = pick("attention", attention.launch_attention, qkv, heads)
                    tile = _tile(picked, "BLOCK_N", constexprs["BLOCK_D"])
                    assert tile in FP32_SPILL_FREE["attention"], (name, batch, str(picked))
                    seen.add(("attention", tile))
    # the sweep reached every listed tile: none of the table is dead weight
    assert seen == {(kind, tile) for kind, tiles in FP32_SPILL_FREE.items() for tile in tiles}
