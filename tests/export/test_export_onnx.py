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
from vit_fast import export
from vit_fast.export import onnx as onnx_export  # noqa: E402
from vit_fast.export import runners  # noqa: E402
from vit_fast.export.verify import default_batches  # noqa: E402
from vit_fast.util import (
    files,
    numerics,  # noqa: E402
)

from ..fakes import tiny_hf_classifier  # noqa: E402

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
    cache: dict[str, Path] = {}
    folder = tmp_path_factory.mktemp("onnx")

    def get(name: str, exporter: str, **kw) -> Path:
        key = repr((name, exporter, sorted(kw.items(), key=str)))
        if key not in cache:
            path = folder / f"{name}-{exporter}-{len(cache)}.onnx"
            # unverified on purpose: the tests verify these files themselves, many times over
            kw = {"verify": False, **kw}
            cache[key] = export.to_onnx(models[name], path, batch=BATCH, exporter=exporter, progress=False, **kw)
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
    assert files.written_by_vit_fast(Path(str(path) + ".json"))  # it carries the digest of its own bytes
    meta = json.loads(Path(str(path) + ".json").read_text())
    assert len(meta.pop(files.DIGEST_KEY)) == 64 and meta == export.read_metadata(path)
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
    def no_dynamic_axes(m, x, out, options, *args):
        torch.onnx.export(m, (x,), str(out), dynamo=False, opset_version=options.opset, input_names=["images"])

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

    monkeypatch.setattr(files.checks.tempfile, "mkstemp", denied)  # root ignores chmod, so simulate it
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


# --------------------------------------------------------------------------- outputs, I/O names, preprocessing
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
VERIFIED = dict(exporter="torchscript", progress=False, verify=export.VerifyOptions(print_table=False))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_several_outputs_each_judged(models, artifacts, exporter):
    model = models["reg_ls"]
    path = artifacts("reg_ls", exporter, outputs=("logits", "pooled", "last_hidden_state"))
    proto = onnx.load(str(path))
    assert [o.name for o in proto.graph.output] == ["logits", "pooled", "last_hidden_state"]
    meta = export.read_metadata(path)
    assert meta["outputs"] == meta["output_names"] == ["logits", "pooled", "last_hidden_state"]
    x = torch.randn(2, 3, 32, 32)
    outs = export.open_artifact(path).run_all(x)
    with torch.no_grad():
        tokens = model.forward_features(x)
        expect = {
            "logits": model(x),
            "pooled": model.forward_head(tokens, pre_logits=True),
            "last_hidden_state": tokens,
        }
    for name, value in expect.items():  # against the model's own API, not the graph module verify uses
        assert outs[name].shape == value.shape and (outs[name] - value).abs().max() < 1e-4, name
    report = export.verify(model, path, print_table=False)
    assert report.passed and report.outputs == ["logits", "pooled", "last_hidden_state"]
    assert [(r.output, r.batch) for r in report.rows][:3] == [("logits", 1), ("pooled", 1), ("last_hidden_state", 1)]
    assert len(report.rows) == 3 * 3


def test_a_wrong_second_output_fails_verification(models, artifacts, monkeypatch):
    path = artifacts("reg_ls", "torchscript", outputs=("logits", "pooled", "last_hidden_state"))
    real = runners.OrtRunner.run_all

    def wrong_tokens(self, x):
        outs = real(self, x)
        outs["last_hidden_state"] = outs["last_hidden_state"] * 1.001
        return outs

    monkeypatch.setattr(runners.OrtRunner, "run_all", wrong_tokens)
    with pytest.raises(export.VerificationError, match=r"worst is output 'last_hidden_state'"):
        export.verify(models["reg_ls"], path, print_table=False)


def test_io_names_as_optimum_names_them(models, artifacts):
    path = artifacts("cls37", "dynamo", input_name="pixel_values", output_names=("logits",))
    proto = onnx.load(str(path))
    assert proto.graph.input[0].name == "pixel_values" and [o.name for o in proto.graph.output] == ["logits"]
    assert export.read_metadata(path)["input"] == "pixel_values"
    assert export.verify(models["cls37"], path, print_table=False).passed


