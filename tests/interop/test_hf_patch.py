"""vit_fast.interop.hf_patch: transformers' own vision models (ViT, DeiT, DINOv2, CLIP, SigLIP, SigLIP 2) with their
encoder layers on our kernels, in place (apply_vit_fast) or as a patched copy (optimize), still instances of the
user's class. Kernels run in Triton's interpreter (backend="triton"); every model is judged by the numerics
rule against the same model in float64, on random weights and tiny configs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")

import vit_fast  # noqa: E402
from vit_fast.interop import hf_classes, hf_patch  # noqa: E402

from ..fakes import (  # noqa: E402
    as_float64,
    assert_attention_launches,
    count_calls,
    kernel_launches,
    requiring_grad,
    siglip2_batch,
)
from ..numerics import assert_within_eager  # noqa: E402

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4)


def _config(family: str, **extra):
    extra = {**TINY, **extra}
    if family == "vit":
        return transformers.ViTConfig(intermediate_size=64, num_labels=5, **extra)
    if family == "deit":
        return transformers.DeiTConfig(intermediate_size=48, num_labels=5, **extra)
    if family == "dinov2":
        return transformers.Dinov2Config(mlp_ratio=2, num_labels=5, **extra)
    if family == "dinov2_with_registers":
        return transformers.Dinov2WithRegistersConfig(mlp_ratio=2, num_register_tokens=2, num_labels=5, **extra)
    if family == "vit_mae":  # a one-layer decoder of its own width and heads (head dim 16), patched too
        decoder = dict(decoder_hidden_size=48, decoder_num_hidden_layers=1, decoder_num_attention_heads=3)
        return transformers.ViTMAEConfig(
            intermediate_size=64, decoder_intermediate_size=40, mask_ratio=0.5, **decoder, **extra
        )
    if family == "vit_msn":
        return transformers.ViTMSNConfig(intermediate_size=64, num_labels=5, **extra)
    if family == "ijepa":
        return transformers.IJepaConfig(intermediate_size=64, num_labels=5, **extra)
    if family == "clip_vision":
        return transformers.CLIPVisionConfig(intermediate_size=64, **extra)  # quick_gelu
    if family == "siglip_vision":
        return transformers.SiglipVisionConfig(intermediate_size=64, **extra)  # gelu_pytorch_tanh
    siglip2 = dict(intermediate_size=64, num_patches=16, **{k: v for k, v in extra.items() if k != "image_size"})
    if family == "siglip2_vision":  # native resolution: a 4 x 4 position-embedding grid, resized to each image's
        return transformers.Siglip2VisionConfig(**siglip2)
    text = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    if family == "clip":
        return transformers.CLIPConfig(
            text_config=text, vision_config=dict(intermediate_size=64, **extra), projection_dim=8, num_labels=5
        )
    if family == "siglip":
        return transformers.SiglipConfig(
            text_config=text, vision_config=dict(intermediate_size=64, **extra), num_labels=5
        )
    if family == "siglip2":
        return transformers.Siglip2Config(text_config=text, vision_config=siglip2, num_labels=5)
    raise KeyError(family)


def _model(cls_name: str, family: str, **extra):
    torch.manual_seed(0)
    config = _config(family, **extra)
    config._attn_implementation = "eager"  # sdpa has no attention probabilities to give back
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():  # HF zero-inits biases and LayerNorm; randomise so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _image_features(model, x):
    return _features(model, {"pixel_values": x})


def _features(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """A dual model's image features for its vision inputs (``get_image_features``)."""
    out = model.get_image_features(**inputs)
    return getattr(out, "pooler_output", out)


