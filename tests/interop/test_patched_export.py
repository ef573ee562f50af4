"""A model patched in place, recorded for elsewhere: ``torch.jit.trace`` and ``torch.onnx.export`` (the torch.export
exporter and the TorchScript one) work on a patched timm or transformers model and record its library's own forward
(a TorchScript or ONNX graph cannot hold a Triton kernel), so the artifact computes what the unpatched model does."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")
onnx = pytest.importorskip("onnx", reason="onnx is not installed (make setup installs the export extra)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (make setup installs the export extra)")

import vit_fast  # noqa: E402


def _timm() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, embed_dim=32, num_heads=2)
    model.eval()
    return model, vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton"), torch.randn(2, 3, 32, 32)


def _hf() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4, intermediate_size=64
    )
    config._attn_implementation = "eager"
    config.return_dict = False  # a tuple, as torch.jit.trace wants
    torch.manual_seed(0)
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    return model, vit_fast.optimize(model, backend="triton"), torch.randn(2, 3, 16, 16)


MODELS = {"timm": _timm, "transformers": _hf}


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("library", sorted(MODELS))
def test_jit_trace_of_a_patched_model_records_the_librarys_forward(library):
    model, patched, x = MODELS[library]()
    with torch.no_grad():
        traced = torch.jit.trace(patched, (x,), check_trace=False)
        expected = _first(model(x))
        torch.testing.assert_close(_first(traced(x)), expected)
        y = torch.randn_like(x)  # the trace is a graph, not a replay of x
        torch.testing.assert_close(_first(traced(y)), _first(model(y)))
    assert "vit_fast" not in str(traced.inlined_graph)


# transformers under torch.export is tests/interop/test_hf_patch.py's export test (the same check of the graph)
@pytest.mark.parametrize(
    ("library", "dynamo"),
    [("timm", True), ("timm", False), ("transformers", False)],
    ids=["timm-torch.export", "timm-torchscript", "transformers-torchscript"],
)
def test_onnx_export_of_a_patched_model_runs_in_onnxruntime(library, dynamo, tmp_path):
    model, patched, x = MODELS[library]()
    path = tmp_path / "model.onnx"
    kwargs = {} if dynamo else {"dynamo": False}
    with torch.no_grad():
        torch.onnx.export(patched, (x,), str(path), input_names=["x"], **kwargs)
        expected = _first(model(x))
    graph = onnx.load(str(path)).graph
    assert not any("vit_fast" in (node.domain or "") or "vit_fast" in node.op_type for node in graph.node)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (ours, *_) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-4, atol=1e-5)
