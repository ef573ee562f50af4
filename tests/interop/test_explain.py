"""vit_fast.explain: what apply_vit_fast / optimize patched, what they left alone and why, and which backend runs the
blocks on a device. Its rows are checked against what the patched forwards do (kernel launches counted), on tiny
timm and transformers models; kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

import vit_fast
from vit_fast.interop.explanation import KERNELS, OWN

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")

SMALL = dict(img_size=32, depth=2, embed_dim=64, num_heads=2)
HF_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4)


def _timm(**extra) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**SMALL, **extra}).eval()


def _kernel_blocks(monkeypatch) -> list[int]:
    from vit_fast.interop.timm_blocks import BlockPlan

    runs: list[int] = []
    original = BlockPlan.run
    monkeypatch.setattr(BlockPlan, "run", lambda plan, block, x: runs.append(1) or original(plan, block, x))
    return runs


def test_a_patched_timm_model_lists_its_blocks_and_what_runs_them(monkeypatch):
    model = vit_fast.apply_vit_fast(_timm(), backend="triton")
    report = vit_fast.explain(model)
    assert report.model == "timm VisionTransformer" and report.patched_with == "triton"
    assert report.device == "cpu" and report.dtype == "float32"
    assert [m.name for m in report.patched] == ["blocks.0", "blocks.1"] and report.left_alone == []
    assert all(m.runs == KERNELS and "Block, MLP gelu, head dim 32" in m.reason for m in report.patched)
    assert report.backend.backend == "triton" and "interpreter" in report.backend.reason
    runs = _kernel_blocks(monkeypatch)
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert len(runs) == 2  # as explained: both blocks ran on the kernels
    text = str(report)
    assert (
        "patched with backend='triton'" in text and "blocks.0 .. blocks.1 (2) [Block]: patched, runs vit-fast's" in text
    )


def test_auto_on_a_cpu_says_the_blocks_run_timms_forward_and_why(monkeypatch):
    model = vit_fast.apply_vit_fast(_timm())
    report = vit_fast.explain(model)
    assert report.patched_with == "auto" and report.backend.backend == "torch"
    assert report.backend == vit_fast.backend.runtime.choose_backend("cpu", 32)  # the model's own rule and reason
    assert all(m.patched and m.runs == OWN and "not a CUDA device" in m.reason for m in report.modules)
    runs = _kernel_blocks(monkeypatch)
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert runs == []  # as explained: timm's forward
    cuda = vit_fast.explain(model, "cuda:0")  # another device: its own reason
    assert cuda.device == "cuda:0" and cuda.backend == vit_fast.backend.runtime.choose_backend("cuda:0", 32)


def test_training_mode_and_float64_are_explained(monkeypatch):
    model = vit_fast.apply_vit_fast(_timm(), backend="triton").train()
    assert all(m.runs == OWN and "training mode" in m.reason for m in vit_fast.explain(model).modules)
    model.eval().double()
    report = vit_fast.explain(model)
    assert report.backend.backend == "torch" and "float64" in report.backend.reason
    assert all(m.runs == OWN for m in report.modules)


def test_an_unpatched_timm_model_says_what_apply_vit_fast_would_do_and_refuse():
    plain = vit_fast.explain(_timm())
    assert plain.patched_with is None and plain.patched == [] and plain.backend.backend == "torch"
    assert all("apply_vit_fast(model) would run it on the kernels" in m.reason for m in plain.left_alone)
    refused = vit_fast.explain(_timm(qk_norm=True))
    assert [m.name for m in refused.left_alone] == ["blocks.0", "blocks.1"]
    assert all(m.reason == "refused: attn.q_norm (qk-norm); attn.k_norm (qk-norm)" for m in refused.modules)
    assert "apply_vit_fast refuses this model" in refused.backend.reason
    assert "blocks.0.attn.q_norm (qk-norm)" in refused.backend.reason  # as apply_vit_fast's error names it
    with pytest.raises(ValueError, match="qk-norm"):
        vit_fast.apply_vit_fast(_timm(qk_norm=True))


def test_remove_vit_fast_forgets_the_patch():
    model = vit_fast.apply_vit_fast(_timm())
    vit_fast.remove_vit_fast(model)
    assert vit_fast.explain(model).patched_with is None and vit_fast.explain(model).patched == []


def _hf(cls_name: str, config) -> torch.nn.Module:
    torch.manual_seed(0)
    config._attn_implementation = "eager"
    return getattr(transformers, cls_name)(config).eval()


def test_a_clip_model_lists_its_patched_vision_layers_and_its_text_tower_left_alone():
    text = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config = transformers.CLIPConfig(
        text_config=text, vision_config=dict(intermediate_size=64, **HF_TINY), projection_dim=8
    )
    model = vit_fast.optimize(_hf("CLIPModel", config), backend="triton")  # a patched copy
    report = vit_fast.explain(model)
    assert report.model == "transformers CLIPModel" and report.patched_with == "triton"
    assert [m.name for m in report.patched] == [f"vision_model.encoder.layers.{i}" for i in range(2)]
    assert all(m.runs == KERNELS and "activation quick_gelu" in m.reason for m in report.patched)
    [text_layer] = report.left_alone
    assert text_layer.name == "text_model.encoder.layers.0" and "text tower" in text_layer.reason


def test_hf_layers_left_alone_or_stepping_aside_say_why(monkeypatch):
    small_heads = _hf("ViTModel", transformers.ViTConfig(intermediate_size=64, **{**HF_TINY, "num_attention_heads": 4}))
    with pytest.warns(UserWarning, match="head_dim 8"):
        vit_fast.apply_vit_fast(small_heads)
    report = vit_fast.explain(small_heads)
    assert report.patched == [] and len(report.left_alone) == 2
    assert all("head_dim 8" in m.reason and "16..256" in m.reason for m in report.left_alone)

    class LoRALike(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) + 0.5

    model = vit_fast.apply_vit_fast(_hf("ViTModel", transformers.ViTConfig(intermediate_size=64, **HF_TINY)), "triton")
    model.layers[0].attention.q_proj = LoRALike(32, 32)
    first, second = vit_fast.explain(model).patched
    assert first.runs == OWN and "attention.q_proj is a LoRALike, not an nn.Linear" in first.reason
    assert second.runs == KERNELS
    model.train()  # the patched forward hands layers in training mode to transformers' (dropout)
    assert all(m.runs == OWN and "training mode" in m.reason for m in vit_fast.explain(model).patched)


def test_vit_fasts_own_model_is_its_explain_backend_and_others_are_refused():
    model = vit_fast.load_model("default")
    report = vit_fast.explain(model)
    assert report.backend == model.explain_backend() and report.modules == ()
    with pytest.raises(TypeError, match="explain\\(\\) does not know"):
        vit_fast.explain(torch.nn.Linear(2, 2))


def test_explain_is_public():
    from vit_fast.interop.explanation import explain

    assert "explain" in vit_fast.__all__ and vit_fast.explain is explain