# (class, family, extra config, what to compare)
CASES = {
    "ViTForImageClassification": ("ViTForImageClassification", "vit", {}, lambda m, x: m(pixel_values=x).logits),
    "ViTModel": ("ViTModel", "vit", {}, lambda m, x: m(pixel_values=x).pooler_output),
    "DeiTForImageClassificationWithTeacher": (
        "DeiTForImageClassificationWithTeacher",
        "deit",
        {},
        lambda m, x: m(pixel_values=x).logits,
    ),
    "Dinov2Model-layerscale": ("Dinov2Model", "dinov2", {}, lambda m, x: m(pixel_values=x).last_hidden_state),
    "Dinov2ForImageClassification-swiglu": (
        "Dinov2ForImageClassification",
        "dinov2",
        {"use_swiglu_ffn": True},
        lambda m, x: m(pixel_values=x).logits,
    ),
    "CLIPVisionModel-quick_gelu": (
        "CLIPVisionModel",
        "clip_vision",
        {},
        lambda m, x: m(pixel_values=x).last_hidden_state,
    ),
    "CLIPModel-vision-tower": ("CLIPModel", "clip", {}, _image_features),
    "SiglipVisionModel-attention-pool-head": (
        "SiglipVisionModel",
        "siglip_vision",
        {},
        lambda m, x: m(pixel_values=x).pooler_output,
    ),
}


def _count_fused(monkeypatch) -> list[int]:
    """Runs of an encoder layer on the kernel path (``_run_view``; a fallback to transformers' forward runs none)."""
    return count_calls(monkeypatch, hf_patch, "_run_view")


@pytest.mark.parametrize("case", sorted(CASES))
def test_patched_in_place_matches_float64(case, monkeypatch):
    cls_name, family, extra, run = CASES[case]
    model = _model(cls_name, family, **extra)
    keys, cls = list(model.state_dict()), type(model)
    ref64 = copy.deepcopy(model).double()
    x = torch.randn(3, 3, 16, 16)
    calls = _count_fused(monkeypatch)
    with torch.no_grad():
        eager, expected = run(model, x), run(ref64, x.double())
        assert vit_fast.apply_vit_fast(model, backend="triton") is model
        assert type(model) is cls and list(model.state_dict()) == keys
        ours = run(model, x)
    assert len(calls) == 2, f"{len(calls)} of 2 vision layers ran on the kernels"  # and a CLIP text tower none
    assert_within_eager(ours, eager, expected, name=case)
    assert vit_fast.remove_vit_fast(model) == 2 + len(hf_patch.pool_heads(model))  # SigLIP's head is patched too
    with torch.no_grad():
        assert torch.equal(run(model, x), eager)


def test_dinov2_swiglu_gates_in_the_gemm_epilogue():
    """DINOv2's SwiGLU FFN: gate_proj and up_proj stacked into one GEMM whose epilogue writes ``silu(gate) * up``
    (one gated launch per layer), no eager gate between fc1 and fc2."""
    from vit_fast.kernels.launches import record_launches

    model = _model("Dinov2ForImageClassification", "dinov2", use_swiglu_ffn=True)
    x = torch.randn(2, 3, 16, 16)
    ref64 = copy.deepcopy(model).double()
    with torch.no_grad():
        eager, expected = model(pixel_values=x).logits, ref64(pixel_values=x.double()).logits
        vit_fast.apply_vit_fast(model, backend="triton")
        with record_launches() as launches:
            ours = model(pixel_values=x).logits
    gates = [launch["config"]["GATE"] for launch in launches if launch["kernel"] == "_linear_kernel"]
    assert gates.count(1) == 2 and len(gates) == 4 * 2  # 2 layers: qkv, proj, gated fc1, fc2
    assert_within_eager(ours, eager, expected, name="DINOv2 SwiGLU gated")


