"""vit_fast.hf_patch: transformers' own vision models (ViT, DeiT, DINOv2, CLIP, SigLIP) with their encoder
layers on our kernels, in place (apply_vit_fast) or as a patched copy (optimize), still instances of the
user's class. Kernels run in Triton's interpreter (backend="triton"); every model is judged by the numerics
rule against the same model in float64, on random weights and tiny configs."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")

import vit_fast  # noqa: E402
from vit_fast import hf_patch  # noqa: E402

from .numerics import assert_within_eager  # noqa: E402

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4)


def _config(family: str, **extra):
    extra = {**TINY, **extra}
    if family == "vit":
        return transformers.ViTConfig(intermediate_size=64, num_labels=5, **extra)
    if family == "deit":
        return transformers.DeiTConfig(intermediate_size=48, num_labels=5, **extra)
    if family == "dinov2":
        return transformers.Dinov2Config(mlp_ratio=2, num_labels=5, **extra)
    if family == "clip_vision":
        return transformers.CLIPVisionConfig(intermediate_size=64, **extra)  # quick_gelu
    if family == "siglip_vision":
        return transformers.SiglipVisionConfig(intermediate_size=64, **extra)  # gelu_pytorch_tanh
    if family == "clip":
        text = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
        return transformers.CLIPConfig(
            text_config=text, vision_config=dict(intermediate_size=64, **extra), projection_dim=8
        )
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
    out = model.get_image_features(pixel_values=x)
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
    calls = []
    real = hf_patch._run_view

    def spy(view, x):
        calls.append(1)
        return real(view, x)

    monkeypatch.setattr(hf_patch, "_run_view", spy)
    return calls


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
    assert vit_fast.remove_vit_fast(model) == 2 + len(hf_patch._pool_heads(model))  # SigLIP's head is patched too
    with torch.no_grad():
        assert torch.equal(run(model, x), eager)


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
    with pytest.raises(TypeError, match=r"supports the transformers models .*SiglipVisionModel.*; got BertModel"):
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
    """The dtype rule of timm's patched blocks (vit_fast.runtime.patched_runs_kernels): float64, which no kernel
    computes in, runs transformers' own layers and attention-pool head (the result is theirs, bit for bit); bf16 on a
    card that only emulates it (a T4, faked) is refused with the message VisionTransformer's triton backend gives."""
    from vit_fast.kernels.cards import pretend_arch
    from vit_fast.timm_blocks import PoolPlan

    model = _model("SiglipVisionModel", "siglip_vision")  # encoder layers and the attention-pool head
    reference = copy.deepcopy(model).double()
    vit_fast.apply_vit_fast(model, backend="triton")
    layers = _count_fused(monkeypatch)
    heads = []
    real_run = PoolPlan.run
    monkeypatch.setattr(PoolPlan, "run", lambda plan, *a: heads.append(1) or real_run(plan, *a))
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
