"""Parity with Hugging Face transformers ViT on CPU, float32, including odd token counts."""

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")

import vit_fast  # noqa: E402
from vit_fast.interop.checkpoints import load_checkpoint  # noqa: E402
from vit_fast.interop.convert import convert_hf_state_dict  # noqa: E402

# name -> (transformers ViTConfig kwargs); token counts in the comments
CONFIGS = {
    "37tok_48px_p8": dict(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=192, image_size=48, patch_size=8
    ),  # 36 patches + cls = 37 tokens
    "65tok_32px_p4_1ch": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        image_size=32,
        patch_size=4,
        num_channels=1,
    ),  # 65 tokens
    "2tok_16px_p16_noqkvbias": dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=96,
        image_size=16,
        patch_size=16,
        qkv_bias=False,
    ),
    "50tok_56px_p8_gelu_new": dict(
        hidden_size=80,
        num_hidden_layers=3,
        num_attention_heads=5,
        intermediate_size=320,
        image_size=56,
        patch_size=8,
        hidden_act="gelu_new",
    ),
}


def _hf(kind: str, **kwargs):
    torch.manual_seed(0)
    config = transformers.ViTConfig(num_labels=11, **kwargs)
    cls = transformers.ViTForImageClassification if kind == "cls" else transformers.ViTModel
    model = cls(config).eval()
    with torch.no_grad():  # HF zero-inits biases and LayerNorm; randomise so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    delta = (ours - theirs).abs().max().item()
    scale = max(1.0, theirs.abs().max().item())
    assert delta <= 1e-5 * scale, f"max |delta| {delta:.3e} exceeds 1e-5 relative (scale {scale:.3g})"
    return delta


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_classification_parity(name):
    hf = _hf("cls", **CONFIGS[name])
    model = vit_fast.from_hf(hf).eval()
    x = torch.randn(3, hf.config.num_channels, hf.config.image_size, hf.config.image_size)
    with torch.no_grad():
        expected = hf(pixel_values=x)
        logits, tokens = model(x), model.forward_features(x)
    assert tokens.shape[1] == (hf.config.image_size // hf.config.patch_size) ** 2 + 1
    d_logits = _close(logits, expected.logits)
    hidden = hf.vit(pixel_values=x).last_hidden_state
    d_tokens = _close(tokens, hidden)
    print(f"{name}: tokens={tokens.shape[1]} max|dlogits|={d_logits:.2e} max|dtokens|={d_tokens:.2e}")


def test_vitmodel_parity_and_pooled_features():
    hf = _hf("base", **CONFIGS["37tok_48px_p8"])
    model = vit_fast.from_hf(hf).eval()
    assert model.cfg.num_classes == 0
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        hidden = hf(pixel_values=x).last_hidden_state
        _close(model.forward_features(x), hidden)
        _close(model(x), hidden[:, 0])  # pooled = normalised class token (HF's dense+tanh pooler is not ViT)


def test_transformers_4x_checkpoint_names(tmp_path):
    """A checkpoint written with transformers 4.x names loads through the same converter."""
    from safetensors.torch import save_file

    hf = _hf("cls", **CONFIGS["37tok_48px_p8"])
    renames = {
        "vit.layers.": "vit.encoder.layer.",
        ".attention.q_proj.": ".attention.attention.query.",
        ".attention.k_proj.": ".attention.attention.key.",
        ".attention.v_proj.": ".attention.attention.value.",
        ".attention.o_proj.": ".attention.output.dense.",
        ".mlp.fc1.": ".intermediate.dense.",
        ".mlp.fc2.": ".output.dense.",
    }
    old = {}
    for key, value in hf.state_dict().items():
        for a, b in renames.items():
            key = key.replace(a, b)
        old[key] = value.contiguous()
    assert any("attention.attention.query" in k for k in old)
    path = tmp_path / "hf4.safetensors"
    save_file(old, str(path))
    cfg = vit_fast.from_hf(hf).cfg
    model = load_checkpoint(path, cfg=cfg).eval()
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        _close(model(x), hf(pixel_values=x).logits)
    assert set(convert_hf_state_dict(old)) == set(model.state_dict())


def test_converted_model_keeps_dtype():
    hf = _hf("cls", **CONFIGS["2tok_16px_p16_noqkvbias"]).to(torch.float64)
    model = vit_fast.from_hf(hf)
    assert model.dtype == torch.float64


def test_from_hf_rejects_other_models():
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    with pytest.raises(TypeError, match="ViTModel and ViTForImageClassification, got BertModel"):
        vit_fast.from_hf(transformers.BertModel(config))


def test_unknown_hf_key_is_named():
    hf = _hf("cls", **CONFIGS["2tok_16px_p16_noqkvbias"])
    state = dict(hf.state_dict())
    state["vit.layers.0.attention.rotary.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"vit.layers.0.attention.rotary.weight"):
        convert_hf_state_dict(state)


def test_optimize_keeps_the_users_class():
    """optimize(hf) is a patched copy of the transformers model (tests/interop/test_hf_patch.py); from_hf is vit-fast's
    own."""
    hf = _hf("cls", **CONFIGS["37tok_48px_p8"])
    model = vit_fast.optimize(hf)
    assert type(model) is transformers.ViTForImageClassification and model is not hf
    assert model.training == hf.training
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        _close(model(pixel_values=x).logits, hf(pixel_values=x).logits)


def test_from_hf_at_another_image_size_resamples_pos_embed():
    hf = _hf("cls", **CONFIGS["37tok_48px_p8"])
    model = vit_fast.from_hf(hf, img_size=64).eval()
    assert model.cfg.num_tokens == 65 and model.pos_embed.shape == (1, 65, 48)
    expected = vit_fast.backend.pos_embed.resample_pos_embed(hf.vit.embeddings.position_embeddings, (8, 8), (6, 6), 1)
    torch.testing.assert_close(model.pos_embed, expected, rtol=0, atol=0)
    assert torch.isfinite(model(torch.randn(1, 3, 64, 64))).all()


def test_load_model_from_a_saved_hf_folder_keeps_the_classifier(tmp_path):
    hf = _hf("cls", **CONFIGS["37tok_48px_p8"])
    hf.save_pretrained(tmp_path / "hf_vit")
    model = vit_fast.load_model(str(tmp_path / "hf_vit"), backend="torch")
    assert model.cfg.num_classes == 11
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        _close(model(x), hf(pixel_values=x).logits)
