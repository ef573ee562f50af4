"""apply_vit_fast: a user's own timm / Hugging Face ViT runs its blocks on our kernels, in place,
while the object, its class and its state_dict stay the user's. Kernels run in Triton's
interpreter here (backend="triton"), judged by the numerics rule against float64."""

from __future__ import annotations

import copy

import pytest
import torch

import vit_fast

from .numerics import assert_within_eager


def _check_in_place(model, run, x):
    keys, cls = list(model.state_dict()), type(model)
    ref64 = copy.deepcopy(model).double()
    with torch.no_grad():
        eager = run(model, x)
        expected = run(ref64, x.double())
        vit_fast.apply_vit_fast(model, backend="triton")
        assert type(model) is cls and list(model.state_dict()) == keys
        ours = run(model, x)
    assert_within_eager(ours, eager, expected, name="patched model")
    assert vit_fast.remove_vit_fast(model) > 0
    with torch.no_grad():
        assert torch.equal(run(model, x), eager)  # the original forwards are back


def test_timm_model_patched_in_place():
    timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it)")
    model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=28, depth=2).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    _check_in_place(model, lambda m, x: m.forward_features(x), torch.randn(2, 3, 28, 28))


@pytest.mark.parametrize("cls_name", ["ViTForImageClassification", "ViTModel"])
def test_hf_model_patched_in_place(cls_name):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        num_labels=5,
    )
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)

    def run(m, x):
        out = m(pixel_values=x)
        return out.logits if cls_name == "ViTForImageClassification" else out.last_hidden_state

    _check_in_place(model, run, torch.randn(3, 3, 16, 16))


def test_patched_hf_model_follows_weight_updates():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=8, patch_size=4
    )
    model = transformers.ViTModel(config).eval()
    vit_fast.apply_vit_fast(model, backend="triton")
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        before = model(pixel_values=x).last_hidden_state
        model.layers[0].attention.k_proj.weight.mul_(2.0)  # the fused qkv copy must see this
        after = model(pixel_values=x).last_hidden_state
        vit_fast.remove_vit_fast(model)
        expected = model(pixel_values=x).last_hidden_state
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-5)


def test_unknown_models_are_refused():
    with pytest.raises(TypeError, match=r"apply_vit_fast does not know torch.nn.modules.linear.Linear"):
        vit_fast.apply_vit_fast(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"backend must be one of"):
        vit_fast.apply_vit_fast(torch.nn.Linear(2, 2), backend="cuda")
