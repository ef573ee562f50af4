"""apply_vit_fast on timm's ParallelScalingBlock (the "xp" ViTs: RmsNorm, qk-norm; vit_pwee: LayerNorm, a separate
mlp_bias, LayerScale) and DiffParallelScalingBlock (vit_dpwee: the same block with differential attention): patched
in place and judged by the numerics rule against timm in float64, kernels in Triton's interpreter; what the block may
carry beyond that refused by name at patch time."""

from __future__ import annotations

from functools import partial

import pytest
import torch

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")

from timm.layers import LayerNorm, RmsNorm, RmsNormFp32  # noqa: E402
from timm.models.vision_transformer import DiffParallelScalingBlock, ParallelScalingBlock  # noqa: E402

import vit_fast  # noqa: E402
from vit_fast.interop.timm_blocks import BlockPlan  # noqa: E402

from ..fakes import count_calls, eager_and_float64, export_on_the_kernels, trained_like  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

SMALL = dict(depth=2, embed_dim=64, num_heads=2, img_size=32)
XP = "vit_base_patch16_xp_224"  # RmsNorm (in_norm, qk-norm, the model's norms), qkv_bias=False, pre_norm
PWEE = "vit_pwee_patch16_reg1_gap_256"  # LayerNorm, no qk-norm, mlp_bias, LayerScale, a register, avg pool
DPWEE = "vit_dpwee_patch16_reg1_gap_256"  # pwee's block with differential attention (heads of 2 x 16 at 64 wide)

# case -> (timm name, create_model overrides)
CASES = {
    "xp: RmsNorm + qk-norm": (XP, SMALL),
    "xp: qkv_bias (in_proj.bias holds fc1's bias)": (XP, dict(SMALL, qkv_bias=True)),
    "xp: RmsNormFp32": (XP, dict(SMALL, norm_layer=RmsNormFp32)),
    "xp: fuse_out_proj": (XP, dict(SMALL, block_fn=partial(ParallelScalingBlock, fuse_out_proj=True))),
    "pwee: LayerNorm, mlp_bias, LayerScale": (PWEE, SMALL),
    "pwee: LayerNorm qk-norm, SiLU": (PWEE, dict(SMALL, qk_norm=True, act_layer="silu")),
    "pwee: 48 wide, 3 heads of 16": (PWEE, dict(SMALL, embed_dim=48, num_heads=3, depth=1)),
    "dpwee: LayerNorm, in_proj.bias, LayerScale": (DPWEE, SMALL),
    "dpwee: qk-norm, mlp_bias, dual_lambda": (
        DPWEE,
        dict(SMALL, qk_norm=True, qkv_bias=False, block_fn=partial(DiffParallelScalingBlock, dual_lambda=True)),
    ),
    "dpwee: RmsNorm, SiLU, 96 wide, 3 heads of 2 x 16": (
        DPWEE,
        dict(SMALL, embed_dim=96, num_heads=3, depth=1, norm_layer=RmsNorm, act_layer="silu"),
    ),
}


def _one_block_model(name: str, seed: int) -> torch.nn.Module:
    """A one-block model ``name`` at the small size, its weights trained-like (``seed``)."""
    torch.manual_seed(0)
    return trained_like(timm.create_model(name, pretrained=False, **dict(SMALL, depth=1)), seed)


def _patched_block(name: str, seed: int) -> torch.nn.Module:
    """The block of :func:`_one_block_model`, patched onto the kernels (backend='triton')."""
    model = _one_block_model(name, seed)
    vit_fast.apply_vit_fast(model, backend="triton")
    return model.blocks[0]


def _patched_matches_timm(name, kwargs, monkeypatch, seed=1):
    torch.manual_seed(0)
    model = trained_like(timm.create_model(name, pretrained=False, **kwargs), seed)
    kind = DiffParallelScalingBlock if name == DPWEE else ParallelScalingBlock
    assert all(type(b) is kind for b in model.blocks)
    x = torch.randn(2, 3, *model.patch_embed.img_size)
    keys = list(model.state_dict())
    eager, expected = eager_and_float64(model, x)
    vit_fast.apply_vit_fast(model, backend="triton")
    assert list(model.state_dict()) == keys
    runs = count_calls(monkeypatch, BlockPlan)
    with torch.no_grad():
        ours = model(x)
    assert len(runs) == len(model.blocks)  # every block ran on the kernels
    assert_within_eager(ours, eager, expected, name=f"{name} {kwargs} patched")
    return model, x, eager


