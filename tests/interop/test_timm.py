"""timm interop: from_timm / optimize against timm itself, on many variants with trained-like weights.

timm's model code imports on CPU machines through the tests' torchvision stand-in (conftest.py);
the GPU machine has the real torchvision. timm is installed by the project's set-up (Makefile)."""

import copy

import pytest
import torch

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")

import vit_fast  # noqa: E402

# small configs of real timm architectures: each kwarg is one timm create_model argument
CASES = {
    "vit_tiny_patch16_224": dict(img_size=64, depth=2),
    "deit_small_patch16_224": dict(img_size=48, depth=1),
    "vit_base_patch16_reg4_gap_256": dict(img_size=64, depth=1),
    "vit_small_patch14_reg4_dinov2": dict(img_size=56, depth=1),  # LayerScale, registers, no_embed_class
    "deit3_small_patch16_224": dict(img_size=48, depth=2),  # LayerScale, no_embed_class
    "vit_base_patch32_clip_224": dict(img_size=64, depth=1),  # pre-norm, no patch bias
    "vit_medium_patch16_gap_256": dict(img_size=48, depth=1),  # avg pool + fc_norm
    "vit_small_patch16_224": dict(img_size=32, depth=2, init_values=1e-5, qkv_bias=False),
    "vit_tiny_patch16_224/avg": dict(img_size=48, depth=1, class_token=False, global_pool="avg"),
    "vit_tiny_patch16_224/features": dict(img_size=32, depth=1, num_classes=0),
    "vit_base_patch32_clip_quickgelu_224": dict(img_size=64, depth=1),  # QuickGELU (OpenAI CLIP)
    "vit_tiny_patch16_224/silu": dict(img_size=32, depth=1, act_layer="silu"),
}


def _trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Perturb every parameter as training would: per-channel, signed LayerScale gammas and biases."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gamma"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)  # signed, far from the init value
            else:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def _create(case: str) -> torch.nn.Module:
    name = case.split("/")[0]
    return timm.create_model(name, pretrained=False, **CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_from_timm_matches(case):
    """Judged by the project's rule against timm's own model run in float64: ours may be at most 2x as far from it
    as timm in float32 (the eager patch embedding sums as one GEMM, timm's convolution in its own order)."""
    from ..numerics import assert_within_eager

    torch.manual_seed(0)
    ref = _trained_like(_create(case), seed=1)
    model = vit_fast.from_timm(ref).eval()
    size = CASES[case]["img_size"]
    x = torch.randn(2, 3, size, size)
    ref64 = copy.deepcopy(ref).double()
    with torch.no_grad():
        for what in ("forward_features", "__call__"):
            ours, theirs = getattr(model, what)(x), getattr(ref, what)(x)
            assert_within_eager(ours, theirs, getattr(ref64, what)(x.double()), name=f"{case} {what}")
    # the state_dict loads as it is, both ways, trained LayerScale gammas included
    ours = vit_fast.VisionTransformer(model.cfg, backend="torch")
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())
    if "gamma" in " ".join(n for n, _ in ref.named_parameters()):
        assert model.cfg.init_values is not None
        torch.testing.assert_close(model.blocks[0].ls1.gamma, ref.blocks[0].ls1.gamma, rtol=0, atol=0)


def test_timm_dynamic_img_size():
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=1, dynamic_img_size=True)
    model = vit_fast.optimize(_trained_like(ref, seed=2)).eval()
    x = torch.randn(1, 3, 96, 80)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)


# timm features vit-fast does not run: each is refused with a ValueError naming it, never an AttributeError
REFUSED = {
    "parallel blocks": ("vit_small_patch16_18x2_224", dict(depth=2), "ParallelThingsBlock"),
    "attention pooling": ("vit_base_patch16_siglip_224", dict(img_size=32, depth=1), "attention pooling"),
    "distillation token": ("deit_tiny_distilled_patch16_224", dict(img_size=32, depth=1), "VisionTransformerDistilled"),
    "qk norm": ("vit_tiny_patch16_224", dict(img_size=32, depth=1, qk_norm=True), "attn.q_norm"),
    "no final norm": ("vit_tiny_patch16_224", dict(img_size=32, depth=1, final_norm=False), "no final norm"),
    "no proj bias": ("vit_tiny_patch16_224", dict(img_size=32, depth=1, proj_bias=False), "proj_bias=False"),
    "other activation": ("vit_tiny_patch16_224", dict(img_size=32, depth=1, act_layer="relu"), "activation ReLU"),
    "hybrid embed": ("vit_tiny_r_s16_p8_224", dict(img_size=64, depth=1), "hybrid patch embedding HybridEmbed"),
    "other model class": ("eva02_tiny_patch14_224", dict(img_size=28, depth=1), "model class Eva"),
}


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_unsupported_timm_features_are_named(feature):
    name, kwargs, expected = REFUSED[feature]
    try:
        ref = timm.create_model(name, pretrained=False, **kwargs)
    except TypeError as err:  # an older timm without this argument
        pytest.skip(f"this timm ({timm.__version__}) cannot build {name} with {kwargs}: {err}")
    with pytest.raises(ValueError, match="uses features vit-fast does not support") as info:
        vit_fast.optimize(ref)
    assert expected in str(info.value)


