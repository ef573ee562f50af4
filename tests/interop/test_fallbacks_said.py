"""Nothing silent: a patched model that runs its own forward at run time for a reason the user chose (attentions
requested, a float64 input, training mode) says so once per model and reason (a UserWarning), and
``vit_fast.explain`` lists what was said. Where the kernels would not run anyway (backend "auto" on a CPU) nothing is
said."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")
timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it)")

import vit_fast  # noqa: E402

from ..fakes import kernel_launches  # noqa: E402


def _vit() -> torch.nn.Module:
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4, intermediate_size=64
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.ViTModel(config).eval()


def _said(call) -> list[str]:
    """The vit-fast warnings ``call()`` gives, every one of them (Python's own once-per-place filter off)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if str(w.message).startswith("vit-fast:")]


@pytest.mark.parametrize(
    ("reason", "call"),
    [
        ("attentions requested", lambda m, x: m(pixel_values=x, output_attentions=True)),
        ("float64 input", lambda m, x: m.double()(pixel_values=x.double())),
        ("training mode", lambda m, x: m.train()(pixel_values=x)),
    ],
)
def test_a_transformers_fallback_the_user_chose_is_said_once_and_explained(reason, call):
    model = vit_fast.optimize(_vit(), backend="triton")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        first = _said(lambda: call(model, x))
        again = _said(lambda: call(model, x))
    assert len(first) == 1 and reason in first[0], first
    assert again == []  # once per model and reason
    assert any(reason in note for note in vit_fast.explain(model).notes)
    assert f"note: said at run time: {first[0].removeprefix('vit-fast: ')}" in str(vit_fast.explain(model))
    fresh = vit_fast.optimize(_vit(), backend="triton")  # another model says it again
    with torch.no_grad():
        assert len(_said(lambda: call(fresh, x))) == 1
    vit_fast.remove_vit_fast(model)
    assert not any("said at run time" in note for note in vit_fast.explain(model).notes)


def test_the_kernel_path_and_a_cpu_auto_model_say_nothing():
    """An eval float32 call on the kernels says nothing; nor does a model patched with backend "auto" on a CPU,
    where the kernels never run (its float64 and training calls are not a choice that cost the user our kernels)."""
    x = torch.randn(2, 3, 16, 16)
    on_kernels = vit_fast.optimize(_vit(), backend="triton")
    with torch.no_grad():
        said, launched = kernel_launches(lambda: _said(lambda: on_kernels(pixel_values=x)))
    assert said == [] and launched["_attention_kernel"] == 2
    auto = vit_fast.optimize(_vit())
    with torch.no_grad():
        assert _said(lambda: auto(pixel_values=x, output_attentions=True)) == []
        assert _said(lambda: auto.double()(pixel_values=x.double())) == []
    assert not any("said at run time" in note for note in vit_fast.explain(auto).notes)


def test_a_timm_block_in_training_mode_or_float64_is_said_once_each():
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, embed_dim=32, num_heads=2)
    vit_fast.apply_vit_fast(model.eval(), backend="triton")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        training = _said(lambda: [model.train()(x) for _ in range(2)])
        double = _said(lambda: [model.eval().double()(x.double()) for _ in range(2)])
    assert len(training) == 1 and "training mode: the patched blocks" in training[0], training
    assert len(double) == 1 and "float64 input: the patched blocks" in double[0], double
    notes = vit_fast.explain(model).notes
    assert sum("said at run time" in note for note in notes) == 2
    clone = copy.deepcopy(model)  # the record travels with the model: said already
    with torch.no_grad():
        assert _said(lambda: clone(x.double())) == []
