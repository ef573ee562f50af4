"""Vision-language models (LLaVA with a CLIP tower, PaliGemma with SigLIP, Idefics3 with its SigLIP-like tower):
``optimize`` / ``apply_vit_fast`` patch the vision tower's encoder layers and leave the language model alone. Kernels
in Triton's interpreter, tiny configs built here, judged by the numerics rule against the unpatched model in
float64."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")

import vit_fast  # noqa: E402
from vit_fast.interop import hf_classes, hf_patch  # noqa: E402
from vit_fast.interop.forwards import is_patched  # noqa: E402

from ..fakes import assert_attention_launches, count_calls, kernel_launches  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4)
TEXT = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
IMAGE_TOKEN = 63
#: family -> (model class, its config class, the vision config class, the text config class, image tokens per image)
VLMS = {
    "llava": ("LlavaForConditionalGeneration", "LlavaConfig", "CLIPVisionConfig", "LlamaConfig", 16),
    "paligemma": ("PaliGemmaForConditionalGeneration", "PaliGemmaConfig", "SiglipVisionConfig", "GemmaConfig", 16),
    "idefics3": ("Idefics3ForConditionalGeneration", "Idefics3Config", "Idefics3VisionConfig", "LlamaConfig", 4),
}


def _vlm(family: str, vision_config: str | None = None, cls_name: str | None = None) -> torch.nn.Module:
    main, config_name, vision_name, text_name, _ = VLMS[family]
    vision = getattr(transformers, vision_config or vision_name)(intermediate_size=64, **VISION)
    text = getattr(transformers, text_name)(intermediate_size=48, head_dim=16, **TEXT)
    extra = {"llava": {"image_token_index": IMAGE_TOKEN}, "paligemma": {"image_token_index": IMAGE_TOKEN}}
    extra["paligemma"]["projection_dim"] = 32
    extra["idefics3"] = {"image_token_id": IMAGE_TOKEN, "scale_factor": 2}
    config = getattr(transformers, config_name)(vision_config=vision, text_config=text, **extra[family])
    for sub in (config, config.vision_config, config.text_config):
        sub._attn_implementation = "eager"  # the same attention on both sides of the comparison
    torch.manual_seed(0)
    model = getattr(transformers, cls_name or main)(config).eval()
    with torch.no_grad():  # zero-initialised biases and norms: randomised so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _inputs(family: str) -> dict[str, torch.Tensor]:
    """Two prompts: the image tokens, then five text tokens; and their images."""
    tokens = VLMS[family][4]
    gen = torch.Generator().manual_seed(1)
    ids = torch.cat([torch.full((2, tokens), IMAGE_TOKEN), torch.randint(0, 60, (2, 5), generator=gen)], 1)
    shape = (2, 1, 3, 16, 16) if family == "idefics3" else (2, 3, 16, 16)  # Idefics3: images per prompt
    inputs = {"input_ids": ids, "pixel_values": torch.randn(shape, generator=gen)}
    if family == "paligemma":  # the image tokens are the prefix
        inputs["token_type_ids"] = (torch.arange(ids.shape[1]) >= tokens).long().expand(2, -1)
    return inputs


def _language_model(model: torch.nn.Module) -> torch.nn.Module:
    inner = model.model
    return getattr(inner, "language_model", None) or inner.text_model


@pytest.mark.parametrize("family", sorted(VLMS))
def test_optimize_patches_the_vision_tower_and_leaves_the_language_model_alone(family, monkeypatch):
    """The logits of the whole model (image tokens through the projector into the language model) within the rule of
    the unpatched model in float64; both vision layers ran on the kernels and launched the attention kernel; no
    module outside the vision tower was patched and the language model's weights are the same tensors' values."""
    model = _vlm(family)
    inputs = _inputs(family)
    with torch.no_grad():
        eager = model(**inputs).logits
        floats = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
        expected = copy.deepcopy(model).double()(**floats).logits
    patched = vit_fast.optimize(model, backend="triton")
    tower = hf_classes.vision_root(patched)
    assert type(tower).__name__ in hf_classes.TOWER_CLASSES
    inside = {id(m) for m in tower.modules()}
    assert [n for n, m in patched.named_modules() if is_patched(m) and id(m) not in inside] == []
    assert not any(is_patched(m) or "forward" in m.__dict__ for m in _language_model(patched).modules())
    runs = count_calls(monkeypatch, hf_patch, "_run_view")
    with torch.no_grad():
        ours, launched = kernel_launches(lambda: patched(**inputs).logits)
    assert len(runs) == 2, launched
    assert_attention_launches(launched, 2, pool=len(hf_patch.pool_heads(patched)), padded=False)
    assert_within_eager(ours, eager, expected, name=f"{family} logits")
    for (name, ours_p), theirs in zip(
        _language_model(patched).state_dict().items(), _language_model(model).state_dict().values(), strict=True
    ):
        assert torch.equal(ours_p, theirs), name
    report = vit_fast.explain(patched)
    assert len(report.patched) == 2 + len(hf_patch.pool_heads(patched)) and not report.left_alone
    assert any("language model and the projector run transformers' own code" in note for note in report.notes)
    assert vit_fast.remove_vit_fast(patched) == 2 + len(hf_patch.pool_heads(patched))


@pytest.mark.parametrize(
    ("family", "cls_name"),
    [("llava", "LlavaModel"), ("paligemma", "PaliGemmaModel"), ("idefics3", "Idefics3Model")],
)
def test_the_inner_model_patches_the_same_tower(family, cls_name):
    model = vit_fast.apply_vit_fast(_vlm(family, cls_name=cls_name), backend="triton")
    tower = {id(m) for m in hf_classes.vision_root(model).modules()}
    patched = [m for m in model.modules() if is_patched(m)]
    assert len(patched) == 2 + len(hf_patch.pool_heads(model)) and all(id(m) in tower for m in patched)


def test_idefics3_vision_transformer_alone_runs_the_kernels(monkeypatch):
    tower = _vlm("idefics3").model.vision_model
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        eager = tower(pixel_values=x).last_hidden_state
        expected = copy.deepcopy(tower).double()(pixel_values=x.double()).last_hidden_state
    patched = vit_fast.optimize(tower, backend="triton")
    runs = count_calls(monkeypatch, hf_patch, "_run_view")
    with torch.no_grad():
        ours = patched(pixel_values=x).last_hidden_state
    assert len(runs) == 2
    assert_within_eager(ours, eager, expected, name="Idefics3VisionTransformer")


def test_every_vlm_class_is_patched():
    """Each model class transformers has for LLaVA, PaliGemma and Idefics3 (less the abstract base) is patched."""
    import importlib

    for family in VLMS:
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        names = {n for n in module.__all__ if not n.endswith("PreTrainedModel")}
        assert names == set(hf_classes.SUPPORTED[family]), family


def test_a_tower_vit_fast_does_not_patch_is_refused_with_its_reason():
    """A LLaVA whose vision tower is a BEiT: refused before any patch, naming the tower and why."""
    model = _vlm("llava", vision_config="BeitConfig")
    with pytest.raises(TypeError, match=r"vision tower is a BeitModel \(BeitModel is a model with relative position"):
        vit_fast.optimize(model)
    assert not any(is_patched(m) for m in model.modules())
