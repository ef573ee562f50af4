"""transformers' SigLIP 2 at native resolution: patches of images of different sizes padded into one batch
(``pixel_values [B, T, C * p * p]``, ``pixel_attention_mask [B, T]``, ``spatial_shapes [B, 2]``), its encoder layers
and attention-pool head patched by apply_vit_fast / optimize, the padding mask read as per-sample lengths. Judged by
the numerics rule against the same model in float64 at valid tokens and the pooled output; padding poisoned with
NaN must not reach them."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")

import vit_fast  # noqa: E402
from vit_fast.interop import hf_patch  # noqa: E402
from vit_fast.interop.forwards import is_patched  # noqa: E402

from ..fakes import assert_attention_launches, kernel_launches, siglip2_batch  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

PATCH = 4
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=PATCH)
VISION["num_patches"] = 16  # a 4 x 4 position-embedding grid, resized to each image's


def _randomised(model):
    with torch.no_grad():  # HF zero-inits biases and LayerNorm; randomise so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _vision_model(attn: str = "sdpa"):
    torch.manual_seed(0)
    config = transformers.Siglip2VisionConfig(**VISION)
    config._attn_implementation = attn  # sdpa: a boolean mask reaches the layers; eager: an additive one
    return _randomised(transformers.Siglip2VisionModel(config))


#: patch-grid mixes: padded twice, and once with every image the same number of patches
MIXES = {
    "2x2 + 2x4": [(2, 2), (2, 4)],
    "1x3 + 2x2 + 3x3": [(1, 3), (2, 2), (3, 3)],
    "2x3 + 3x2, no padding": [(2, 3), (3, 2)],
}


def _outputs(model, batch):
    with torch.no_grad():
        out = model(**batch)
    valid = batch["pixel_attention_mask"].bool()
    return out.last_hidden_state[valid], out.pooler_output


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("backend", ["triton", "auto"])
def test_siglip2_vision_model_matches_at_native_resolution(mix, backend, attn, monkeypatch):
    """backend "triton": every layer and the pooling head on the kernels (the attention kernels where no image is
    padded, PyTorch's masked attention otherwise); backend "auto" on a CPU: transformers' own forwards."""
    model = _vision_model(attn)
    batch = siglip2_batch(MIXES[mix], PATCH, seed=1)
    padded = not bool(batch["pixel_attention_mask"].all())
    eager_tokens, eager_pooled = _outputs(model, batch)
    reference = copy.deepcopy(model).double()
    tokens64, pooled64 = _outputs(reference, dict(batch, pixel_values=batch["pixel_values"].double()))
    vit_fast.apply_vit_fast(model, backend=backend)
    runs: list[int] = []
    real = hf_patch._run_view
    monkeypatch.setattr(hf_patch, "_run_view", lambda view, *a: runs.append(1) or real(view, *a))
    if backend == "triton" and padded:  # poisoned padding: nothing of it may reach a valid token or the pool
        keep = batch["pixel_attention_mask"].bool()[..., None]
        batch = dict(batch, pixel_values=batch["pixel_values"].masked_fill(~keep, float("nan")))
    (tokens, pooled), launches = kernel_launches(lambda: _outputs(model, batch))
    assert_within_eager(tokens, eager_tokens, tokens64, name="valid tokens")
    assert_within_eager(pooled, eager_pooled, pooled64, name="pooler_output")
    if backend == "auto":
        assert runs == [] and not launches
        return
    assert len(runs) == VISION["num_hidden_layers"] and launches["_linear_kernel"]
    assert_attention_launches(launches, VISION["num_hidden_layers"], pool=1, padded=padded)


def test_a_mask_other_than_key_padding_runs_transformers_layers(monkeypatch):
    """Padding inside a row: transformers' own layers and head, the same numbers."""
    model = _vision_model()
    batch = siglip2_batch(MIXES["1x3 + 2x2 + 3x3"], PATCH, seed=2)
    batch["pixel_attention_mask"][2, 1] = 0
    eager = _outputs(model, batch)
    vit_fast.apply_vit_fast(model, backend="triton")
    ours, launches = kernel_launches(lambda: _outputs(model, batch))
    assert not launches and all(torch.equal(a, b) for a, b in zip(ours, eager, strict=True))


def _dual_config(**vision):
    text = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    return transformers.Siglip2Config(text_config=text, vision_config=dict(VISION, **vision))


@pytest.mark.parametrize("how", ["apply_vit_fast", "optimize"])
def test_siglip2_model_vision_tower_patched(how, monkeypatch):
    """Siglip2Model: the vision tower's layers and head patched (in place, or on optimize's copy), the text tower
    left alone; image features with a padded batch within the rule."""
    torch.manual_seed(0)
    model = _randomised(transformers.Siglip2Model(_dual_config()))
    batch = siglip2_batch(MIXES["2x2 + 2x4"], PATCH, seed=3)

    def features(m, b):
        with torch.no_grad():
            return m.get_image_features(**b).pooler_output

    eager = features(model, batch)
    expected = features(copy.deepcopy(model).double(), dict(batch, pixel_values=batch["pixel_values"].double()))
    patched = vit_fast.apply_vit_fast(model, backend="triton") if how == "apply_vit_fast" else None
    if how == "optimize":
        patched = vit_fast.optimize(model, backend="triton")
        assert patched is not model and not any(is_patched(m) for m in model.modules())
    assert type(patched) is transformers.Siglip2Model
    vision = [m for m in patched.vision_model.modules() if is_patched(m)]
    assert len(vision) == VISION["num_hidden_layers"] + 1  # layers and the pooling head
    assert not any(is_patched(m) for m in patched.text_model.modules())
    image_features, launches = kernel_launches(lambda: features(patched, batch))
    assert_within_eager(image_features, eager, expected, name="image features")
    assert launches["_linear_kernel"]


def test_siglip2_image_classification_patched(monkeypatch):
    torch.manual_seed(0)
    config = _dual_config()
    config.num_labels = 5
    model = _randomised(transformers.Siglip2ForImageClassification(config))
    batch = siglip2_batch(MIXES["1x3 + 2x2 + 3x3"], PATCH, seed=4)
    with torch.no_grad():
        eager = model(**batch).logits
        expected = copy.deepcopy(model).double()(**dict(batch, pixel_values=batch["pixel_values"].double())).logits
        vit_fast.apply_vit_fast(model, backend="triton")
        ours, launches = kernel_launches(lambda: model(**batch).logits)
    assert_within_eager(ours, eager, expected, name="logits")
    assert launches["_linear_kernel"]


def test_siglip2_small_head_dim_refused_by_name():
    config = transformers.Siglip2VisionConfig(**dict(VISION, hidden_size=16))  # 2 heads of 8
    model = transformers.Siglip2VisionModel(config)
    with pytest.raises(ValueError, match=r"Siglip2VisionModel has head_dim 8 .* head dims 16\.\."):
        vit_fast.apply_vit_fast(model, backend="triton")
