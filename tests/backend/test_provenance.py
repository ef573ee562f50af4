"""Provenance and round trips: a Hugging Face folder records each weight file's SHA-256, as a checkpoint file
does, and set_input_normalization survives save_checkpoint / load_checkpoint (uint8 input works after a reload)."""

from __future__ import annotations

import pytest
import torch

import vit_fast
from vit_fast.interop.checkpoints import NORMALIZATION_METADATA_KEY, file_sha256

from ..fakes import tiny_hf_classifier

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _model() -> vit_fast.VisionTransformer:
    cfg = vit_fast.ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    model = vit_fast.VisionTransformer(cfg, backend="torch").eval()
    model.init_weights(seed=1)
    return model


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_input_normalization_survives_a_checkpoint(tmp_path, suffix):
    model = _model().set_input_normalization(MEAN, STD)
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    with torch.no_grad():
        expected = model(images)
    path = vit_fast.save_checkpoint(model, tmp_path / f"m{suffix}")
    loaded = vit_fast.load_checkpoint(path, backend="torch").eval()
    torch.testing.assert_close(loaded.input_mean, torch.tensor(MEAN))
    torch.testing.assert_close(loaded.input_std, torch.tensor(STD))
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), expected, rtol=0, atol=0)


def test_a_model_without_normalization_reloads_without_it(tmp_path):
    path = vit_fast.save_checkpoint(_model(), tmp_path / "m.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert NORMALIZATION_METADATA_KEY not in (f.metadata() or {})
    assert vit_fast.load_checkpoint(path, backend="torch").input_mean is None


def test_unreadable_normalization_is_named(tmp_path):
    path = vit_fast.save_checkpoint(_model(), tmp_path / "m.pth", extra={NORMALIZATION_METADATA_KEY: "{not json"})
    with pytest.raises(ValueError, match="input normalisation .* cannot be read.*re-save"):
        vit_fast.load_checkpoint(path, backend="torch")


def test_hf_folder_records_each_weight_files_sha256(tmp_path):
    tiny_hf_classifier(num_labels=3, image_size=16).save_pretrained(tmp_path / "folder")
    weights = sorted(p for p in (tmp_path / "folder").iterdir() if p.suffix == ".safetensors")
    assert weights
    model = vit_fast.load_model(str(tmp_path / "folder"), backend="torch")
    src = model.weights_source
    assert src["kind"] == "hf-folder" and src["name"] == "folder"
    assert src["files"] == {p.name: file_sha256(p) for p in weights}
    described = model.describe_weights()
    assert all(f"{p.name} sha256:{file_sha256(p)[:12]}" in described for p in weights)


def test_hf_dropin_never_reads_the_deprecated_use_return_dict(monkeypatch):
    """transformers 5 logs "`use_return_dict` is deprecated" on every read of that property: the patched layers of
    an optimized model never read it (return_dict itself is transformers' own forward's business)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")

    def refuse(self):
        raise AssertionError("use_return_dict read")

    monkeypatch.setattr(transformers.PretrainedConfig, "use_return_dict", property(refuse))
    cfg = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=16, patch_size=8
    )
    model = vit_fast.optimize(transformers.ViTForImageClassification(cfg).eval()).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert hasattr(model(pixel_values=x), "logits")
