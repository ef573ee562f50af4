"""apply_vit_fast: a user's own timm / Hugging Face ViT runs its blocks on our kernels, in place,
while the object, its class and its state_dict stay the user's. Kernels run in Triton's
interpreter here (backend="triton"), judged by the numerics rule against float64."""

from __future__ import annotations

import copy

import pytest
import torch

import vit_fast

from ..numerics import assert_within_eager


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


# --------------------------------------------------------------------------- saved whole: pickle, torch.save, deepcopy
def _randomised(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def _timm_model(name: str, **kwargs):
    timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it)")
    torch.manual_seed(0)
    return _randomised(timm.create_model(name, pretrained=False, **kwargs))


def _hf_model(cls_name: str, config_name: str, **kwargs):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = getattr(transformers, config_name)(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4, **kwargs
    )
    torch.manual_seed(0)
    return _randomised(getattr(transformers, cls_name)(config))


# case -> (build the patched model, run it, x)
SAVED = {
    "apply_vit_fast(timm)": (
        lambda: vit_fast.apply_vit_fast(
            _timm_model("vit_small_patch14_reg4_dinov2", img_size=28, depth=2, embed_dim=64, num_heads=2),
            backend="triton",
        ),
        lambda m, x: m.forward_features(x),
        (2, 3, 28, 28),
    ),
    "apply_vit_fast(timm SigLIP, attention-pool head)": (
        lambda: vit_fast.apply_vit_fast(
            _timm_model("vit_base_patch16_siglip_224", depth=1, embed_dim=64, num_heads=2, img_size=32),
            backend="triton",
        ),
        lambda m, x: m(x),
        (2, 3, 32, 32),
    ),
    "optimize(hf ViT)": (
        lambda: vit_fast.optimize(
            _hf_model("ViTForImageClassification", "ViTConfig", intermediate_size=64, num_labels=5), backend="triton"
        ),
        lambda m, x: m(pixel_values=x).logits,
        (2, 3, 16, 16),
    ),
    "apply_vit_fast(hf ViT)": (
        lambda: vit_fast.apply_vit_fast(_hf_model("ViTModel", "ViTConfig", intermediate_size=64), backend="triton"),
        lambda m, x: m(pixel_values=x).last_hidden_state,
        (2, 3, 16, 16),
    ),
    "apply_vit_fast(hf DINOv2 SwiGLU)": (
        lambda: vit_fast.apply_vit_fast(
            _hf_model("Dinov2Model", "Dinov2Config", mlp_ratio=2, use_swiglu_ffn=True), backend="triton"
        ),
        lambda m, x: m(pixel_values=x).last_hidden_state,
        (2, 3, 16, 16),
    ),
    "apply_vit_fast(hf SigLIP, pooling head)": (
        lambda: vit_fast.apply_vit_fast(
            _hf_model("SiglipVisionModel", "SiglipVisionConfig", intermediate_size=64), backend="triton"
        ),
        lambda m, x: m(pixel_values=x).pooler_output,
        (2, 3, 16, 16),
    ),
}


def _torch_round_trip(model):
    import io

    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


ROUND_TRIPS = {
    "torch.save": _torch_round_trip,
    "pickle": lambda m: __import__("pickle").loads(__import__("pickle").dumps(m)),
    "deepcopy": copy.deepcopy,
}


def _patched(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if "_vit_fast_original_forward" in m.__dict__]


def _count_kernel_runs(monkeypatch) -> list[str]:
    """Every run of a patched module on the kernels: timm blocks and heads (BlockPlan / PoolPlan), transformers
    layers (_run_view) and heads (PoolPlan)."""
    from vit_fast.interop import hf_patch, timm_blocks

    runs: list[str] = []
    for owner, name in ((timm_blocks.BlockPlan, "run"), (timm_blocks.PoolPlan, "run"), (hf_patch, "_run_view")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _real=real, _name=name: runs.append(_name) or _real(*a))
    return runs


@pytest.mark.parametrize("how", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("case", sorted(SAVED))
def test_a_patched_model_saved_whole_loads_back_patched(case, how, monkeypatch):
    """torch.save of a patched model loaded back failed ("'ViTLayer' object has no attribute 'fast_hf'": the
    patch was a bound method of a closure); now it loads, still patched, each patch bound to its own module, and
    gives exactly the original's outputs on the kernels."""
    build, run, shape = SAVED[case]
    model = build()
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = run(model, x)  # fills the fused-weight caches, which must not travel
    loaded = ROUND_TRIPS[how](model)
    patched = _patched(loaded)
    assert patched and len(patched) == len(_patched(model))
    assert all(m.forward.module is m and m.forward.backend == "triton" for m in patched)
    assert not set(map(id, loaded.parameters())) & set(map(id, model.parameters()))
    runs = _count_kernel_runs(monkeypatch)
    with torch.no_grad():
        got = run(loaded, x)
    assert len(runs) >= len(patched), runs  # every patched module ran on the kernels
    assert torch.equal(got, expected)
    assert vit_fast.remove_vit_fast(loaded) == len(patched) and _patched(loaded) == []
    with torch.no_grad():
        assert _patched(model) and torch.equal(run(model, x), expected)  # the original is as it was


def test_a_saved_patch_holds_no_copies_of_the_weights():
    """The fused q|k|v copies a transformers layer keeps are read again after loading, never pickled."""
    import pickle

    build, run, shape = SAVED["apply_vit_fast(hf ViT)"]
    model = build()
    with torch.no_grad():
        run(model, torch.randn(*shape))
    patched_size = len(pickle.dumps(model))
    vit_fast.remove_vit_fast(model)
    assert patched_size < 1.05 * len(pickle.dumps(model))


def test_vit_fast_own_model_saves_whole():
    model = vit_fast.VisionTransformer(
        vit_fast.ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3),
        backend="triton",
    ).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
        for round_trip in ROUND_TRIPS.values():
            loaded = round_trip(model)
            assert loaded.backend == "triton" and torch.equal(loaded(x), expected)


def test_without_vit_fast_a_saved_patched_model_names_the_missing_package(tmp_path):
    """Where vit-fast is not installed, unpickling stops at the patch's first reference with Python's own
    ModuleNotFoundError naming vit_fast (the pickle holds references, never code to say more)."""
    import subprocess
    import sys

    build, _, _ = SAVED["optimize(hf ViT)"]
    torch.save(build(), tmp_path / "patched.pt")
    script = (
        "import importlib.abc, sys\n"
        "class NoVitFast(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'vit_fast':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoVitFast())\n"
        "import torch\n"
        "try:\n"
        "    torch.load(sys.argv[1], weights_only=False)\n"
        "except ModuleNotFoundError as err:\n"
        "    print('missing', err.name, '|', err)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "patched.pt")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("missing vit_fast") and "No module named 'vit_fast" in done.stdout, done.stdout
