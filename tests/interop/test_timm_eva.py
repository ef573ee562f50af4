"""apply_vit_fast on timm's ``Eva`` class (rotary position embeddings): tiny models built from timm's own configs,
patched in place, every block on the kernels (attention launches counted: RoPE adds none) and the logits judged by
the numerics rule against the unpatched model in float64; what the kernels do not run yet refused by name."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")

import vit_fast  # noqa: E402
from vit_fast.interop.timm_blocks import BlockPlan  # noqa: E402

from ..fakes import assert_attention_launches, count_calls, eager_and_float64, kernel_launches, trained_like  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

SMALL = dict(depth=2, embed_dim=64, num_heads=2)
# case -> (timm name, create_model overrides, rope layout, prefix tokens): one tiny model per rotary variant
EVAS = {
    "rope 'cat' axial, AttentionRope, Mlp": ("vit_base_patch16_rope_224", dict(SMALL, img_size=48), "interleaved", 1),
    "rope 'mixed' (per-head tables)": ("vit_base_patch16_rope_mixed_224", dict(SMALL, img_size=48), "interleaved", 1),
    "DINOv3: 'dinov3', half, class + 4 registers": ("vit_small_patch16_dinov3", dict(SMALL, img_size=48), "half", 5),
    "register, no class token": ("vit_base_patch16_rope_reg1_gap_256", dict(SMALL, img_size=48), "interleaved", 1),
    "PE core: map head": (
        "vit_pe_core_tiny_patch16_384",
        dict(SMALL, img_size=48, attn_pool_num_heads=2),
        "interleaved",
        1,
    ),
    "EVA-02 tiny: EvaAttention q/v bias, GluMlp SiLU": (
        "eva02_tiny_patch14_224",
        dict(depth=2, img_size=42),
        "interleaved",
        1,
    ),
    "EVA-02 base: q/k/v Linears, SwiGLU with its LayerNorm": (
        "eva02_base_patch14_224",
        dict(SMALL, img_size=42),
        "interleaved",
        1,
    ),
    "EVA-02 base, q/k/v Linears, Mlp": (
        "eva02_base_patch14_224",
        dict(SMALL, img_size=42, swiglu_mlp=False, scale_mlp=False),
        "interleaved",
        1,
    ),
}


def _model(case: str) -> torch.nn.Module:
    torch.manual_seed(0)
    name, kwargs, _, _ = EVAS[case]
    return trained_like(timm.create_model(name, pretrained=False, **kwargs), seed=3)


@pytest.mark.parametrize("case", sorted(EVAS))
def test_eva_patched_in_place(case, monkeypatch):
    model = _model(case)
    name, _, layout, prefix = EVAS[case]
    x = torch.randn(2, 3, *model.patch_embed.img_size)
    eager, expected = eager_and_float64(model, x)
    vit_fast.apply_vit_fast(model, backend="triton")
    plans = [block.__dict__["_vit_fast_plan"] for block in model.blocks]
    assert {(p.kind, p.rope_layout, p.num_prefix) for p in plans} == {("EvaBlock", layout, prefix)}
    runs = count_calls(monkeypatch, BlockPlan)
    with torch.no_grad():
        ours, launches = kernel_launches(lambda: model(x))
    assert len(runs) == len(model.blocks)  # no block fell back to timm's forward
    map_head = type(getattr(model, "attn_pool", None)).__name__ == "AttentionPoolLatent"
    assert_attention_launches(launches, len(model.blocks), int(map_head), padded=False)
    assert_within_eager(ours, eager, expected, name=f"{name} patched")
    assert vit_fast.remove_vit_fast(model) == len(model.blocks) + map_head


def test_eva_block_launches_as_a_vit_block():
    """An EvaBlock runs in the launches of a ViT Block (LN1 + qkv, attention, proj, LN2 + fc1, fc2): RoPE adds none."""
    counts = {}
    for name in ("vit_base_patch16_rope_224", "vit_tiny_patch16_224"):
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, img_size=32, depth=1, embed_dim=64, num_heads=2).eval()
        vit_fast.apply_vit_fast(model, backend="triton")
        tokens = torch.randn(1, 5, 64)
        rope = {"rope": model.rope.get_embed()} if name.startswith("vit_base_patch16_rope") else {}
        with torch.no_grad():
            _, counts[name] = kernel_launches(lambda: model.blocks[0](tokens, **rope))  # noqa: B023
    assert counts["vit_base_patch16_rope_224"] == counts["vit_tiny_patch16_224"]
    assert sum(counts["vit_tiny_patch16_224"].values()) == 5


def test_eva_with_a_padding_mask_and_positional_rope_runs_timms_forward(monkeypatch):
    """A positional rope (``block(x, rope)``) or a mask other than key padding: timm's own forward, nothing wrong."""
    model = _model("rope 'cat' axial, AttentionRope, Mlp")
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, BlockPlan)
    block, rope = model.blocks[0], model.rope.get_embed()
    tokens = torch.randn(1, 10, 64)
    with torch.no_grad():
        got = block(tokens, rope)
        expected = block.__dict__["_vit_fast_original_forward"](tokens, rope)
    assert runs == [] and torch.equal(got, expected)


REFUSED = {
    "vit_base_patch16_rope_224 qk_norm": (
        dict(SMALL, img_size=32, qk_norm=True),
        "blocks.0.attn.q_norm (qk-norm: not yet on the kernels)",
    ),
    "eva02_tiny_patch14_224 scale_attn_inner": (
        dict(img_size=28, depth=2, swiglu_mlp=False, scale_attn_inner=True),
        "blocks.0.attn.norm (scale_attn_inner, a norm inside attn: not yet on the kernels)",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_eva_features_not_on_the_kernels_are_refused_by_name(case):
    kwargs, expected = REFUSED[case]
    model = timm.create_model(case.split()[0], pretrained=False, **kwargs)
    with pytest.raises(ValueError, match="apply_vit_fast") as info:
        vit_fast.apply_vit_fast(model, backend="triton")
    assert expected in str(info.value)
    assert "blocks.1." not in str(info.value)  # each feature named once
    assert vit_fast.remove_vit_fast(model) == 0
