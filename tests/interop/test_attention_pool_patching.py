"""The attention-pool ("map") head on our kernels inside a user's model: timm's ``AttentionPoolLatent`` and
transformers' ``SiglipMultiheadAttentionPoolingHead``, patched by apply_vit_fast and judged by the numerics rule
against the same model in float64 (kernels in Triton's interpreter, tiny random SigLIP-like configs); what the
kernels do not run refused by name at patch time; masks, training and attentions requested take the head's own
forward."""

from __future__ import annotations

import copy

import pytest
import torch

import vit_fast
from vit_fast.interop.timm_blocks import PoolPlan

from ..fakes import check_first_use_net, count_calls, eager_and_float64, export_on_the_kernels
from ..numerics import assert_within_eager


def _randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter moved off its init (zero biases, unit norms, zero latents would hide a wrong operand)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval()


# ------------------------------------------------------------------------------ timm
def _timm():
    return pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")


SIGLIP = dict(depth=1, embed_dim=64, num_heads=2, img_size=32)  # 4 x 4 = 16 tokens, no class token


def _siglip_timm(pool_kwargs: dict | None = None, seed: int = 1):
    """A tiny SigLIP (timm's map head); ``pool_kwargs``: a head timm's presets do not build, put in its place."""
    timm = _timm()
    from timm.layers import AttentionPoolLatent

    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_siglip_224", pretrained=False, **SIGLIP)
    if pool_kwargs is not None:
        kwargs = {"num_heads": 2, **pool_kwargs}
        model.attn_pool = AttentionPoolLatent(64, norm_layer=torch.nn.LayerNorm, **kwargs)
    return _randomised(model, seed)


TIMM_HEADS = {
    "siglip (1 latent, token)": None,
    "3 latents, avg pool": dict(latent_len=3, pool_type="avg"),
    "3 latents, no pool": dict(latent_len=3, pool_type=""),
    "no q projection": dict(q_proj=False),
    "pre-logits (out_features=0)": dict(out_features=0),
    "4 heads of 16": dict(num_heads=4),
}


@pytest.mark.parametrize("head", sorted(TIMM_HEADS))
def test_timm_map_head_on_the_kernels_matches_float64(head, monkeypatch):
    model = _siglip_timm(TIMM_HEADS[head])
    x = torch.randn(2, 3, 32, 32)
    eager, expected = eager_and_float64(model, x)
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, PoolPlan)
    with torch.no_grad():
        ours = model(x)
    assert runs == [1], "the head took timm's forward"
    assert ours.shape == eager.shape
    assert_within_eager(ours, eager, expected, name=f"timm map head: {head}")
    assert vit_fast.remove_vit_fast(model) == len(model.blocks) + 1  # the blocks and the head
    with torch.no_grad():
        assert torch.equal(model(x), eager)


def test_timm_forward_head_pre_logits(monkeypatch):
    """forward_head on tokens (the head pools them) runs the kernels and matches float64."""
    model = _siglip_timm()
    tokens = torch.randn(2, 16, 64)
    with torch.no_grad():
        eager = model.forward_head(tokens, pre_logits=True)
        expected = copy.deepcopy(model).double().forward_head(tokens.double(), pre_logits=True)
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, PoolPlan)
    with torch.no_grad():
        ours = model.forward_head(tokens, pre_logits=True)
    assert runs == [1] and ours.shape == (2, 64)
    assert_within_eager(ours, eager, expected, name="forward_head pre_logits")


def test_timm_map_head_steps_aside_for_masks_training_and_float64(monkeypatch):
    model = _siglip_timm()
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, PoolPlan)
    pool = model.attn_pool
    tokens = torch.randn(2, 16, 64)
    mask = torch.zeros(2, 1, 1, 16)
    mask[..., 5] = float(
        "-inf"
    )  # a hole, not padding at the end (that runs on the kernels: tests/interop/test_naflex.py)
    with torch.no_grad():
        masked = pool(tokens, attn_mask=mask)
        expected = pool.__dict__["_vit_fast_original_forward"](tokens, attn_mask=mask)
        pool.double()(tokens.double())
    pool.float().train()
    pool(tokens)
    assert runs == [] and torch.equal(masked, expected)


def test_timm_torch_export_records_the_attention_pool_op():
    """backend='triton': torch.export of a patched SigLIP records vit_fast::attention_pool, and the exported
    program computes what timm computes."""
    model = _siglip_timm(seed=4)
    ops = export_on_the_kernels(model, torch.randn(2, 3, 32, 32), "exported patched SigLIP")
    assert {"vit_fast.attention_pool.default", "vit_fast.attention.default"} <= ops


# refused at patch time, by name; nothing is patched
TIMM_REFUSED = {
    "qk_norm": (dict(qk_norm=True), "attn_pool.q_norm (qk-norm)"),
    "pos_embed": (dict(pos_embed="abs", feat_size=16), "attn_pool.pos_embed"),
    "17 latents": (dict(latent_len=17), "latent_len 17 (the kernel takes 1..16 latents)"),
}


