"""TensorRT engine building: every check that runs without TensorRT, and engine tests where it is importable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx", reason="the onnx extra is not installed")

import vit_fast  # noqa: E402
from vit_fast import export  # noqa: E402
from vit_fast.export import tensorrt as trt_export  # noqa: E402
from vit_fast.export import trt_common  # noqa: E402

CFG = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=5)


def _tensorrt_missing() -> str | None:
    try:
        import tensorrt  # noqa: F401
    except ImportError as err:
        return f"tensorrt is not importable here ({err})"
    if not torch.cuda.is_available():
        return "TensorRT engines need a CUDA GPU; none is visible"
    return None


needs_tensorrt = pytest.mark.skipif(_tensorrt_missing() is not None, reason=str(_tensorrt_missing()))


@pytest.fixture(scope="module")
def model() -> vit_fast.VisionTransformer:
    torch.manual_seed(0)
    return vit_fast.VisionTransformer(vit_fast.ViTConfig(**CFG), backend="torch").eval()


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory, model) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("trt")
    return {
        dtype: export.to_onnx(
            model,
            folder / f"m-{dtype}.onnx",
            batch=(1, 16),
            dtype=dtype,
            exporter="torchscript",
            source=None,
            progress=False,
        )
        for dtype in ("fp32", "fp16")
    }


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(precision="int8"), ValueError, r"precision must be one of \('fp16', 'bf16', 'fp32'\)"),
        (dict(batch=(4, 2, 8)), ValueError, r"min 4 > opt 2"),
        (dict(batch=(1, 8, 4)), ValueError, r"opt 8 > max 4"),
        (dict(batch=(0, 1, 2)), ValueError, r"min must be >= 1"),
        (dict(batch=(1, 2)), ValueError, r"3-tuple of ints \(min, opt, max\)"),
        (dict(batch=(1, 2.0, 4)), ValueError, r"opt must be an int"),
        (dict(batch=(1, 8, 32)), ValueError, r"outside the ONNX file's exported batch range \[1, 16\]"),
    ],
)
def test_bad_arguments(onnx_files, tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        export.to_tensorrt(onnx_files["fp32"], tmp_path / "m.plan", **kwargs)
    assert os.listdir(tmp_path) == []


def test_bad_files(onnx_files, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ONNX file '.*missing.onnx' does not exist"):
        export.to_tensorrt(tmp_path / "missing.onnx", tmp_path / "m.plan")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\xff\xfe not an onnx file")
    with pytest.raises(export.ArtifactError, match=r"corrupt.onnx"):
        export.to_tensorrt(corrupt, tmp_path / "m.plan")
    with pytest.raises(ValueError, match=r"output folder .* does not exist"):
        export.to_tensorrt(onnx_files["fp32"], tmp_path / "no" / "m.plan")
    with pytest.raises(ValueError, match=r"is a fp16 model, built strongly typed: precision must be 'fp16'"):
        export.to_tensorrt(onnx_files["fp16"], tmp_path / "m.plan", precision="fp32")
    with pytest.raises(ValueError, match=r"timing cache folder .* does not exist"):
        export.to_tensorrt(onnx_files["fp32"], tmp_path / "m.plan", timing_cache=tmp_path / "no" / "t.cache")
    with pytest.raises(ValueError, match=r"cannot verify the engine: pass model="):
        export.to_tensorrt(onnx_files["fp32"], tmp_path / "m.plan", batch=(1, 4, 16))
    assert sorted(os.listdir(tmp_path)) == ["corrupt.onnx"]


@pytest.mark.skipif(_tensorrt_missing() is None, reason="tensorrt is importable here")
def test_missing_tensorrt_is_reported(onnx_files, model, tmp_path):
    with pytest.raises(RuntimeError, match=r"TensorRT is not installed here.*pip install tensorrt"):
        export.to_tensorrt(onnx_files["fp32"], tmp_path / "m.plan", batch=(1, 4, 16), model=model)
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"engine bytes")
    with pytest.raises(RuntimeError, match=r"TensorRT is not installed here"):
        export.verify(model, plan)
    assert sorted(os.listdir(tmp_path)) == ["m.plan"]


def test_engine_metadata_mismatch_says_what_to_rebuild():
    meta = {"tensorrt_version": "10.3.0", "gpu_sm": "sm_90", "gpu_name": "NVIDIA H100", "onnx": "m.onnx"}
    trt_common.check_engine_compat(meta, "m.plan", "10.3.0", "sm_90")
    with pytest.raises(
        export.ArtifactError,
        match=r"built with TensorRT 10.3.0, this machine has TensorRT 10.9.0.*"
        r"rebuild it here: vit-fast export tensorrt m.onnx --out m.plan",
    ):
        trt_common.check_engine_compat(meta, "m.plan", "10.9.0", "sm_90")
    with pytest.raises(export.ArtifactError, match=r"built for GPU sm_90 \(NVIDIA H100\), this GPU is sm_80.*rebuild"):
        trt_common.check_engine_compat(meta, "m.plan", "10.3.0", "sm_80")


def test_batch_outside_profile():
    trt_common.check_batch_in_profile(8, (1, 8, 16), "m.plan")
    with pytest.raises(
        export.ArtifactError,
        match=r"batch 32 is outside engine 'm.plan'.s profile \(min 1, opt 8, "
        r"max 16\): rebuild with --batch 1 8 32",
    ):
        trt_common.check_batch_in_profile(32, (1, 8, 16), "m.plan")


def test_attention_fused_from_inspector_layers():
    assert trt_export.attention_fused([{"Name": "myl0_1", "TacticName": "_gemm_mha_v2_fp16"}])
    assert trt_export.attention_fused(["{ForeignNode[/blocks.0/attn/Attention]}"])
    assert not trt_export.attention_fused(
        [
            {"Name": "/blocks.0/attn/MatMul", "LayerType": "MatrixMultiply"},
            {"Name": "/blocks.0/attn/Softmax", "LayerType": "SoftMax"},
        ]
    )


def test_default_timing_cache_is_per_version_and_gpu(tmp_path):
    path = trt_export.default_timing_cache(tmp_path / "m.plan", "10.3.0", "sm_90")
    assert path == tmp_path / "vit-fast-trt10.3.0-sm_90.timing-cache"


# --------------------------------------------------------------------------- with TensorRT and a GPU
@pytest.mark.tensorrt
@needs_tensorrt
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_build_and_verify_engine(onnx_files, model, tmp_path, precision):
    cache = tmp_path / "timing.cache"
    plan = export.to_tensorrt(
        onnx_files["fp32"],
        tmp_path / "m.plan",
        batch=(1, 4, 16),
        precision=precision,
        timing_cache=cache,
        model=model,
        progress=False,
    )
    meta = json.loads(Path(str(plan) + ".json").read_text())
    assert meta["precision"] == precision and meta["verification"]["passed"]
    assert meta["profiles"][0]["max"] == [16, 3, 32, 32] and cache.stat().st_size > 0
    report = export.verify(model, plan, print_table=False)
    assert report.passed and [r.batch for r in report.rows] == [1, 3, 16]
    with pytest.raises(export.ArtifactError, match=r"batch 17 is outside engine"):
        export.verify(model, plan, batches=[17])


@pytest.mark.tensorrt
@needs_tensorrt
def test_engine_failing_verification_is_not_left(onnx_files, tmp_path):
    torch.manual_seed(1)
    other = vit_fast.VisionTransformer(vit_fast.ViTConfig(**CFG), backend="torch").eval()
    with pytest.raises(export.VerificationError):
        export.to_tensorrt(
            onnx_files["fp32"],
            tmp_path / "m.plan",
            batch=(1, 4, 16),
            model=other,
            timing_cache=tmp_path / "t.cache",
            progress=False,
        )
    assert sorted(os.listdir(tmp_path)) == ["t.cache"]


# --------------------------------------------------------------------------- pure-Python TensorRT helpers
class _FakeEnum:
    """Stands in for a pybind11 enum member: ``.name``, and ``str()`` as ``"DataType.HALF"``."""

    def __init__(self, name: str, with_name: bool = True) -> None:
        self._name = name
        if with_name:
            self.name = name

    def __str__(self) -> str:
        return f"DataType.{self._name}"


def test_trt_dtype_names_map_to_torch():
    assert trt_common.trt_dtype_name(_FakeEnum("HALF")) == "HALF"
    assert trt_common.trt_dtype_name(_FakeEnum("BF16", with_name=False)) == "BF16"
    assert trt_common.torch_dtype(_FakeEnum("FLOAT"), "x", "m.plan") is torch.float32
    assert trt_common.torch_dtype(_FakeEnum("HALF"), "x", "m.plan") is torch.float16
    assert trt_common.torch_dtype(_FakeEnum("BF16"), "x", "m.plan") is torch.bfloat16
    with pytest.raises(export.ArtifactError, match=r"engine 'm.plan': tensor 'logits' has TensorRT type INT64"):
        trt_common.torch_dtype(_FakeEnum("INT64"), "logits", "m.plan")


def test_fp32_pins_cover_norm_softmax_and_float_reductions():
    assert trt_export.pins_fp32("NORMALIZATION", ["FLOAT"])
    assert trt_export.pins_fp32("SOFTMAX", ["FLOAT"])
    assert trt_export.pins_fp32("REDUCE", ["FLOAT"])  # a decomposed LayerNorm's ReduceMean, mean pooling
    assert not trt_export.pins_fp32("REDUCE", ["INT64"])  # a reduction over a shape tensor stays integer
    assert not trt_export.pins_fp32("MATRIX_MULTIPLY", ["FLOAT"])
    assert not trt_export.pins_fp32("ELEMENTWISE", ["FLOAT"])


def test_weak_typing_flags_and_their_absence_in_tensorrt_11():
    from types import SimpleNamespace

    trt10 = SimpleNamespace(FP16="fp16-flag", BF16="bf16-flag", OBEY_PRECISION_CONSTRAINTS="obey-flag")
    assert trt_export.weak_typing_flags(trt10, "fp16", "10.3.0") == ["fp16-flag", "obey-flag"]
    assert trt_export.weak_typing_flags(trt10, "bf16", "10.3.0") == ["bf16-flag", "obey-flag"]
    trt11 = SimpleNamespace(TF32="tf32-flag")
    with pytest.raises(
        export.ExportError,
        match=r"TensorRT 11.0.0 has no BuilderFlag.FP16/OBEY_PRECISION_CONSTRAINTS"
        r".*export a fp16 ONNX file \(to_onnx\(dtype='fp16'\)\).*tensorrt>=10,<11",
    ):
        trt_export.weak_typing_flags(trt11, "fp16", "11.0.0")


class _FakeConfig:
    """The timing-cache part of an IBuilderConfig: accepts caches whose bytes start with ``ok``."""

    def __init__(self) -> None:
        self.attached = None

    def create_timing_cache(self, data: bytes):
        if data.startswith(b"corrupt"):
            return None
        return {"data": bytes(data)}

    def set_timing_cache(self, cache, ignore_mismatch: bool) -> bool:
        assert ignore_mismatch is False
        if not (cache["data"] == b"" or cache["data"].startswith(b"ok")):
            return False
        self.attached = cache
        return True


@pytest.mark.parametrize(
    "content, data, note",
    [
        (None, b"", None),  # no file: an empty cache
        (b"ok cache", b"ok cache", None),
        (b"other gpu", b"", "does not fit this TensorRT/GPU: starting an empty one"),
        (b"corrupt", b"", "does not fit"),
    ],
)
def test_timing_cache_is_read_or_replaced(tmp_path, content, data, note):
    path = tmp_path / "t.cache"
    if content is not None:
        path.write_bytes(content)
    config = _FakeConfig()
    cache, got_note = trt_export._attach_timing_cache(config, path)
    assert cache is config.attached and cache["data"] == data
    assert (got_note is None) if note is None else (note in got_note and "t.cache" in got_note)


@pytest.mark.tensorrt
@needs_tensorrt
def test_engine_with_several_outputs_and_a_uint8_front(model, tmp_path):
    """An engine built from an ONNX file with a preprocessing front and three outputs: every output verified,
    the graph's I/O and the verification carried into the engine's metadata, the report published with it."""
    onnx_path = export.to_onnx(
        model,
        tmp_path / "u8.onnx",
        batch=(1, 8),
        exporter="torchscript",
        progress=False,
        outputs=("logits", "pooled", "last_hidden_state"),
        preprocess=dict(layout="NHWC", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)),
        dynamic_size=True,
    )
    plan = export.to_tensorrt(
        onnx_path,
        tmp_path / "u8.plan",
        batch=(1, 2, 8),
        precision="fp32",
        model=model,
        progress=False,
        verify=export.VerifyOptions(print_table=False, seed=0),
        report=tmp_path / "u8.plan.report.json",
    )
    meta = export.read_metadata(plan)
    assert meta["profiles"][0]["max"] == [8, 32, 32, 3] and meta["preprocess"]["layout"] == "NHWC"
    assert meta["outputs"] == ["logits", "pooled", "last_hidden_state"]
    assert meta["verification"]["passed"] and meta["verification"]["seed"] == 0
    assert json.loads((tmp_path / "u8.plan.report.json").read_text())["passed"]
    report = export.verify(model, plan, print_table=False)
    assert report.passed and {r.output for r in report.rows} == {"logits", "pooled", "last_hidden_state"}