@pytest.mark.parametrize("case", sorted(CASES))
def test_parallel_scaling_block_patched_in_place(case, monkeypatch):
    name, kwargs = CASES[case]
    model, x, eager = _patched_matches_timm(name, kwargs, monkeypatch)
    assert vit_fast.remove_vit_fast(model) == len(model.blocks)
    with torch.no_grad():
        assert torch.equal(model(x), eager)


def test_xp_block_parts_are_what_the_plan_reads():
    """The tiny xp model has the parts the task names: RmsNorm in_norm and qk-norm over head_dim, no in_proj bias."""
    block = timm.create_model(XP, pretrained=False, **SMALL).blocks[0]
    assert type(block.in_norm) is RmsNorm and type(block.q_norm) is RmsNorm and block.q_norm.weight.shape == (32,)
    assert block.in_proj.bias is None and block.mlp_bias is not None
    pwee = timm.create_model(PWEE, pretrained=False, **SMALL).blocks[0]
    assert isinstance(pwee.in_norm, LayerNorm) and isinstance(pwee.ls.gamma, torch.Tensor)


def test_dpwee_block_parts_are_what_the_cases_say():
    """The dpwee cases hold what their names say: q/k heads of 16, a sub_norm over 32 and in_proj's bias (fc1's
    included) in the first; qk-norm, a separate mlp_bias and the scalar lambdas in the second; RmsNorm in_norm and
    SiLU in the third."""
    cases = ("dpwee: LayerNorm, in_proj.bias, LayerScale", "dpwee: qk-norm, mlp_bias, dual_lambda")
    cases += ("dpwee: RmsNorm, SiLU, 96 wide, 3 heads of 2 x 16",)
    plain, normed, rms = (timm.create_model(DPWEE, pretrained=False, **CASES[c][1]).blocks[0] for c in cases)
    assert plain.head_dim == 16 and plain.sub_norm.weight.shape == (32,) and plain.mlp_bias is None
    assert isinstance(plain.in_norm, LayerNorm) and isinstance(plain.ls.gamma, torch.Tensor)
    assert isinstance(normed.q_norm, LayerNorm) and normed.in_proj.bias is None and normed.mlp_bias is not None
    assert normed.dual_lambda and normed.lambda_q1 is None
    assert type(rms.in_norm) is RmsNorm and isinstance(rms.mlp_act, torch.nn.SiLU) and rms.num_heads == 3