@pytest.mark.parametrize(
    "exporter, layout, dtype",
    [("torchscript", "NHWC", "fp32"), ("dynamo", "NCHW", "fp32"), ("torchscript", "NHWC", "fp16")],
)
def test_uint8_preprocessing_front(models, artifacts, exporter, layout, dtype):
    model = models["cls37"]
    pre = dict(layout=layout, mean=MEAN, std=STD)
    path = artifacts("cls37", exporter, preprocess=pre, dtype=dtype)
    graph_input = onnx.load(str(path)).graph.input[0]
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    dims = [d.dim_value for d in graph_input.type.tensor_type.shape.dim[1:]]
    assert dims == ([48, 48, 3] if layout == "NHWC" else [3, 48, 48])
    meta = export.read_metadata(path)
    assert meta["preprocess"] == {
        "input_dtype": "uint8",
        "layout": layout,
        "mean": list(MEAN),
        "std": list(STD),
        "scale": pytest.approx(1 / 255),
    }
    assert meta["input_dtype"] == "uint8" and meta["input_layout"] == layout and meta["dtype"] == dtype
    # the graph normalises as a user would by hand: (x / 255 - mean) / std, channels first
    pixels = torch.randint(0, 256, (2, 48, 48, 3) if layout == "NHWC" else (2, 3, 48, 48), dtype=torch.uint8)
    nchw = pixels.permute(0, 3, 1, 2) if layout == "NHWC" else pixels
    by_hand = (nchw.double() / 255 - torch.tensor(MEAN).double().view(1, 3, 1, 1)) / torch.tensor(STD).double().view(
        1, 3, 1, 1
    )
    runner = export.open_artifact(path)
    assert runner.input_dtype == torch.uint8 and runner.dtype == (torch.float16 if dtype == "fp16" else torch.float32)
    with torch.no_grad():
        expect = model.double()(by_hand).float()
        model.float()
    got = runner.run(pixels).float()
    assert (got - expect).abs().max() < (5e-2 if dtype == "fp16" else 1e-4)
    report = export.verify(model, path, print_table=False)
    assert report.passed and report.preprocess["layout"] == layout


def test_preprocessed_artifact_accuracy_takes_uint8_images(models, artifacts):
    model = models["cls37"]
    path = artifacts("cls37", "torchscript", preprocess=dict(layout="NHWC", mean=MEAN, std=STD))
    pixels = torch.randint(0, 256, (5, 48, 48, 3), dtype=torch.uint8)
    labels = torch.zeros(5, dtype=torch.long)
    report = export.verify(model, path, data=(pixels, labels), print_table=False)
    assert report.accuracy["n"] == 5 and report.accuracy["top1_agreement"] == 1.0
    with pytest.raises(ValueError, match=r"takes uint8 images \(NHWC\).*got torch.float32"):
        export.verify(model, path, data=(pixels.float(), labels), print_table=False)
    # pixels in the other layout are refused before any run, with the permute that fixes them (ONNX Runtime
    # answered with its raw "Got invalid dimensions" text)
    with pytest.raises(ValueError, match=r"shape \(5, 3, 48, 48\), but this artifact takes 3-channel images as "
                       r"\[N, H, W, C\]: give them in that layout \(e.g. images.permute\(0, 2, 3, 1\)\)"):  # fmt: skip
        export.verify(model, path, data=(pixels.permute(0, 3, 1, 2), labels), print_table=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(outputs=("logits",)), r"no classifier head \(num_classes=0\), so no 'logits': ask for 'pooled'"),
        (dict(outputs=("pooled", "tokens")), r"unknown output 'tokens': choose from logits, pooled, last_hidden_state"),
        (dict(outputs=("pooled", "pooled")), r"name one output twice"),
        (dict(outputs=()), r"at least one"),
        (dict(outputs=("pooled",), output_names=("a", "b")), r"one name for each of the outputs"),
        (dict(outputs=("pooled", "last_hidden_state"), output_names=("a", "a")), r"must all differ"),
        (dict(input_name="pooled"), r"input name 'pooled' and output names \('pooled',\) must all differ"),
        (dict(input_name=""), r"non-empty strings"),
        (dict(preprocess=dict(mean=MEAN)), r"preprocess needs std="),
        (dict(preprocess=dict(mean=MEAN, std=(1, 0, 1))), r"std must be > 0"),
        (dict(preprocess=dict(mean=(0.5, 0.5), std=STD)), r"mean must be 3 finite numbers"),
        (dict(preprocess=dict(mean=MEAN, std=STD, layout="HWC")), r"layout must be one of \('NCHW', 'NHWC'\)"),
        (dict(preprocess=dict(mean=MEAN, std=STD, scale=0)), r"scale must be a positive number"),
        (dict(preprocess=dict(mean=MEAN, std=STD, resize=224)), r"unknown keys \['resize'\]"),
        (dict(preprocess="imagenet"), r"preprocess must be None or a dict"),
        (dict(report="r.json", verify=False), r"report= is the verification report: pass verify=True"),
        (dict(verify="yes"), r"verify must be True, False or a VerifyOptions"),
        (dict(dtype="bf16", verify=True), r"bf16 ONNX files cannot be verified on ONNX Runtime's CPU provider"),
    ],
)
def test_bad_graph_arguments(models, tmp_path, monkeypatch, kwargs, match):
    monkeypatch.setattr(onnx_export, "_run_exporter", _raise)  # must never be reached
    monkeypatch.chdir(tmp_path)
    with pytest.raises((ValueError, TypeError), match=match):
        export.to_onnx(models["avg"], tmp_path / "m.onnx", **{"batch": (1, 4), **kwargs})
    assert os.listdir(tmp_path) == []


