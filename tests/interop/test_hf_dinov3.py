"""vit_fast.interop.hf_dinov3: transformers' DINOv3 (DINOv3ViTModel, DINOv3ViTBackbone) patched in place, each layer on
our kernels with RoPE rotated in the attention kernel (5 launches per layer, none for the rotation), judged by the
numerics rule against the unpatched model in float64; and the layer's own forward where the kernels step aside."""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")

import vit_fast  # noqa: E402
from vit_fast.interop import hf_classes, hf_dinov3, hf_patch  # noqa: E402

from ..fakes import as_float64, count_calls, kernel_launches  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
#: (class, register tokens, gated MLP, hidden_act): plain and gated MLPs (SiLU's gate in the fc1 epilogue, GELU's in
#: PyTorch between fc1 and fc2), 1 to 4 register tokens; key_bias False (the default: k has no bias)
ROWS = {
    "DINOv3ViTModel-plain": ("DINOv3ViTModel", 1, False, "gelu"),
    "DINOv3ViTModel-swiglu": ("DINOv3ViTModel", 4, True, "silu"),
    "DINOv3ViTBackbone-plain": ("DINOv3ViTBackbone", 3, False, "gelu"),
    "DINOv3ViTBackbone-gated_gelu": ("DINOv3ViTBackbone", 2, True, "gelu"),
}
MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
CASES = sorted((row, mode) for row in ROWS for mode in MODES)


def _model(cls_name: str, registers: int, gated: bool, act: str):
    torch.manual_seed(0)
    config = transformers.DINOv3ViTConfig(
        **TINY, intermediate_size=96, num_register_tokens=registers, use_gated_mlp=gated, hidden_act=act
    )
    if cls_name == "DINOv3ViTBackbone":
        config.out_features = ["stage1", "stage2"]
    config._attn_implementation = "eager"  # sdpa has no attention probabilities to give back
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():  # randomise LayerScale, biases and norms so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _outputs(model, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The main output (the last hidden state, normed) and every hidden state (embeddings, then each layer's)."""
    out = model(pixel_values=x, output_hidden_states=True)
    main = out.last_hidden_state if out.last_hidden_state is not None else out.feature_maps[-1]
    return (main, *out.hidden_states)


def test_every_class_of_the_family_is_patched_with_a_parity_row():
    """transformers' DINOv3 classes (its modeling module's __all__): all supported, none refused, each judged below."""
    module = importlib.import_module("transformers.models.dinov3_vit.modeling_dinov3_vit")
    names = {name for name in module.__all__ if not name.endswith("PreTrainedModel")}
    assert names == set(hf_classes.SUPPORTED["dinov3_vit"]) == {cls for cls, *_ in ROWS.values()}
    assert not names & set(hf_classes.REFUSED)


@pytest.mark.parametrize(("row", "mode"), CASES, ids=[f"{r}-{m}" for r, m in CASES])
def test_patched_dinov3_matches_the_unpatched_model_in_float64(row, mode, monkeypatch):
    """The patched copy's main output and every hidden state within the numerics rule of the unpatched model in
    float64; each layer ran the RoPE path once with 5 launches (1 attention), so a fallback cannot pass."""
    model = _model(*ROWS[row])
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        eager = _outputs(model, x)
        expected = _outputs(copy.deepcopy(model).double(), as_float64(x))
    runs = count_calls(monkeypatch, hf_patch, "run_rope_view")
    with MODES[mode]():
        ours, launched = kernel_launches(lambda: _outputs(patched, x))
    layers = len(hf_patch.vision_layers(patched))
    assert layers == TINY["num_hidden_layers"] and len(runs) == layers
    assert launched == {"_linear_kernel": 4 * layers, "_attention_kernel": layers}, launched
    assert len(ours) == len(expected) == layers + 2
    for i, (o, e, r) in enumerate(zip(ours, eager, expected, strict=True)):
        assert_within_eager(o, e, r, name=f"{row} {mode} output {i}")


def test_rope_tables_are_the_models_with_class_and_registers_unrotated():
    """The layer hands the attention op the model's own (cos, sin) views, 1 + registers prefix tokens, half layout;
    none without tables, with a mask, or with tables that are not one [T_rot, Dh] pair for the tokens."""
    model = _model("DINOv3ViTModel", 3, False, "gelu")
    layer = hf_patch.vision_layers(model)[0]
    x = torch.randn(2, 1 + 3 + 16, 64)
    cos, sin = model.rope_embeddings(torch.randn(2, 3, 32, 32))
    tables = hf_dinov3.rope_tables(layer, x, None, (cos, sin))
    assert tables[0] is cos and tables[1] is sin and tables[2:] == (4, "half")
    assert hf_dinov3.rope_tables(layer, x, None, None) is None
    assert hf_dinov3.rope_tables(layer, x, torch.zeros(2, 1, 20, 20), (cos, sin)) is None
    assert hf_dinov3.rope_tables(layer, x, None, (cos[None], sin[None])) is None
    assert hf_dinov3.rope_tables(layer, x[:, :8], None, (cos, sin)) is None  # more table rows than tokens