def test_dpwee_runs_the_differential_lambda():
    """The patched block reads the block's lambda: changing it changes the output (a plain attention would not)."""
    block = _patched_block(DPWEE, 6)
    x = torch.randn(1, 5, 64)
    with torch.no_grad():
        before = block(x)
        block.lambda_q1.mul_(-3.0)
        after = block(x)
        expected = block.__dict__["_vit_fast_original_forward"](x)
    assert (before - after).abs().max() > 1e-3
    assert torch.allclose(after, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("switch", ["fuse_ln_off", "first_use_check_on"])
def test_unfused_norms_and_first_use_check(switch, monkeypatch):
    """VIT_FAST_FUSE_LN=0 (in_norm once, as its own launch, before both GEMMs) and the first-use safety net (the
    checked ops, each judged against eager) give the same parity; the net finds no failing op."""
    from vit_fast.backend import first_use

    if switch == "fuse_ln_off":
        monkeypatch.setenv("VIT_FAST_FUSE_LN", "0")
    else:
        monkeypatch.setenv("VIT_FAST_FIRST_USE_CHECK", "1")
    _patched_matches_timm(XP, dict(SMALL, depth=1), monkeypatch, seed=4)
    if switch == "first_use_check_on":
        assert not first_use.failed_ops()


def test_qk_norm_is_applied():
    """A ParallelScalingBlock whose qk-norm weights are far from 1 differs from the same block without them: the
    parity tests above would catch a qk-norm the kernels skipped."""
    block = _patched_block(XP, 2)
    x = torch.randn(1, 5, 64)
    with torch.no_grad():
        normed = block(x)
        block.q_norm.weight.fill_(1.0)
        block.k_norm.weight.fill_(1.0)
        plain = block(x)
    assert (normed - plain).abs().max() > 1e-3


def _with(block_change, name=XP):
    def make():
        model = timm.create_model(name, pretrained=False, **dict(SMALL, depth=2))
        for block in model.blocks:
            block_change(block)
        return model

    return make


def _add_extra(block):
    block.attn_norm = torch.nn.LayerNorm(64)


def _group_norm_in(block):
    block.in_norm = torch.nn.GroupNorm(1, 64)


def _rms_over_two_dims(block):
    block.q_norm = RmsNorm((2, 16))


def _both_biases(block):
    block.in_proj = torch.nn.Linear(64, block.in_proj.out_features, bias=True)


def _relu(block):
    block.mlp_act = torch.nn.ReLU()


def _layer_norm_sub_norm(block):
    block.sub_norm = torch.nn.LayerNorm(32)


def _rms_sub_norm_over_head_dim(block):
    block.sub_norm = RmsNorm(16)


REFUSED = {
    "an extra submodule": (_with(_add_extra), "blocks.0.attn_norm LayerNorm (not part of the ParallelScalingBlock"),
    "GroupNorm in_norm": (_with(_group_norm_in), "blocks.0.in_norm GroupNorm (the kernels run LayerNorm and timm's"),
    "qk-norm not over head_dim": (_with(_rms_over_two_dims), "blocks.0.q_norm normalises (2, 16), not the last dim"),
    "mlp_bias and in_proj.bias": (_with(_both_biases), "blocks.0.mlp_bias beside in_proj.bias"),
    "ReLU": (_with(_relu), "blocks.0.mlp_act ReLU (the kernels run GELU"),
    "dpwee: an extra submodule": (
        _with(_add_extra, DPWEE),
        "blocks.0.attn_norm LayerNorm (not part of the DiffParallelScalingBlock",
    ),
    "dpwee: LayerNorm sub_norm": (
        _with(_layer_norm_sub_norm, DPWEE),
        "blocks.0.sub_norm LayerNorm (an affine RmsNorm over 2 x head_dim",
    ),
    "dpwee: sub_norm over head_dim": (
        _with(_rms_sub_norm_over_head_dim, DPWEE),
        "blocks.0.sub_norm RmsNorm (an affine RmsNorm over 2 x head_dim",
    ),
    "dpwee: ReLU": (_with(_relu, DPWEE), "blocks.0.mlp_act ReLU (the kernels run GELU"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_parallel_scaling_refusals_name_the_part(case):
    make, expected = REFUSED[case]
    model = make()
    with pytest.raises(ValueError, match="apply_vit_fast") as info:
        vit_fast.apply_vit_fast(model, backend="triton")
    assert expected in str(info.value)
    assert "blocks.1." not in str(info.value)  # each feature named once
    assert vit_fast.remove_vit_fast(model) == 0  # nothing was patched


def test_attention_mask_and_training_run_timms_forward(monkeypatch):
    """An attention mask, or training with grad, runs the block's own forward (the kernels take neither)."""
    block = _patched_block(XP, 3)
    runs = count_calls(monkeypatch, BlockPlan)
    tokens = torch.randn(2, 5, 64)
    mask = torch.zeros(5, 5, dtype=torch.bool).fill_diagonal_(True)
    with torch.no_grad():
        masked = block(tokens, attn_mask=mask)
        expected = block.__dict__["_vit_fast_original_forward"](tokens, attn_mask=mask)
    block.train()
    block(tokens).sum().backward()
    assert runs == [] and torch.equal(masked, expected)


def test_torch_export_records_the_rms_ops():
    """backend='triton': torch.export of a patched xp model records the RMS ops (qk-norm and in_norm folded into the
    GEMMs) and computes what timm computes."""
    model = _one_block_model(XP, 5)
    ops = export_on_the_kernels(model, torch.randn(2, 3, 32, 32), "exported patched xp model")
    assert {"vit_fast.rms_norm_linear.default", "vit_fast.rms_norm.default", "vit_fast.attention.default"} <= ops