def test_optimize_returns_a_patched_copy_of_the_users_class(tmp_path, monkeypatch):
    hf = _model("ViTForImageClassification", "vit")
    model = vit_fast.optimize(hf, backend="triton")
    assert type(model) is type(hf) and isinstance(model, transformers.PreTrainedModel)
    assert model is not hf and all("_vit_fast_original_forward" not in m.__dict__ for m in hf.modules())
    assert list(model.state_dict()) == list(hf.state_dict())  # Hugging Face names
    assert model.num_parameters() == hf.num_parameters()
    x = torch.randn(2, 3, 16, 16)
    labels = torch.tensor([1, 3])
    calls = _count_fused(monkeypatch)
    with torch.no_grad():
        ours, theirs = model(pixel_values=x, labels=labels), hf(pixel_values=x, labels=labels)
    assert len(calls) == 2
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.loss, theirs.loss, rtol=1e-4, atol=1e-5)
    model.save_pretrained(tmp_path / "saved")
    loaded = transformers.ViTForImageClassification.from_pretrained(tmp_path / "saved").eval()
    for key, value in hf.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    with pytest.raises(ValueError, match=r"backend 'torch' .*vit_fast.from_hf\(model, backend='torch'\)"):
        vit_fast.optimize(hf, backend="torch")


def test_training_and_gradient_checkpointing_run_transformers_own_forward(monkeypatch):
    model = vit_fast.optimize(_model("ViTForImageClassification", "vit"), backend="triton")
    reference = copy.deepcopy(model)
    vit_fast.remove_vit_fast(reference)
    model.gradient_checkpointing_enable()
    reference.gradient_checkpointing_enable()
    model.train(), reference.train()
    calls = _count_fused(monkeypatch)
    x, labels = torch.randn(2, 3, 16, 16), torch.tensor([0, 4])
    model(pixel_values=x, labels=labels).loss.backward()
    reference(pixel_values=x, labels=labels).loss.backward()
    assert calls == []  # autograd: transformers' forward, with its checkpointing
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("how", ["kwarg", "config"])
def test_attentions_come_back_through_the_unfused_path(how):
    hf = _model("ViTModel", "vit")
    model = vit_fast.optimize(hf, backend="triton")
    x = torch.randn(2, 3, 16, 16)
    kwargs = {"output_attentions": True} if how == "kwarg" else {}
    if how == "config":
        model.config.output_attentions = hf.config.output_attentions = True
    with torch.no_grad():
        ours, theirs = model(pixel_values=x, **kwargs), hf(pixel_values=x, **kwargs)
    assert len(ours.attentions) == len(theirs.attentions) == 2
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):
        assert a.shape == (2, 2, 17, 17)
        torch.testing.assert_close(a, b)