def test_a_layer_without_tables_or_with_a_mask_runs_its_own_forward():
    """Called with no position_embeddings (transformers' forward raises as it does unpatched) or with an attention
    mask (the layer's own forward, the same result), a patched layer launches no kernel."""
    model = _model("DINOv3ViTModel", 2, True, "silu")
    layer = hf_patch.vision_layers(model)[0]
    patched = hf_patch.vision_layers(vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton"))[0]
    x = torch.randn(2, 1 + 2 + 16, 64)
    tables = model.rope_embeddings(torch.randn(2, 3, 32, 32))
    mask = torch.zeros(2, 1, 19, 19)
    mask[..., -3:] = -1e4
    with torch.no_grad():
        with pytest.raises(TypeError):
            layer(x)
        with pytest.raises(TypeError):
            kernel_launches(lambda: patched(x))
        ours, launched = kernel_launches(lambda: patched(x, attention_mask=mask, position_embeddings=tables))
        assert sum(launched.values()) == 0, launched
        torch.testing.assert_close(ours, layer(x, attention_mask=mask, position_embeddings=tables), rtol=0, atol=0)


def test_attentions_requested_run_transformers_forward_and_come_back():
    """output_attentions=True: every layer's own forward (no launch), the attentions and outputs as unpatched."""
    model = _model("DINOv3ViTModel", 1, False, "gelu")
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback is said once (tests/interop/test_fallbacks_said.py)
        out, launched = kernel_launches(lambda: patched(pixel_values=x, output_attentions=True))
        expected = model(pixel_values=x, output_attentions=True)
    assert sum(launched.values()) == 0, launched
    assert len(out.attentions) == len(expected.attentions) == TINY["num_hidden_layers"]
    ours, theirs = (*out.attentions, out.last_hidden_state), (*expected.attentions, expected.last_hidden_state)
    for o, e in zip(ours, theirs, strict=True):
        torch.testing.assert_close(o, e, rtol=0, atol=0)


def _input_and_parameter_grads(model, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """d(sum of the last hidden state times a fixed weight)/d(pixels, every parameter), autograd on, model in eval."""
    x = x.clone().requires_grad_()
    out = model(pixel_values=x).last_hidden_state
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * weight).sum(), (x, *(p for _, p in named)), allow_unused=True)
    return {n: g for n, g in zip(("input", *(n for n, _ in named)), grads, strict=True) if g is not None}


def test_eval_with_grad_runs_the_kernels_and_gradients_match(monkeypatch):
    """An eval model called with autograd on: the layers run the RoPE path, and the gradients w.r.t. the pixels and
    every parameter (q, k, v and gate, up, which the fused path stacks) are within the numerics rule."""
    model = _model(*ROWS["DINOv3ViTModel-swiglu"])
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton")
    x = torch.randn(2, 3, 32, 32)
    eager = _input_and_parameter_grads(model, x)
    expected = _input_and_parameter_grads(copy.deepcopy(model).double(), x.double())
    runs = count_calls(monkeypatch, hf_patch, "run_rope_view")
    ours, launched = kernel_launches(lambda: _input_and_parameter_grads(patched, x))
    assert len(runs) == TINY["num_hidden_layers"] and launched["_attention_kernel"] == len(runs), launched
    assert set(ours) == set(eager) == set(expected)
    assert any(".k_proj." in name for name in ours) and any(".gate_proj." in name for name in ours)
    for name in ours:
        assert_within_eager(ours[name], eager[name], expected[name], name=f"grad {name}")


def test_a_patched_dinov3_compiles_fullgraph_with_the_rope_attention_op_in_the_graph():
    """torch.compile(fullgraph=True) traces the patched DINOv3 in one graph holding our ops (the RoPE tables passed to
    vit_fast::attention), whose run launches the kernels and matches float64 by the rule."""
    model = _model(*ROWS["DINOv3ViTModel-swiglu"])
    patched = vit_fast.optimize(model, backend="triton")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        eager = model(pixel_values=x).last_hidden_state
        expected = copy.deepcopy(model).double()(pixel_values=x.double()).last_hidden_state
    torch._dynamo.reset()
    targets: set[str] = set()

    def record(graph: torch.fx.GraphModule, example_inputs):
        targets.update(str(node.target) for node in graph.graph.nodes if node.op == "call_function")
        return graph.forward

    compiled = torch.compile(patched, fullgraph=True, backend=record)
    with torch.no_grad():
        ours, launched = kernel_launches(lambda: compiled(pixel_values=x).last_hidden_state)
    assert "vit_fast.attention.default" in targets, sorted(targets)
    assert launched == {"_linear_kernel": 8, "_attention_kernel": 2}, launched
    assert_within_eager(ours, eager, expected, name="compiled DINOv3ViTModel")
