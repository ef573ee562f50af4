"""apply_vit_fast on timm's ViT family: every block kind, MLP and activation the kernels run, patched in place and
judged by the numerics rule against timm in float64 (kernels in Triton's interpreter); every refusal made at patch
time, by name, with nothing patched; torch.jit.script of a patched model."""

from __future__ import annotations

import copy

import pytest
import torch

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")

import vit_fast  # noqa: E402
from vit_fast.timm_blocks import BlockPlan  # noqa: E402

from .fakes import trained_like  # noqa: E402
from .numerics import assert_within_eager  # noqa: E402

SMALL = dict(depth=2, embed_dim=64, num_heads=2)
# feature -> (timm name, create_model overrides): one small model per feature apply_vit_fast runs
FEATURES = {
    "quick_gelu (OpenAI CLIP)": ("vit_base_patch32_clip_quickgelu_224", dict(SMALL, img_size=64)),
    "GELUTanh + map head (SigLIP)": ("vit_base_patch32_siglip_256", dict(SMALL, img_size=64)),
    "SwiGLU GluMlp, SiLU (DINOv2 giant)": (
        "vit_giant_patch14_dinov2",
        dict(depth=2, embed_dim=96, num_heads=3, img_size=42),
    ),
    "final_norm=False": ("vit_base_patch16_radio_v3", dict(SMALL, img_size=48)),
    "ParallelThingsBlock": ("vit_small_patch16_18x2_224", dict(SMALL, img_size=48)),
    "ResPostBlock": ("vit_base_patch16_rpn_224", dict(SMALL, img_size=48)),
    "distillation head": ("deit_tiny_distilled_patch16_224", dict(SMALL, img_size=48)),
    "hybrid embed": ("vit_tiny_r_s16_p8_224", dict(SMALL, img_size=64)),
    "no prefix tokens": ("vit_base_patch16_siglip_gap_224", dict(SMALL, img_size=48)),
    "act_layer=silu": ("vit_tiny_patch16_224", dict(SMALL, img_size=32, act_layer="silu")),
    "LayerScale + registers": ("vit_small_patch14_reg4_dinov2", dict(SMALL, img_size=28)),
    "DiffAttention (differential)": ("vit_dwee_patch16_reg1_gap_256", dict(SMALL, img_size=48)),
}


def _count_kernel_blocks(monkeypatch) -> list[int]:
    runs: list[int] = []
    original = BlockPlan.run
    monkeypatch.setattr(BlockPlan, "run", lambda plan, block, x: runs.append(1) or original(plan, block, x))
    return runs


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_timm_feature_patched_in_place(feature, monkeypatch):
    name, kwargs = FEATURES[feature]
    torch.manual_seed(0)
    model = trained_like(timm.create_model(name, pretrained=False, **kwargs), seed=1)
    x = torch.randn(2, 3, *model.patch_embed.img_size)
    keys, cls = list(model.state_dict()), type(model)
    with torch.no_grad():
        eager = model(x)
        expected = copy.deepcopy(model).double()(x.double())
    vit_fast.apply_vit_fast(model, backend="triton")
    assert type(model) is cls and list(model.state_dict()) == keys
    runs = _count_kernel_blocks(monkeypatch)
    with torch.no_grad():
        ours = model(x)
    assert len(runs) == len(model.blocks)  # every block ran on the kernels, none fell back to timm's forward
    assert_within_eager(ours, eager, expected, name=f"{name} patched")
    map_head = type(getattr(model, "attn_pool", None)).__name__ == "AttentionPoolLatent"  # patched too
    assert vit_fast.remove_vit_fast(model) == len(model.blocks) + map_head
    with torch.no_grad():
        assert torch.equal(model(x), eager)