def test_interpolate_pos_encoding_runs_as_in_transformers(monkeypatch):
    hf = _model("ViTModel", "vit")
    model = vit_fast.optimize(hf, backend="triton")
    x = torch.randn(1, 3, 24, 24)
    calls = _count_fused(monkeypatch)
    with torch.no_grad():
        ours = model(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
        theirs = hf(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
    assert len(calls) == 2 and ours.shape == (1, 37, 32)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_replaced_or_hooked_submodules_take_the_layers_own_forward(monkeypatch):
    """PEFT's LoRA replaces q_proj by a wrapper; a user's forward hook on a submodule must still fire."""

    class LoRALike(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) + 0.5

    hf = _model("ViTModel", "vit")
    model = vit_fast.apply_vit_fast(copy.deepcopy(hf), backend="triton")
    old = model.layers[0].attention.q_proj
    for m in (hf, model):
        wrapped = LoRALike(32, 32)
        wrapped.load_state_dict(old.state_dict())
        m.layers[0].attention.q_proj = wrapped
    seen = []
    model.layers[1].mlp.fc1.register_forward_hook(lambda *_: seen.append(1))
    calls = _count_fused(monkeypatch)
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(pixel_values=x).last_hidden_state, hf(pixel_values=x).last_hidden_state)
    assert calls == [] and seen == [1]


def test_refusals_are_up_front_and_name_the_problem():
    small_heads = _model("ViTModel", "vit", **{"num_attention_heads": 4})  # head_dim 8
    with pytest.raises(ValueError, match=r"head_dim 8 .*16\.\.256: run this model as it is"):
        vit_fast.apply_vit_fast(small_heads, backend="triton")
    with pytest.raises(ValueError, match=r"head_dim 8"):
        vit_fast.optimize(small_heads, backend="triton")
    with pytest.warns(UserWarning, match=r"head_dim 8 .*keep transformers' own forward"):  # auto: said, not refused
        assert vit_fast.optimize(small_heads) is not small_heads
    bert = transformers.BertModel(
        transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )
    with pytest.raises(
        TypeError, match=r"BertModel is not a class vit-fast patches; .* patches are .*SiglipVisionModel"
    ):
        vit_fast.optimize(bert)


def test_export_traces_transformers_own_forward():
    """torch.export (and torch.onnx.export, which uses it) of a patched model: transformers' graph, none of our ops."""
    hf = _model("ViTModel", "vit")
    model = vit_fast.optimize(hf, backend="triton")
    x = torch.randn(2, 3, 16, 16)
    program = torch.export.export(model, (), {"pixel_values": x})
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not any("vit_fast" in t for t in targets), sorted(targets)
    with torch.no_grad():
        torch.testing.assert_close(
            program.module()(pixel_values=x).last_hidden_state, hf(pixel_values=x).last_hidden_state
        )


def test_float64_keeps_transformers_forward_and_emulated_bf16_is_refused(monkeypatch):
    """The dtype rule of timm's patched blocks (vit_fast.backend.runtime.patched_runs_kernels): float64, which no kernel
    computes in, runs transformers' own layers and attention-pool head (the result is theirs, bit for bit); bf16 on a
    card that only emulates it (a T4, faked) is refused with the message VisionTransformer's triton backend gives."""
    from vit_fast.base.cards import pretend_arch

    model = _model("SiglipVisionModel", "siglip_vision")  # encoder layers and the attention-pool head
    reference = copy.deepcopy(model).double()
    vit_fast.apply_vit_fast(model, backend="triton")
    layers, heads = _count_kernel_runs(monkeypatch)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        model.double()
        ours = model(pixel_values=x.double()).pooler_output
        assert (layers, heads) == ([], [])  # nothing reached the kernels
        assert torch.equal(ours, reference(pixel_values=x.double()).pooler_output)
        model.float()
        model(pixel_values=x)
        assert (len(layers), len(heads)) == (2, 1)  # float32 does: the rule is the dtype, not the patch undone
        model.to(torch.bfloat16)
        with pretend_arch(75), pytest.raises(ValueError, match=r"bf16 is not native .*use float16 or float32"):
            model(pixel_values=x.to(torch.bfloat16))


# ------------------------------------------------------------------------------------------ every class, every mode
#: transformers' model classes of each family (their modeling module's __all__, less the abstract *PreTrainedModel)
FAMILY_MODULES = {
    "vit": "vit",
    "deit": "deit",
    "dinov2": "dinov2",
    "dinov2_with_registers": "dinov2_with_registers",
    "vit_mae": "vit_mae",
    "vit_msn": "vit_msn",
    "ijepa": "ijepa",
    "clip": "clip",
    "siglip": "siglip",
    "siglip2": "siglip2",
}
#: the families of vision-language models (tests/interop/test_hf_vlm.py) and the ones refused as a whole
VLM_FAMILIES = ("llava", "paligemma", "idefics3")
REFUSED_FAMILIES = ("beit", "data2vec_vision", "sam", "vitdet")
#: the text config a family's text-only model is built with (refused by name)
TEXT_CONFIGS = {"clip": "CLIPTextConfig", "siglip": "SiglipTextConfig", "siglip2": "Siglip2TextConfig"}


def _family_classes(family: str) -> list[str]:
    import importlib

    package = FAMILY_MODULES.get(family, family.split("_vision")[0])  # data2vec's vision model is in data2vec
    module = importlib.import_module(f"transformers.models.{package}.modeling_{family}")
    return [name for name in module.__all__ if not name.endswith("PreTrainedModel")]


ALL_CLASSES = sorted((family, name) for family in FAMILY_MODULES for name in _family_classes(family))


@pytest.mark.parametrize(("family", "cls_name"), ALL_CLASSES, ids=[name for _, name in ALL_CLASSES])
def test_every_class_of_the_families_is_patched_or_refused_by_name(family, cls_name):
    """Each model class transformers has for ViT, DeiT, DINOv2, CLIP, SigLIP and SigLIP 2: patched (and then it has a
    parity row below) or refused by name with the reason (the text-only towers)."""
    if cls_name in hf_classes.SUPPORTED[family]:
        assert cls_name in PARITY, f"{cls_name} is patched but has no parity row"
        return
    assert cls_name in hf_classes.REFUSED, f"{cls_name} is neither in hf_classes.SUPPORTED nor in hf_classes.REFUSED"
    text = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config_cls = getattr(transformers, TEXT_CONFIGS[family])
    model = getattr(transformers, cls_name)(config_cls(**text, projection_dim=8))
    with pytest.raises(TypeError, match=rf"apply_vit_fast: {cls_name} is a text-only model: .*no vision tower"):
        vit_fast.apply_vit_fast(model, backend="triton")
    assert vit_fast.remove_vit_fast(model) == 0  # nothing was patched


#: why each refused family is refused (the words its error holds)
REFUSED_REASONS = {
    "beit": "relative position bias",
    "data2vec_vision": "relative position bias",
    "sam": "windowed attention",
    "vitdet": "windowed attention",
}


@pytest.mark.parametrize("family", REFUSED_FAMILIES)
def test_attention_the_kernels_do_not_run_is_refused_by_class_name_with_the_reason(family):
    """BEiT and Data2Vec-Vision (relative position bias), SAM and ViTDet (windowed attention): every
    class of the family is in the refusal table with that reason."""
    for name in _family_classes(family):
        assert REFUSED_REASONS[family] in hf_classes.REFUSED.get(name, ""), name


@pytest.mark.parametrize(("family", "config_name"), [("beit", "BeitConfig")])
def test_a_refused_model_is_refused_before_any_patch_with_its_class_and_reason(family, config_name):
    config = getattr(transformers, config_name)(**{**TINY, "intermediate_size": 64})
    cls_name = _family_classes(family)[0]
    model = getattr(transformers, cls_name)(config)
    with pytest.raises(TypeError, match=rf"apply_vit_fast: {cls_name} is a model with {REFUSED_REASONS[family]}"):
        vit_fast.apply_vit_fast(model, backend="triton")
    with pytest.raises(TypeError, match=rf"{cls_name} is a model with {REFUSED_REASONS[family]}"):
        vit_fast.optimize(model)
    assert vit_fast.remove_vit_fast(model) == 0


def test_supported_names_are_transformers_own():
    """No stale name in SUPPORTED or REFUSED: each is a class this transformers has in that family."""
    for family, names in hf_classes.SUPPORTED.items():
        assert set(names) <= set(_family_classes(family)), family
    refused = {name for family in REFUSED_FAMILIES for name in _family_classes(family)}
    assert set(hf_classes.REFUSED) <= {name for _, name in ALL_CLASSES} | refused


def _images() -> dict[str, torch.Tensor]:
    """Two 16 x 16 images (TINY's image_size), as ``pixel_values``."""
    return {"pixel_values": torch.randn(2, 3, 16, 16)}


def _siglip2_padded() -> dict[str, torch.Tensor]:
    """SigLIP 2's inputs for a 2 x 2 and a 2 x 4 patch grid: the first image padded (key padding, run as lengths)."""
    return siglip2_batch([(2, 2), (2, 4)], TINY["patch_size"], seed=5)


def _mae_inputs() -> dict[str, torch.Tensor]:
    """ViTMAE's images with the noise that picks the kept patches (half of 16), the same for every copy."""
    return {**_images(), "noise": torch.rand(2, 16, generator=torch.Generator().manual_seed(3))}


class Row(NamedTuple):
    """A parity row: the family and extra config the model is built with, what its main output is (an output field,
    or "image_features" for a dual model), and its inputs (the keyword arguments of its forward)."""

    family: str
    extra: dict[str, Any]
    main: str
    inputs: Callable[[], dict[str, torch.Tensor]] = _images


PARITY = {
    "ViTModel": Row("vit", {}, "pooler_output"),
    "ViTForImageClassification": Row("vit", {}, "logits"),
    "ViTForMaskedImageModeling": Row("vit", {"encoder_stride": 4}, "reconstruction"),
    "DeiTModel": Row("deit", {}, "pooler_output"),
    "DeiTForImageClassification": Row("deit", {}, "logits"),
    "DeiTForImageClassificationWithTeacher": Row("deit", {}, "logits"),
    "DeiTForMaskedImageModeling": Row("deit", {"encoder_stride": 4}, "reconstruction"),
    "Dinov2Model": Row("dinov2", {}, "pooler_output"),
    "Dinov2ForImageClassification": Row("dinov2", {"use_swiglu_ffn": True}, "logits"),
    "Dinov2Backbone": Row("dinov2", {"out_features": ["stage1", "stage2"]}, "feature_maps"),
    "Dinov2WithRegistersModel": Row("dinov2_with_registers", {}, "pooler_output"),
    "Dinov2WithRegistersForImageClassification": Row("dinov2_with_registers", {"use_swiglu_ffn": True}, "logits"),
    "Dinov2WithRegistersBackbone": Row("dinov2_with_registers", {"out_features": ["stage1", "stage2"]}, "feature_maps"),
    "ViTMAEModel": Row("vit_mae", {}, "last_hidden_state", _mae_inputs),
    "ViTMAEForPreTraining": Row("vit_mae", {}, "logits", _mae_inputs),
    "ViTMSNModel": Row("vit_msn", {}, "last_hidden_state"),
    "ViTMSNForImageClassification": Row("vit_msn", {}, "logits"),
    "IJepaModel": Row("ijepa", {}, "last_hidden_state"),
    "IJepaForImageClassification": Row("ijepa", {}, "logits"),
    "CLIPVisionModel": Row("clip_vision", {}, "pooler_output"),
    "CLIPVisionModelWithProjection": Row("clip_vision", {"projection_dim": 8}, "image_embeds"),
    "CLIPModel": Row("clip", {}, "image_features"),
    "CLIPForImageClassification": Row("clip", {}, "logits"),
    "SiglipVisionModel": Row("siglip_vision", {}, "pooler_output"),
    "SiglipModel": Row("siglip", {}, "image_features"),
    "SiglipForImageClassification": Row("siglip", {}, "logits"),
    "Siglip2VisionModel": Row("siglip2_vision", {}, "pooler_output", _siglip2_padded),
    "Siglip2Model": Row("siglip2", {}, "image_features", _siglip2_padded),
    "Siglip2ForImageClassification": Row("siglip2", {}, "logits", _siglip2_padded),
}
MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "eval_with_grad": torch.enable_grad}
#: the classes whose layers are another family's exactly (ViT's, DINOv2's): judged without autograd only, as their
#: family is in every mode (the CI's time)
NARROW = {"Dinov2With", "ViTMAE", "ViTMSN", "IJepa"}
PARITY_CASES = sorted(
    (name, mode) for name in PARITY for mode in MODES if mode == "no_grad" or not name.startswith(tuple(NARROW))
)