@pytest.mark.parametrize("feature", sorted(TIMM_REFUSED))
def test_timm_map_head_refusals_name_the_feature(feature):
    kwargs, expected = TIMM_REFUSED[feature]
    model = _siglip_timm(kwargs)
    with pytest.raises(ValueError, match="attention-pool head") as info:
        vit_fast.apply_vit_fast(model, backend="triton")
    assert expected in str(info.value)
    assert vit_fast.remove_vit_fast(model) == 0  # nothing was patched, the blocks included


# ------------------------------------------------------------------------------ transformers
def _siglip_hf(seed: int = 0, **extra):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(seed)
    config = transformers.SiglipVisionConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=4, intermediate_size=64
    )
    config._attn_implementation = "eager"  # sdpa has no attention probabilities to give back
    for key, value in extra.items():
        setattr(config, key, value)
    return _randomised(transformers.SiglipVisionModel(config), seed + 1)


def test_hf_siglip_pooling_head_on_the_kernels_matches_float64(monkeypatch):
    model = _siglip_hf()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        eager = model(pixel_values=x)
        expected = copy.deepcopy(model).double()(pixel_values=x.double())
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, PoolPlan)
    with torch.no_grad():
        ours = model(pixel_values=x)
    assert runs == [1], "the head took transformers' forward"
    assert_within_eager(ours.pooler_output, eager.pooler_output, expected.pooler_output, name="SigLIP pooler")
    assert_within_eager(
        ours.last_hidden_state, eager.last_hidden_state, expected.last_hidden_state, name="SigLIP tokens"
    )
    assert vit_fast.remove_vit_fast(model) == 2  # the layer and the head
    with torch.no_grad():
        assert torch.equal(model(pixel_values=x).pooler_output, eager.pooler_output)


def test_hf_siglip_head_follows_weight_updates(monkeypatch):
    """The packed in_proj is read as row slices on every call: a changed weight is seen at once."""
    model = _siglip_hf()
    x = torch.randn(1, 3, 16, 16)
    vit_fast.apply_vit_fast(model, backend="triton")
    with torch.no_grad():
        model.head.attention.in_proj_weight[40:50].mul_(-2.0)  # a k row
        model.head.attention.in_proj_bias[:5].add_(1.0)  # q biases
        ours = model(pixel_values=x).pooler_output
    vit_fast.remove_vit_fast(model)
    with torch.no_grad():
        eager = model(pixel_values=x).pooler_output
        expected = copy.deepcopy(model).double()(pixel_values=x.double()).pooler_output
    assert_within_eager(ours, eager, expected, name="after a weight update")


@pytest.mark.parametrize("how", ["kwarg", "config"])
def test_hf_attentions_requested_take_the_heads_own_forward(how, monkeypatch):
    """As for the layers (hf_patch): attentions requested, the whole call runs transformers' unfused path."""
    model = _siglip_hf()
    hf = copy.deepcopy(model)
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, PoolPlan)
    x = torch.randn(1, 3, 16, 16)
    kwargs = {"output_attentions": True} if how == "kwarg" else {}
    if how == "config":
        model.config.output_attentions = hf.config.output_attentions = True
    with torch.no_grad():
        ours, theirs = model(pixel_values=x, **kwargs), hf(pixel_values=x, **kwargs)
    assert runs == [] and len(ours.attentions) == 1
    torch.testing.assert_close(ours.pooler_output, theirs.pooler_output)


def test_hf_head_steps_aside_for_training_and_hooks(monkeypatch):
    model = _siglip_hf()
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, PoolPlan)
    x = torch.randn(1, 3, 16, 16)
    model.train()
    model(pixel_values=x)
    model.eval()
    seen = []
    model.head.mlp.fc1.register_forward_hook(lambda *_: seen.append(1))
    with torch.no_grad():
        model(pixel_values=x)
    assert runs == [] and seen == [1]


def test_hf_siglip_dual_model_patches_the_vision_head_only(monkeypatch):
    """SiglipModel: the vision tower's pooling head runs the kernels for image features; the text tower's head (a
    Linear) is left alone."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=4)
    text = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config = transformers.SiglipConfig(text_config=text, vision_config=dict(intermediate_size=64, **vision))
    model = _randomised(transformers.SiglipModel(config), 7)
    x = torch.randn(2, 3, 16, 16)

    def features(m, pixels):
        out = m.get_image_features(pixel_values=pixels)
        return getattr(out, "pooler_output", out)

    with torch.no_grad():
        eager = features(model, x)
        expected = features(copy.deepcopy(model).double(), x.double())
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, PoolPlan)
    with torch.no_grad():
        ours = features(model, x)
    assert runs == [1]
    assert_within_eager(ours, eager, expected, name="SiglipModel image features")
    assert vit_fast.remove_vit_fast(model) == 2  # one vision layer and the vision head


def test_first_use_check_judges_the_attention_pool(monkeypatch):
    """Under the first-use safety net the pool's first kernel output is judged and recorded as 'attention_pool'; a
    wrong kernel falls back to the eager reference and the model still matches timm in float64."""
    model = _siglip_timm()
    x = torch.randn(2, 3, 32, 32)
    check_first_use_net(monkeypatch, model, x, "attention_pool", "siglip map head")