def test_hugging_face_drop_in_exports_and_verifies(tmp_path):
    hf = tiny_hf_classifier()
    dropin = vit_fast.optimize(hf)
    assert type(dropin) is type(hf)  # the user's own class; export takes it through vit_fast.from_hf
    path = export.to_onnx(dropin, tmp_path / "hf.onnx", batch=(1, 3), input_name="pixel_values", **VERIFIED)
    meta = export.read_metadata(path)
    assert meta["verification"]["passed"] and meta["weights"]["source"]["kind"] == "hf"
    assert export.verify(dropin, path, print_table=False).passed
    with torch.no_grad():
        expect = hf(pixel_values=torch.ones(1, 3, 32, 32)).logits
    assert (export.open_artifact(path).run(torch.ones(1, 3, 32, 32)) - expect).abs().max() < 1e-4


# --------------------------------------------------------------------------- provenance
def test_verification_and_weights_are_recorded(tmp_path):
    cfg = vit_fast.ViTConfig(**CONFIGS["avg"])
    model = vit_fast.VisionTransformer(cfg, backend="torch").eval()
    model.init_weights(seed=5)
    path = export.to_onnx(model, tmp_path / "m.onnx", batch=(1, 4), report=tmp_path / "report.json", **VERIFIED)
    meta = export.read_metadata(path)
    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    assert json.loads(props["vit_fast"]) == meta and props["vit_fast.weights"] == "random (seed 5)"
    assert props["vit_fast.verified"] == "true"
    assert meta["weights"] == {"description": "random (seed 5)", "source": {"kind": "random", "seed": 5}}
    record = meta["verification"]
    assert record["passed"] and record["rule"] == numerics.RULE and record["batches"] == [1, 3, 4]
    assert isinstance(record["seed"], int) and record["date_utc"].endswith("+00:00")
    assert record["versions"]["vit_fast"] == vit_fast.__version__ and record["versions"]["onnxruntime"]
    assert record["worst"]["ratio"] <= 1 and record["weights"]["description"] == "random (seed 5)"
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["passed"] and saved["seed"] == record["seed"] and saved["artifact"] == str(path)
    assert saved["vit_fast_version"] == vit_fast.__version__ and saved["weights"] == meta["weights"]
    shown = export.format_verification(record)
    assert "verification: PASSED on" in shown and f"seed {record['seed']}" in shown
    assert "weights: random (seed 5)" in shown and "batches 1, 3, 4" in shown
    # the drawn seed reproduces the run exactly
    again = export.verify(model, path, seed=record["seed"], print_table=False)
    assert again.seed == record["seed"] and again.worst().max_abs_err == record["worst"]["max_abs_err"]


def test_unverified_export_says_so(models, artifacts):
    meta = export.read_metadata(artifacts("cls37", "torchscript"))
    assert meta["verification"] is None
    assert "none recorded" in export.format_verification(meta["verification"])


def test_verify_draws_and_records_a_seed(models, artifacts, tmp_path):
    path = artifacts("cls37", "torchscript")
    a = export.verify(models["cls37"], path, print_table=False, json_path=tmp_path / "v.json")
    b = export.verify(models["cls37"], path, print_table=False)
    assert isinstance(a.seed, int) and a.seed != b.seed  # fresh inputs each call, each recorded
    assert json.loads((tmp_path / "v.json").read_text())["seed"] == a.seed
    assert f"seed {a.seed}" in a.format_table()