def test_timm_conventions_are_kept():
    ref = _trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1), seed=3)
    model = vit_fast.optimize(ref).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats_ours, feats_ref = model.forward_features(x), ref.forward_features(x)
        torch.testing.assert_close(
            model.forward_head(feats_ours, pre_logits=True), ref.forward_head(feats_ref, pre_logits=True)
        )
    assert model.num_classes == ref.num_classes == 1000
    model.reset_classifier(0)
    ref.reset_classifier(0)
    assert model.num_classes == 0
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
    model.reset_classifier(7)
    assert model(x).shape == (2, 7) and model.head.weight.dtype == model.dtype


def test_timm_model_api_on_converted_models():
    """What timm users call on a timm ViT, on the converted one: widths, pretrained_cfg (timm's data config reads
    the source's mean/std/crop), forward_intermediates / get_intermediate_layers, set_grad_checkpointing."""
    ref = _trained_like(
        timm.create_model("vit_base_patch16_siglip_gap_224", pretrained=False, img_size=32, depth=3, embed_dim=64,
                          num_heads=2),
        seed=4,
    )  # fmt: skip
    model = vit_fast.optimize(ref).eval()
    assert (model.num_features, model.head_hidden_size) == (ref.num_features, ref.head_hidden_size) == (64, 64)
    ours_cfg, timm_cfg = timm.data.resolve_data_config({}, model=model), timm.data.resolve_data_config({}, model=ref)
    assert ours_cfg == timm_cfg and ours_cfg["mean"] == (0.5, 0.5, 0.5) and ours_cfg["crop_pct"] == 0.9
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for kwargs in (
            dict(indices=2),
            dict(indices=[0, -1], norm=True, output_fmt="NLC"),
            dict(indices=1, intermediates_only=True),
        ):
            ours, theirs = model.forward_intermediates(x, **kwargs), ref.forward_intermediates(x, **kwargs)
            if not kwargs.get("intermediates_only"):
                torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-5)
                ours, theirs = ours[1], theirs[1]
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        for a, b in zip(
            model.get_intermediate_layers(x, n=2, reshape=True), ref.get_intermediate_layers(x, n=2, reshape=True),
            strict=True,
        ):  # fmt: skip
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    model.train()
    model.set_grad_checkpointing(True)
    ref.train().set_grad_checkpointing(True)
    loss = model(x).square().sum()
    loss.backward()
    assert model.grad_checkpointing and model.blocks[0].attn.qkv.weight.grad is not None
    plain = vit_fast.optimize(ref)
    plain(x).square().sum().backward()
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight.grad, plain.blocks[0].attn.qkv.weight.grad)


def test_pretrained_cfg_of_a_model_built_here():
    model = vit_fast.VisionTransformer(vit_fast.ViTConfig(img_size=32, patch_size=16, embed_dim=32, depth=1,
                                                          num_heads=2))  # fmt: skip
    assert timm.data.resolve_data_config({}, model=model)["input_size"] == (3, 32, 32)


@pytest.mark.parametrize("act_layer", ["quick_gelu", "silu"])
def test_converted_model_runs_new_activations_on_the_kernels(act_layer):
    """from_timm of a QuickGELU / SiLU ViT on the triton backend (interpreter) against timm in float64."""
    from ..numerics import assert_within_eager

    ref = _trained_like(
        timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, embed_dim=64, num_heads=2,
                          act_layer=act_layer),
        seed=6,
    )  # fmt: skip
    model = vit_fast.from_timm(ref, backend="triton").eval()
    assert model.cfg.act == act_layer
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_within_eager(model(x), ref(x), copy.deepcopy(ref).double()(x.double()), name=f"{act_layer} triton")