def test_patched_model_steps_aside_for_masks_and_float64(monkeypatch):
    """An attention mask or a float64 input runs timm's own block forward (the kernels take neither)."""
    model = trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, **SMALL), 2)
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = _count_kernel_blocks(monkeypatch)
    tokens = torch.randn(2, 5, 64)
    mask = torch.zeros(5, 5, dtype=torch.bool).fill_diagonal_(True)
    with torch.no_grad():
        masked = model.blocks[0](tokens, attn_mask=mask)
        expected = model.blocks[0].__dict__["_vit_fast_original_forward"](tokens, attn_mask=mask)
        model.double()(torch.randn(1, 3, 32, 32, dtype=torch.float64))
    assert runs == [] and torch.equal(masked, expected)


# refused at patch time, by name; nothing is patched
REFUSED = {
    "Eva": ("eva02_tiny_patch14_224", dict(img_size=28, depth=1), "rotary position embeddings"),
    "RelPos": ("vit_relpos_small_patch16_224", dict(img_size=32, depth=1), "relative position bias"),
    "qk_norm": ("vit_tiny_patch16_224", dict(img_size=32, depth=2, qk_norm=True), "blocks.0.attn.q_norm (qk-norm)"),
    "DiffAttention qk_norm": (
        "vit_dwee_patch16_reg1_gap_256",
        dict(img_size=32, depth=2, qk_norm=True),
        "blocks.0.attn.q_norm (qk-norm in differential attention)",
    ),
}


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_unsupported_timm_features_are_refused_by_name(feature):
    name, kwargs, expected = REFUSED[feature]
    model = timm.create_model(name, pretrained=False, **kwargs)
    with pytest.raises(ValueError, match="apply_vit_fast") as info:
        vit_fast.apply_vit_fast(model, backend="triton")
    assert expected in str(info.value)
    assert "blocks.1." not in str(info.value)  # each feature named once, not once per block
    assert vit_fast.remove_vit_fast(model) == 0  # nothing was patched


def test_triton_backend_refuses_small_head_dims_at_patch_time():
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, embed_dim=24)
    with pytest.raises(ValueError, match=r"head dims 16\.\.\d+, this model's is 8"):
        vit_fast.apply_vit_fast(model, backend="triton")
    assert vit_fast.remove_vit_fast(model) == 0
    vit_fast.apply_vit_fast(model, backend="auto")  # auto keeps timm's attention where ours cannot run
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_torchscript_of_a_patched_model():
    """torch.jit.script compiles the model as timm wrote it (TorchScript cannot compile our forwards); the user's
    model stays patched, and a deepcopy scripts as itself."""
    model = trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, **SMALL), 3)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    vit_fast.apply_vit_fast(model, backend="triton")
    scripted = torch.jit.script(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), expected, rtol=0, atol=0)
    assert all("_vit_fast_original_forward" in b.__dict__ for b in model.blocks)  # still patched
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.head.weight.mul_(2.0)
        torch.testing.assert_close(torch.jit.script(twin)(x), twin(x), rtol=1e-4, atol=1e-5)
    vit_fast.remove_vit_fast(model)
    assert "__prepare_scriptable__" not in model.__dict__


def test_torch_export_of_a_patched_model():
    """backend='triton': the exported graph holds our custom ops and computes what timm computes; backend='auto'
    where the kernels do not run (a CPU): it says so, once, and the graph is timm's."""
    model = trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, **SMALL), 5)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        eager = model(x)
        expected = copy.deepcopy(model).double()(x.double())
    vit_fast.apply_vit_fast(model, backend="triton")
    exported = torch.export.export(model, (x,))
    ops = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert {"vit_fast.attention.default", "vit_fast.linear.default"} <= ops
    with torch.no_grad():
        assert_within_eager(exported.module()(x), eager, expected, name="exported patched model")
    vit_fast.remove_vit_fast(model)
    vit_fast.apply_vit_fast(model, backend="auto")
    with pytest.warns(UserWarning, match=r"torch.export on cpu \(torch.float32\) records timm's own block forwards"):
        exported = torch.export.export(model, (x,))
    assert not any("vit_fast" in str(n.target) for n in exported.graph.nodes)
