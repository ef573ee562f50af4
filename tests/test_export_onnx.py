"""ONNX export and verification on tiny configs, both exporters, on ONNX Runtime's CPU provider.

Exports are slow (dynamo: ~5-15 s each on a shared 2-core CPU), so each artifact is built once
per module and shared by the tests that read it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx", reason="the onnx extra is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

import onnx  # noqa: E402

import vit_fast  # noqa: E402
from vit_fast import export, files  # noqa: E402
from vit_fast.export import onnx as onnx_export  # noqa: E402
from vit_fast.export import runners  # noqa: E402
from vit_fast.export.verify import default_batches  # noqa: E402

BATCH = (1, 5)
CONFIGS = {
    # 48 px / 8 px patches + class token = 37 tokens, class-token pooling
    "cls37": dict(img_size=48, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10),
    # class + 4 register tokens, position embedding on patches only, LayerScale; 21 tokens
    "reg_ls": dict(
        img_size=32,
        patch_size=8,
        embed_dim=48,
        depth=1,
        num_heads=3,
        num_classes=7,
        reg_tokens=4,
        no_embed_class=True,
        init_values=0.1,
    ),
    # no class token, 1 register token, average pooling with fc_norm, pooled features out; 17 tokens
    "avg": dict(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=1,
        num_heads=2,
        num_classes=0,
        class_token=False,
        reg_tokens=1,
        global_pool="avg",
    ),
}


def tiny_model(name: str, seed: int = 0) -> vit_fast.VisionTransformer:
    torch.manual_seed(seed)
    model = vit_fast.VisionTransformer(vit_fast.ViTConfig(**CONFIGS[name]), backend="torch").eval()
    with torch.no_grad():  # timm-style init leaves biases, tokens and the position embedding at 0
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def layer_norms(cfg: vit_fast.ViTConfig) -> int:
    return 2 * cfg.depth + 1  # norm1 + norm2 per block, plus the final norm or fc_norm


@pytest.fixture(scope="module")
def models() -> dict[str, vit_fast.VisionTransformer]:
    return {name: tiny_model(name) for name in CONFIGS}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory, models):
    """Exports built on first use and shared across this module: key -> path."""
    cache: dict[tuple, Path] = {}
    folder = tmp_path_factory.mktemp("onnx")

    def get(name: str, exporter: str, **kw) -> Path:
        key = (name, exporter, tuple(sorted(kw.items(), key=str)))
        if key not in cache:
            stem = "-".join([name, exporter, *(f"{k}={v}" for k, v in sorted(kw.items()))]).replace("torch.", "")
            cache[key] = export.to_onnx(
                models[name], folder / f"{stem}.onnx", batch=BATCH, exporter=exporter, progress=False, **kw
            )
        return cache[key]

    return get


# --------------------------------------------------------------------------- exports that must pass
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_export_and_verify(name, exporter, models, artifacts):
    path = artifacts(name, exporter)
    model = models[name]
    proto = onnx.load(str(path))
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["LayerNormalization"] == layer_norms(model.cfg), ops
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param, "batch dim must be symbolic"
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim[1:]] == [3, *model.cfg.img_hw]
    report = export.verify(model, path, print_table=False)
    assert report.passed
    assert [r.batch for r in report.rows] == [1, 3, 5]
    for row in report.rows:
        assert row.cosine > 0.99999
        assert row.top1_agreement == (1.0 if model.cfg.num_classes else None)
    assert proto.graph.output[0].name == ("logits" if model.cfg.num_classes else "pooled")


def test_metadata_json_and_props(models, artifacts):
    path = artifacts("cls37", "torchscript")
    meta = json.loads(Path(str(path) + ".json").read_text())
    assert meta["config"] == models["cls37"].cfg.to_dict()
    assert meta["exporter"] == "torchscript" and meta["opset"] == 18 and meta["dtype"] == "fp32"
    assert meta["batch"] == list(BATCH) and meta["vit_fast_version"] == vit_fast.__version__
    assert meta["git_commit"] == "unknown" or len(meta["git_commit"].split("+")[0]) == 40
    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    assert json.loads(props["vit_fast"]) == meta
    assert json.loads(props["vit_fast.config"]) == meta["config"] and props["vit_fast.batch"] == "[1, 5]"
    assert sorted(os.listdir(path.parent)) == sorted(  # nothing but artifacts and their metadata
        f for f in os.listdir(path.parent) if f.endswith((".onnx", ".onnx.json"))
    )


def test_export_leaves_the_model_alone(models, artifacts):
    model = models["cls37"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    artifacts("cls37", "dynamo", attention="fused")
    assert model.backend == "torch" and not model.cfg.dynamic_img_size
    assert type(model.blocks[0].attn).__name__ == "Attention"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_fused_attention(models, artifacts):
    path = artifacts("cls37", "dynamo", attention="fused")
    proto = onnx.load(str(path))
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["Attention"] == models["cls37"].cfg.depth and ops["Softmax"] == 0, ops
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 23
    assert export.verify(models["cls37"], path, print_table=False).passed


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_dynamic_image_size(models, artifacts, exporter):
    model = models["reg_ls"]
    path = artifacts("reg_ls", exporter, dynamic_size=True)
    assert Counter(n.op_type for n in onnx.load(str(path)).graph.node)["Resize"] == 1
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    assert [bool(d.dim_param) for d in dims] == [True, False, True, True]
    report = export.verify(model, path, print_table=False)
    assert report.passed and len({(r.height, r.width) for r in report.rows}) == 3
    report = export.verify(model, path, batches=[2], image_sizes=[(16, 48), (56, 24)], print_table=False)
    assert report.passed and [(r.height, r.width) for r in report.rows] == [(16, 48), (56, 24)]


def test_fp16(models, artifacts):
    path = artifacts("cls37", "torchscript", dtype=torch.float16)
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    report = export.verify(models["cls37"], path, print_table=False)
    assert report.passed and report.dtype == "fp16"
    assert all(r.eager_max_abs_err > 1e-5 for r in report.rows), "eager fp16 error should be fp16-sized"


def test_bf16_exports_but_cpu_ort_cannot_verify(models, artifacts):
    path = artifacts("avg", "torchscript", dtype="bf16")
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    with pytest.raises(export.ArtifactError, match=r"bf16 model.*ONNX Runtime.*TensorRT"):
        export.verify(models["avg"], path, print_table=False)


def test_labelled_data_accuracy(models, artifacts):
    model = models["cls37"]
    path = artifacts("cls37", "torchscript")
    images = torch.randn(7, 3, 48, 48)
    labels = model(images).argmax(-1)
    labels[:2] = (labels[:2] + 1) % 10
    report = export.verify(model, path, data=(images, labels), print_table=False)
    acc = report.accuracy
    assert acc["n"] == 7 and acc["top1_agreement"] == 1.0
    assert acc["eager_accuracy"] == pytest.approx(5 / 7) and acc["artifact_accuracy"] == pytest.approx(5 / 7)
    assert "labelled data (7 images)" in report.format_table()


def test_verify_json_and_failure(models, artifacts, tmp_path, capsys):
    path = artifacts("cls37", "torchscript")
    report = export.verify(models["cls37"], path, json_path=tmp_path / "ok.json")
    assert "PASSED" in capsys.readouterr().out
    assert json.loads((tmp_path / "ok.json").read_text())["passed"] is True and report.to_dict()["passed"]
    other = tiny_model("cls37", seed=1)  # same architecture, other weights
    with pytest.raises(export.VerificationError, match=r"worst is output 'logits' at batch \d+ \(48x48\)") as info:
        export.verify(other, path, json_path=tmp_path / "bad.json", print_table=False)
    assert not info.value.report.passed
    assert json.loads((tmp_path / "bad.json").read_text())["passed"] is False
    report = export.verify(other, path, print_table=False, raise_on_failure=False)
    assert not report.passed and report.worst().ratio > 1


def test_external_data_layout(models, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "_EXTERNAL_DATA_BYTES", 0)  # as if the weights were over 2 GB
    path = export.to_onnx(models["avg"], tmp_path / "big.onnx", batch=(1, 4), exporter="torchscript", progress=False)
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data", "big.onnx.json"]
    assert export.verify(models["avg"], path, print_table=False).passed


# --------------------------------------------------------------------------- atomicity
def _raise(*args, **kwargs):
    raise RuntimeError("injected failure")


# the stand-in exporter calls torch.onnx.export directly, outside vit-fast's own warning filter
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_fixed_batch_graph_is_refused(models, tmp_path, monkeypatch):
    def no_dynamic_axes(m, x, out, exporter, opset, *args):
        torch.onnx.export(m, (x,), str(out), dynamo=False, opset_version=opset, input_names=["images"])

    monkeypatch.setattr(onnx_export, "_run_exporter", no_dynamic_axes)
    with pytest.raises(export.ExportError, match=r"input 'images' has a fixed batch dimension"):
        export.to_onnx(models["avg"], tmp_path / "m.onnx", batch=(1, 4), exporter="torchscript", progress=False)
    assert os.listdir(tmp_path) == []


def test_exporter_failure_is_wrapped(models, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "_run_exporter", lambda *a, **k: _raise())
    with pytest.raises(
        export.ExportError,
        match=r"dynamo exporter could not trace VisionTransformer\(depth=1.*"
        r"injected failure; try exporter='torchscript'",
    ):
        export.to_onnx(models["avg"], tmp_path / "m.onnx", batch=(1, 4), progress=False)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- bad inputs, before any work
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(batch=(0, 4)), ValueError, r"min must be >= 1, got 0"),
        (dict(batch=(4, 2)), ValueError, r"min 4 > max 2"),
        (dict(batch=(1.5, 4)), ValueError, r"min must be an int, got 1.5"),
        (dict(batch=(True, 4)), ValueError, r"min must be an int, got True"),
        (dict(batch=(4,)), ValueError, r"batch must be a 2-tuple"),
        (dict(batch="1,4"), ValueError, r"batch must be a 2-tuple"),
        (dict(dtype=torch.int8), ValueError, r"dtype must be one of"),
        (dict(dtype="fp8"), ValueError, r"dtype must be one of"),
        (dict(opset=16), ValueError, r"opset 16 is too old: need >= 17"),
        (dict(opset="18"), ValueError, r"opset must be an int"),
        (dict(exporter="onnxscript"), ValueError, r"exporter must be one of"),
        (dict(attention="flash"), ValueError, r"attention must be one of"),
        (dict(attention="fused", exporter="torchscript"), ValueError, r"needs exporter='dynamo'"),
        (dict(attention="fused", opset=18), ValueError, r"needs opset >= 23"),
        (dict(exporter="torchscript", opset=21), ValueError, r"TorchScript exporter supports opset <= 20"),
    ],
)
def test_bad_arguments(models, tmp_path, monkeypatch, kwargs, error, match):
    monkeypatch.setattr(onnx_export, "_run_exporter", _raise)  # must never be reached
    with pytest.raises(error, match=match):
        export.to_onnx(models["avg"], tmp_path / "m.onnx", **{"batch": (1, 4), **kwargs})
    assert os.listdir(tmp_path) == []


def test_bad_model_and_paths(models, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "_run_exporter", _raise)
    with pytest.raises(TypeError, match=r"got Linear.*vit_fast.optimize"):
        export.to_onnx(torch.nn.Linear(2, 2), tmp_path / "m.onnx")
    with pytest.raises(ValueError, match=r"output folder .*missing.* does not exist"):
        export.to_onnx(models["avg"], tmp_path / "missing" / "m.onnx")
    with pytest.raises(ValueError, match=r"is a folder"):
        export.to_onnx(models["avg"], tmp_path)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.tempfile, "mkstemp", denied)  # root ignores chmod, so simulate it
    with pytest.raises(ValueError, match=r"output folder .* cannot be written: Permission denied"):
        export.to_onnx(models["avg"], tmp_path / "m.onnx")


def test_unreadable_artifacts_name_the_file(models, artifacts, tmp_path):
    model = models["cls37"]
    with pytest.raises(FileNotFoundError, match=r"artifact '.*nothing.onnx' does not exist"):
        export.verify(model, tmp_path / "nothing.onnx")
    (tmp_path / "corrupt.onnx").write_bytes(b"\x08\x07this is not a protobuf\xff\xff")
    with pytest.raises(export.ArtifactError, match=r"cannot read '.*corrupt.onnx' as an ONNX model"):
        export.verify(model, tmp_path / "corrupt.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(export.ArtifactError, match=r"empty.onnx' is not an ONNX model"):
        export.verify(model, tmp_path / "empty.onnx")
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(export.ArtifactError, match=r"cannot tell what '.*model.bin' is"):
        export.verify(model, tmp_path / "model.bin")
    with pytest.raises(export.ArtifactError, match=r"is not a file"):
        export.verify(model, tmp_path)
    good = artifacts("cls37", "torchscript")
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(good.read_bytes())
    Path(str(copy) + ".json").write_text("{not json")
    with pytest.raises(export.ArtifactError, match=r"metadata '.*copy.onnx.json' .* cannot be read as JSON"):
        export.verify(model, copy)


def test_verify_argument_errors(models, artifacts):
    path = artifacts("cls37", "torchscript")
    with pytest.raises(ValueError, match=r"exported from another architecture: config fields \['depth'"):
        export.verify(tiny_model("reg_ls"), path)
    with pytest.raises(ValueError, match=r"holds a fp32 model, not fp16"):
        export.verify(models["cls37"], path, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"batches must be ints >= 1"):
        export.verify(models["cls37"], path, batches=[0])
    with pytest.raises(ValueError, match=r"takes 48x48 images only"):
        export.verify(models["cls37"], path, image_sizes=[(48, 48), (56, 56)])
    with pytest.raises(ValueError, match=r"data must be \(images"):
        export.verify(models["cls37"], path, data=(torch.randn(3, 3, 48, 48), torch.zeros(2, dtype=torch.long)))
    with pytest.raises(TypeError, match=r"verify takes a vit_fast.VisionTransformer"):
        export.verify(torch.nn.Linear(2, 2), path)


# --------------------------------------------------------------------------- small parts
def test_runners_share_one_interface(models, artifacts):
    """open_artifact picks ONNX Runtime for .onnx; run(x) and prepare(x)() agree; threads are set and recorded."""
    model = models["cls37"]
    x = torch.randn(3, 3, 48, 48)
    ort = export.open_artifact(artifacts("cls37", "torchscript"), provider="CPUExecutionProvider", threads=1)
    assert isinstance(ort, runners.OrtRunner) and ort.dtype == torch.float32 and ort.output_name == "logits"
    assert ort.session.get_session_options().intra_op_num_threads == 1
    assert "CPUExecutionProvider" in ort.runtime and "intra_op_num_threads=1" in ort.runtime
    assert ort.batch_range is None  # a dynamic batch: the metadata beside the file says the range
    ort.check_batch(64)
    call = ort.prepare(x)
    first, second = call(), call()
    assert torch.equal(first, second) and torch.equal(ort.run(x), first)
    with torch.no_grad():
        eager = model(x)
    assert first.shape == eager.shape and (first - eager).abs().max().item() < 1e-4
    ours = runners.ModelRunner(model, "torch", torch.float32, device="cpu")
    assert ours.runtime == "vit_fast torch backend on CPU" and ours.batch_range is None
    assert torch.equal(ours.run(x), eager) and torch.equal(ours.prepare(x)(), eager)
    with pytest.raises(ValueError, match=r"backend must be one of \('torch', 'triton'\)"):
        runners.ModelRunner(model, "tensorrt", torch.float32)
    with pytest.raises(ValueError, match=r"threads must be >= 1, got 0"):
        runners.OrtRunner(artifacts("cls37", "torchscript"), threads=0)
    with pytest.raises(export.ArtifactError, match=r"provider NoSuchExecutionProvider is not available here"):
        runners.OrtRunner(artifacts("cls37", "torchscript"), provider="NoSuchExecutionProvider")


def test_default_batches():
    assert default_batches((1, 64)) == [1, 3, 64]
    assert default_batches((1, 5)) == [1, 3, 5]
    assert default_batches((1, 2)) == [1, 2]
    assert default_batches((1, 1)) == [1]
    assert default_batches((4, 16)) == [4, 5, 16]