def test_every_patched_class_has_a_parity_row():
    # DINOv3's rows (RoPE, its own configs): tests/interop/test_hf_dinov3.py
    families = [f for f in hf_classes.SUPPORTED if f not in (*VLM_FAMILIES, "dinov3_vit")]
    assert set(PARITY) == {name for family in families for name in hf_classes.SUPPORTED[family]}


def _padded(inputs: dict[str, torch.Tensor]) -> bool:
    """Whether some image of the batch is padded (SigLIP 2's ``pixel_attention_mask``)."""
    mask = inputs.get("pixel_attention_mask")
    return mask is not None and not bool(mask.all())


def _valid_tokens(hidden: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``hidden [B, T, D]``'s tokens of a padded batch that are patches, ``[N, D]``; all of them otherwise. Padding
    rows are nobody's output: the rule judges the valid ones."""
    mask = inputs.get("pixel_attention_mask")
    return hidden if mask is None else hidden[mask.bool()]


def _outputs(model, cls_name: str, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The model's main output and the vision tower's hidden states (embeddings, then each layer's output) at the
    valid tokens."""
    main = PARITY[cls_name].main
    if main == "image_features":  # a dual model: its image features, and its vision tower's hidden states
        value, out = _features(model, inputs), model.vision_model(**inputs, output_hidden_states=True)
    else:
        out = model(**inputs, output_hidden_states=True)
        value = getattr(out, main)
        value = value[-1] if main == "feature_maps" else value
    return value, tuple(_valid_tokens(h, inputs) for h in out.hidden_states)


def _count_kernel_runs(monkeypatch) -> tuple[list[int], list[int]]:
    """Runs of the kernel path by the encoder layers and by the attention-pool heads (a fallback to transformers'
    forward runs neither)."""
    from vit_fast.interop.timm_blocks import PoolPlan

    return _count_fused(monkeypatch), count_calls(monkeypatch, PoolPlan)


@pytest.mark.parametrize(("cls_name", "mode"), PARITY_CASES, ids=[f"{n}-{m}" for n, m in PARITY_CASES])
def test_patched_class_matches_the_unpatched_model(cls_name, mode, monkeypatch):
    """A deep copy patched with backend="triton" against the unpatched original, on the same weights and input (the
    row's: images, or SigLIP 2's padded patches): the main output and every hidden state (at valid tokens) within
    the numerics rule against the unpatched model in float64, in each mode (autograd off, inference mode, and an
    eval model called with autograd on); every vision layer (and a SigLIP attention-pool head) ran on the kernels
    and launched its attention kernel (or, for a padded batch, PyTorch's attention), so a fallback to transformers'
    forward cannot pass."""
    row = PARITY[cls_name]
    model = _model(cls_name, row.family, **row.extra)
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton")
    ref64 = copy.deepcopy(model).double()
    inputs = row.inputs()
    with torch.no_grad():
        eager, eager_hidden = _outputs(model, cls_name, inputs)
        expected, expected_hidden = _outputs(ref64, cls_name, as_float64(inputs))
    runs, head_runs = _count_kernel_runs(monkeypatch)
    with MODES[mode]():
        (ours, ours_hidden), launched = kernel_launches(lambda: _outputs(patched, cls_name, inputs))
    assert ours.requires_grad == (mode == "eval_with_grad")  # autograd was on, and the output is in its graph
    layers, heads = len(hf_patch.vision_layers(patched)), len(hf_patch.pool_heads(patched))
    # the hidden states' call runs the layers a second time for a dual model (its image features are the first)
    calls = 2 if row.main == "image_features" else 1
    assert (len(runs), len(head_runs)) == (calls * layers, calls * heads), launched
    assert_attention_launches(launched, calls * layers, pool=calls * heads, padded=_padded(inputs))
    assert_within_eager(ours.detach(), eager, expected, name=f"{cls_name} {mode}")
    encoder = (getattr(model.config, "vision_config", None) or model.config).num_hidden_layers  # not MAE's decoder
    assert len(ours_hidden) == len(expected_hidden) == encoder + 1
    for i, (o, e, r) in enumerate(zip(ours_hidden, eager_hidden, expected_hidden, strict=True)):
        assert_within_eager(o.detach(), e, r, name=f"{cls_name} {mode} hidden_states[{i}]")


def _input_and_parameter_grads(model, cls_name: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """d(sum of the main output times a fixed weight)/d(input pixels, every parameter), autograd on, the model in
    eval."""
    inputs, pixels = requiring_grad(inputs)
    out, _ = _outputs(model, cls_name, inputs)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in named], [p for _, p in named]
    grads = torch.autograd.grad((out * weight).sum(), (pixels, *params), allow_unused=True)
    return {name: g for name, g in zip(("input", *names), grads, strict=True) if g is not None}


@pytest.mark.parametrize(
    "cls_name",
    ["ViTForImageClassification", "Dinov2ForImageClassification", "SiglipVisionModel", "Siglip2VisionModel"],
)
def test_eval_with_grad_runs_the_kernels_and_their_gradients_match(cls_name, monkeypatch):
    """An eval model called without torch.no_grad() (its parameters require grad, as they do after loading): the
    layers (and SigLIP's head) run on the kernels, SigLIP 2 on a padded batch, and the gradients w.r.t. the input and
    every parameter (q, k, v and SwiGLU's gate and up, which the fused path stacks) are within the numerics rule of
    the unpatched model's, both against the unpatched model in float64."""
    row = PARITY[cls_name]
    model = _model(cls_name, row.family, **row.extra)
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton")
    ref64 = copy.deepcopy(model).double()
    inputs = row.inputs()
    eager = _input_and_parameter_grads(model, cls_name, inputs)
    expected = _input_and_parameter_grads(ref64, cls_name, as_float64(inputs))
    runs, head_runs = _count_kernel_runs(monkeypatch)
    ours, launched = kernel_launches(lambda: _input_and_parameter_grads(patched, cls_name, inputs))
    layers, heads = len(hf_patch.vision_layers(patched)), len(hf_patch.pool_heads(patched))
    assert (len(runs), len(head_runs)) == (layers, heads), launched
    assert_attention_launches(launched, layers, pool=heads, padded=_padded(inputs))
    assert set(ours) == set(eager) == set(expected)
    assert any(".q_proj." in name for name in ours) and any(".k_proj." in name for name in ours)
    for name in ours:
        assert_within_eager(ours[name], eager[name], expected[name], name=f"{cls_name} grad {name}")


@pytest.mark.parametrize("grad", [True, False])
def test_training_mode_runs_transformers_own_forward_with_or_without_autograd(grad):
    """Training mode (dropout) keeps transformers' forward, under torch.no_grad() too: the kernels have no dropout."""
    model = _model("SiglipVisionModel", "siglip_vision")
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton").train()
    x = torch.randn(2, 3, 16, 16)
    with torch.set_grad_enabled(grad):
        _, launched = kernel_launches(lambda: patched(pixel_values=x).pooler_output)
    assert sum(launched.values()) == 0, launched


def test_a_frozen_model_gives_an_input_gradient_after_inference_mode():
    """Parameters frozen (requires_grad False), a first call under torch.inference_mode(), then a saliency-style
    input gradient: the q, k, v stack made in inference mode is not reused for the autograd call (autograd cannot
    save an inference tensor), and the gradient matches the unpatched model's by the rule."""
    model = _model("ViTForImageClassification", "vit").requires_grad_(False)
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton")
    x = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        patched(pixel_values=x)
    inputs = {"pixel_values": x}
    eager = _input_and_parameter_grads(model, "ViTForImageClassification", inputs)
    expected = _input_and_parameter_grads(
        copy.deepcopy(model).double(), "ViTForImageClassification", as_float64(inputs)
    )
    ours, launched = kernel_launches(lambda: _input_and_parameter_grads(patched, "ViTForImageClassification", inputs))
    assert launched["_attention_kernel"] == 2 and set(ours) == {"input"}
    assert_within_eager(ours["input"], eager["input"], expected["input"], name="input gradient, frozen model")
