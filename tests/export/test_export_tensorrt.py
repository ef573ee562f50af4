"""TensorRT engine building and running: every check that runs without TensorRT (the arguments, the profile and
metadata logic, the polygraphy loader chain built with the right settings and run against a stand-in tensorrt
module), and real engine tests where tensorrt and a GPU are there."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch

pytest.importorskip("onnx", reason="the onnx extra is not installed")

import vit_fast  # noqa: E402
from vit_fast import export  # noqa: E402
from vit_fast.export import runners, trt_common  # noqa: E402
from vit_fast.export import tensorrt as trt_export  # noqa: E402

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
needs_polygraphy = pytest.mark.skipif(
    importlib.util.find_spec("polygraphy") is None, reason="polygraphy (in the tensorrt extra) is not installed"
)


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
    installed = (
        r"TensorRT is not installed here.*the tensorrt extra.*pip install -e '\.\[tensorrt\]' in a vit-fast checkout"
    )
    with pytest.raises(RuntimeError, match=installed):
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


class _FakeLayer:
    """A network layer: ``type`` and output dtypes as enum stand-ins; records what a postprocess sets."""

    def __init__(self, name: str, layer_type: str, out_types: list[str]) -> None:
        self.name, self.type, self.num_outputs = name, _FakeEnum(layer_type), len(out_types)
        self._outs = [types.SimpleNamespace(dtype=_FakeEnum(t)) for t in out_types]
        self.precision_is_set = False  # read by polygraphy's CreateConfig
        self.output_types: dict[int, object] = {}

    def get_output(self, j: int):
        return self._outs[j]

    def set_output_type(self, j: int, dtype: object) -> None:
        self.output_types[j] = dtype


def _vit_layers() -> list[_FakeLayer]:
    return [
        _FakeLayer("ln1", "NORMALIZATION", ["HALF"]),
        _FakeLayer("qkv", "MATRIX_MULTIPLY", ["HALF"]),
        _FakeLayer("softmax", "SOFTMAX", ["FLOAT"]),
        _FakeLayer("mean", "REDUCE", ["BF16"]),  # a decomposed LayerNorm's ReduceMean, mean pooling
        _FakeLayer("shape_sum", "REDUCE", ["INT64"]),  # a reduction over a shape tensor stays integer
        _FakeLayer("mixed", "REDUCE", ["FLOAT", "INT32"]),  # (values, indices): not all floating point
        _FakeLayer("gelu", "ACTIVATION", ["HALF"]),
        _FakeLayer("residual", "ELEMENTWISE", ["FLOAT"]),
        _FakeLayer("split", "SLICE", ["HALF", "HALF"]),
    ]


def test_fp32_pins_postprocess_flags_exactly_norm_softmax_and_float_reductions():
    layers, fp32 = _vit_layers(), object()
    pins = trt_export.Fp32Pins(fp32)
    pins(network=layers)  # how polygraphy's PostprocessNetwork calls it
    assert pins.pinned == ["ln1", "softmax", "mean"]
    for layer in layers:
        pinned = layer.name in pins.pinned
        assert (getattr(layer, "precision", None) is fp32) == pinned
        assert layer.output_types == ({0: fp32} if pinned else {})


def test_weak_typing_check_and_its_absence_in_tensorrt_11():
    trt10 = types.SimpleNamespace(FP16="fp16-flag", BF16="bf16-flag", OBEY_PRECISION_CONSTRAINTS="obey-flag")
    trt_export.check_weak_typing(trt10, "fp16", "10.3.0")
    trt_export.check_weak_typing(trt10, "bf16", "10.3.0")
    with pytest.raises(export.ExportError, match=r"TensorRT 10.3.0 has no BuilderFlag.BF16 "):
        trt_export.check_weak_typing(types.SimpleNamespace(FP16=1, OBEY_PRECISION_CONSTRAINTS=2), "bf16", "10.3.0")
    trt11 = types.SimpleNamespace(TF32="tf32-flag")
    with pytest.raises(
        export.ExportError,
        match=r"TensorRT 11.0.0 has no BuilderFlag.FP16/OBEY_PRECISION_CONSTRAINTS"
        r".*export a fp16 ONNX file \(to_onnx\(dtype='fp16'\)\).*tensorrt>=10,<11",
    ):
        trt_export.check_weak_typing(trt11, "fp16", "11.0.0")


def test_engine_profile_from_the_onnx_input():
    static = trt_export.engine_profile("images", [-1, 3, 32, 32], (1, 4, 16), None, Path("m.onnx"))
    assert static == {"input": "images", "min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [16, 3, 32, 32]}
    # a dynamic_size export: the native size from the metadata, on the layout's height/width axes
    meta = {"config": {"img_size": [48, 64]}, "preprocess": {"layout": "NHWC"}}
    nhwc = trt_export.engine_profile("pixels", [-1, -1, -1, 3], (2, 2, 8), meta, Path("m.onnx"))
    assert nhwc["min"] == [2, 48, 64, 3] and nhwc["max"] == [8, 48, 64, 3]
    nchw = trt_export.engine_profile("x", [-1, 3, -1, -1], (1, 1, 1), {"config": {"img_size": 32}}, Path("m.onnx"))
    assert nchw["opt"] == [1, 3, 32, 32]
    with pytest.raises(ValueError, match=r"'m.onnx' has a dynamic image size and no metadata naming the native size"):
        trt_export.engine_profile("x", [-1, 3, -1, -1], (1, 1, 1), None, Path("m.onnx"))


def test_checked_arguments_carry_the_profile(onnx_files, tmp_path):
    onnx_path, engine_path, batch, meta, dtype, profile = trt_export.check_tensorrt_args(
        onnx_files["fp32"], tmp_path / "m.plan", (1, 4, 16), "bf16", None
    )
    assert (batch, dtype, meta["batch"]) == ((1, 4, 16), "fp32", [1, 16])
    assert profile == {"input": "images", "min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [16, 3, 32, 32]}
    assert trt_export.check_tensorrt_args(onnx_files["fp16"], tmp_path / "m.plan", (1, 1, 1), "fp16", None)[4] == "fp16"


class _FakeConfig:
    """The timing-cache part of an IBuilderConfig: accepts caches whose bytes start with ``ok``, raises on ``bad``."""

    def __init__(self) -> None:
        self.attached = None

    def create_timing_cache(self, data: bytes):
        if data.startswith(b"corrupt"):
            return None
        if data.startswith(b"bad"):
            raise RuntimeError("not a timing cache")
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
        (None, None, None),  # no file: CreateConfig's empty cache stays
        (b"", None, None),
        (b"ok cache", b"ok cache", None),
        (b"other gpu", b"", "does not fit this TensorRT/GPU: starting an empty one"),
        (b"corrupt", b"", "does not fit"),
        (b"bad", b"", "does not fit"),
    ],
)
def test_timing_cache_is_reused_or_replaced(tmp_path, content, data, note):
    path = tmp_path / "t.cache"
    if content is not None:
        path.write_bytes(content)
    config, notes = _FakeConfig(), []
    trt_export.reuse_timing_cache(path, notes)(None, None, config)  # how PostprocessConfig calls it
    assert (config.attached is None) if data is None else (config.attached["data"] == data)
    assert notes == [] if note is None else (len(notes) == 1 and note in notes[0] and "t.cache" in notes[0])


def _fake_trt(version: str = "10.3.0") -> mock.MagicMock:
    """A stand-in ``tensorrt`` module, enough for polygraphy's loaders to run the whole chain: the parser accepts,
    the network holds :func:`_vit_layers` and one dynamic-batch input, the build returns a plan, and the config's
    timing cache serializes to ``b"new cache"``."""
    trt = mock.MagicMock(name="tensorrt")
    trt.__version__ = version
    trt.ILogger = type("ILogger", (), {"__init__": lambda self: None})  # polygraphy subclasses it
    for enum in ("BuilderFlag", "NetworkDefinitionCreationFlag", "MemoryPoolType", "TacticSource", "PreviewFeature"):
        getattr(trt, enum).__members__ = {}  # polygraphy's config printout lists the members
    trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH, trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED = 0, 2
    trt.OnnxParser.return_value.num_errors = 0
    trt.OnnxParser.return_value.parse_from_file.return_value = True
    network = trt.Builder.return_value.create_network.return_value
    network.layers = _vit_layers()
    network.__iter__.side_effect = lambda: iter(network.layers)
    network.num_inputs = 1
    network.get_input.return_value = types.SimpleNamespace(
        name="images", shape=(-1, 3, 32, 32), is_shape_tensor=False, dtype="FLOAT"
    )
    config = trt.Builder.return_value.create_builder_config.return_value
    config.int8_calibrator, config.DLA_core, config.num_optimization_profiles = None, -1, 1
    config.get_timing_cache.return_value.serialize.return_value.__enter__.return_value = b"new cache"
    return trt


@pytest.fixture
def fake_tensorrt(monkeypatch):
    """:func:`_fake_trt` as ``tensorrt`` for polygraphy; afterwards polygraphy's lazy ``trt`` handles forget it."""
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("the real tensorrt is importable here: the tests marked tensorrt build real engines")
    pytest.importorskip("polygraphy", reason="polygraphy (in the tensorrt extra) is not installed")
    from polygraphy.backend.trt import util as pg_util

    trt = _fake_trt()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(pg_util, "TRT_LOGGER", None)
    yield trt
    for name, module in list(sys.modules.items()):
        lazy = getattr(module, "trt", None) if name.startswith("polygraphy") else None
        if type(lazy).__name__ == "LazyModule":
            object.__setattr__(lazy, "module", None)  # LazyModule keeps the module it imported under this name


@needs_polygraphy
@pytest.mark.parametrize(
    "precision, strongly_typed, fp16, bf16, tf32, constraints",
    [
        ("fp16", False, True, False, True, "obey"),
        ("bf16", False, False, True, True, "obey"),
        ("fp32", False, False, False, False, None),  # TF32 off
        ("fp16", True, False, False, True, None),  # an fp16 ONNX file: its own types rule
    ],
)
def test_polygraphy_loaders_are_built_with_the_right_settings(
    tmp_path, precision, strongly_typed, fp16, bf16, tf32, constraints
):
    trt = types.SimpleNamespace(
        __version__="10.3.0",
        BuilderFlag=types.SimpleNamespace(FP16=1, BF16=2, OBEY_PRECISION_CONSTRAINTS=3),
        float32="float32",
        ProfilingVerbosity=types.SimpleNamespace(DETAILED="detailed"),
        MemoryPoolType=types.SimpleNamespace(WORKSPACE="workspace"),
    )
    profile = {"input": "images", "min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [16, 3, 32, 32]}
    network, config, pins, engine, notes = trt_export.engine_loaders(
        trt, tmp_path / "m.onnx", profile, precision, strongly_typed, tmp_path / "t.cache", tmp_path / "new", 1.5
    )
    assert network.path == str(tmp_path / "m.onnx") and network.strongly_typed is strongly_typed
    assert (config.fp16, config.bf16, config.tf32, config.int8, config.fp8) == (fp16, bf16, tf32, False, False)
    assert config.precision_constraints == constraints and (pins is not None) == (constraints == "obey")
    assert pins is None or pins.float32 == "float32"
    [shapes] = config.profiles
    assert list(shapes) == ["images"] and tuple(shapes["images"]) == ((1, 3, 32, 32), (4, 3, 32, 32), (16, 3, 32, 32))
    assert config.profiling_verbosity == "detailed" and config.memory_pool_limits == {"workspace": 3 << 29}
    assert config.timing_cache_path is None  # read by reuse_timing_cache instead (see its docstring)
    assert engine.timing_cache_path == str(tmp_path / "new") and notes == []


@needs_polygraphy
def test_polygraphy_loaders_refuse_a_weak_build_on_tensorrt_11(tmp_path):
    trt = types.SimpleNamespace(__version__="11.0.0", BuilderFlag=types.SimpleNamespace(TF32=1))
    profile = {"input": "x", "min": [1, 3, 8, 8], "opt": [1, 3, 8, 8], "max": [1, 3, 8, 8]}
    with pytest.raises(export.ExportError, match=r"TensorRT 11.0.0 has no BuilderFlag.BF16"):
        trt_export.engine_loaders(trt, tmp_path / "m.onnx", profile, "bf16", False, tmp_path / "t", tmp_path / "n")


@pytest.mark.parametrize("strongly_typed", [False, True])
def test_polygraphy_chain_runs_against_a_stand_in_tensorrt(fake_tensorrt, tmp_path, strongly_typed):
    """The chain as polygraphy runs it, on :func:`_fake_trt`: the ONNX file parsed from its path, the fp32 pins
    applied to the parsed network (weakly typed only), the flags, the profile, the old timing cache attached and
    the new one saved where asked."""
    trt = fake_tensorrt
    (tmp_path / "t.cache").write_bytes(b"old cache")
    profile = {"input": "images", "min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [16, 3, 32, 32]}
    with trt_common.polygraphy_logging(export.ExportError, "build failed"):
        _, _, pins, engine, notes = trt_export.engine_loaders(
            trt, tmp_path / "m.onnx", profile, "fp16", strongly_typed, tmp_path / "t.cache", tmp_path / "new.cache"
        )
        plan = engine()
    builder = trt.Builder.return_value
    assert plan is builder.build_serialized_network.return_value
    trt.OnnxParser.return_value.parse_from_file.assert_called_once_with(str(tmp_path / "m.onnx"))
    network = builder.create_network.return_value
    [created] = builder.create_network.call_args_list  # older polygraphy also sets EXPLICIT_BATCH (ignored)
    assert created.kwargs["flags"] & (1 << 2) == (4 if strongly_typed else 0)  # 1 << STRONGLY_TYPED
    config = builder.create_builder_config.return_value
    flags = [c.args[0] for c in config.set_flag.call_args_list]
    weak_flags = [trt.BuilderFlag.FP16, trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS]
    assert all((f in flags) != strongly_typed for f in weak_flags) and trt.BuilderFlag.TF32 in flags
    pinned = [layer.name for layer in network.layers if layer.output_types]
    assert pinned == ([] if strongly_typed else ["ln1", "softmax", "mean"]) and (pins is None) == strongly_typed
    builder.create_optimization_profile.return_value.set_shape.assert_called_once_with(
        "images", (1, 3, 32, 32), (4, 3, 32, 32), (16, 3, 32, 32)
    )
    config.create_timing_cache.assert_any_call(b"old cache")
    attached = [c.args[0] for c in config.set_timing_cache.call_args_list]
    assert attached[-1] is config.create_timing_cache.return_value and notes == []
    assert (tmp_path / "new.cache").read_bytes() == b"new cache"


def _fake_engine(trt: mock.MagicMock) -> mock.MagicMock:
    """What the stand-in runtime deserializes: images [B, 3, 32, 32] fp32 in (profile 1/4/16), fp32 logits out."""
    engine = trt.Runtime.return_value.deserialize_cuda_engine.return_value
    io = {"images": trt.TensorIOMode.INPUT, "logits": trt.TensorIOMode.OUTPUT}
    engine.num_io_tensors = len(io)
    engine.get_tensor_name.side_effect = list(io).__getitem__
    engine.get_tensor_mode.side_effect = io.__getitem__
    engine.get_tensor_dtype.return_value = _FakeEnum("FLOAT")
    engine.get_tensor_profile_shape.return_value = [(1, 3, 32, 32), (4, 3, 32, 32), (16, 3, 32, 32)]
    return engine


class _FakeTrtRunner:
    """polygraphy's TrtRunner as EngineRunner.run_all uses it; records activations and feeds."""

    made: list[_FakeTrtRunner] = []

    def __init__(self, engine) -> None:
        self.engine, self.active, self.activations, self.feeds = engine, False, 0, []
        self.out = torch.arange(10.0).reshape(2, 5)
        _FakeTrtRunner.made.append(self)

    def activate(self) -> None:
        self.active, self.activations = True, self.activations + 1

    def deactivate(self) -> None:
        self.active = False

    def infer(self, feed):
        assert self.active
        self.feeds.append(feed)
        return {"logits": self.out, "debug_tensor": torch.zeros(1)}


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))


def test_engine_runner_on_polygraphy(fake_tensorrt, fake_gpu, monkeypatch, tmp_path):
    """EngineRunner's own parts around polygraphy: the metadata checks, the engine loaded through EngineFromBytes,
    its I/O, precision and profile, and run_all through one TrtRunner activated once and deactivated by close()."""
    from polygraphy.backend import trt as pg

    monkeypatch.setattr(pg, "TrtRunner", _FakeTrtRunner)
    _FakeTrtRunner.made.clear()
    engine = _fake_engine(fake_tensorrt)
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"plan")
    meta = {"tensorrt_version": "10.3.0", "gpu_sm": "sm_90", "precision": "fp16", "onnx": "m.onnx"}
    Path(str(plan) + ".json").write_text(json.dumps({**meta, "gpu_sm": "sm_80", "gpu_name": "A100"}))
    with pytest.raises(export.ArtifactError, match=r"built for GPU sm_80 \(A100\), this GPU is sm_90.*rebuild it here"):
        runners.EngineRunner(plan)
    Path(str(plan) + ".json").write_text(json.dumps(meta))
    runner = runners.EngineRunner(plan)
    assert (runner.input_name, runner.output_names, runner.input_dtype) == ("images", ["logits"], torch.float32)
    assert runner.dtype == torch.float16  # an fp16 engine with fp32 I/O is judged as fp16
    assert (runner.profile, runner.batch_range, tuple(runner.image_shape)) == ((1, 4, 16), (1, 16), (3, 32, 32))
    assert runner.runtime == "tensorrt 10.3.0 Fake GPU"
    x = torch.rand(2, 3, 32, 32, dtype=torch.float64)
    first, second = runner.run_all(x), runner.run(x[:1])
    [trt_runner] = _FakeTrtRunner.made
    assert trt_runner.engine is engine and trt_runner.activations == 1 and len(trt_runner.feeds) == 2
    fed = trt_runner.feeds[0]["images"]
    assert fed.device.type == "cpu" and fed.dtype == torch.float32 and torch.equal(fed, x.float())
    assert list(first) == ["logits"] and torch.equal(second, trt_runner.out)
    trt_runner.out.add_(1)  # the runner reuses its buffers: what run_all returned must be a copy
    assert torch.equal(first["logits"], torch.arange(10.0).reshape(2, 5))
    with pytest.raises(export.ArtifactError, match=r"batch 17 is outside engine"):
        runner.run_all(torch.rand(17, 3, 32, 32))
    runner.close()
    assert not trt_runner.active and runner.engine is None


def test_engine_runner_unloadable_engine_says_rebuild(fake_tensorrt, fake_gpu, tmp_path):
    fake_tensorrt.Runtime.return_value.deserialize_cuda_engine.return_value = None  # how TensorRT refuses a plan
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"not a plan")
    with pytest.raises(
        export.ArtifactError,
        match=r"TensorRT cannot load engine '.*m.plan' \(corrupt, or built with another TensorRT version or GPU\): "
        r"rebuild it with vit-fast export tensorrt: Could not deserialize engine",
    ):
        runners.EngineRunner(plan)


def test_to_tensorrt_on_a_stand_in_tensorrt(fake_tensorrt, fake_gpu, onnx_files, tmp_path):
    """to_tensorrt's own parts around the polygraphy build: the staged engine and its metadata published, the
    timing cache written over the old one (no lock file left), and nothing but the old cache after a failed build."""
    trt = fake_tensorrt
    cache = tmp_path / "t.cache"
    cache.write_bytes(b"old cache")
    build = trt.Builder.return_value.build_serialized_network
    build.return_value = None  # how TensorRT reports a failed build
    kwargs = dict(batch=(1, 4, 16), timing_cache=cache, verify=False, progress=False)
    with pytest.raises(export.ExportError, match=r"TensorRT could not build an engine from '.*m-fp32.onnx': Invalid"):
        export.to_tensorrt(onnx_files["fp32"], tmp_path / "m.plan", **kwargs)
    assert os.listdir(tmp_path) == ["t.cache"] and cache.read_bytes() == b"old cache"
    build.return_value = b"plan bytes"
    inspector = trt.Runtime.return_value.deserialize_cuda_engine.return_value.create_engine_inspector.return_value
    inspector.get_engine_information.return_value = json.dumps({"Layers": [{"Name": "fmha_v2"}, {"Name": "gemm"}]})
    plan = export.to_tensorrt(onnx_files["fp32"], tmp_path / "m.plan", precision="fp16", **kwargs)
    assert plan.read_bytes() == b"plan bytes" and cache.read_bytes() == b"new cache"
    assert sorted(os.listdir(tmp_path)) == ["m.plan", "m.plan.json", "t.cache"]
    meta = export.read_metadata(plan)
    assert meta["profiles"] == [
        {"input": "images", "min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [16, 3, 32, 32]}
    ]
    assert (meta["precision"], meta["strongly_typed"], meta["fp32_pinned_layers"], meta["tf32"]) == (
        "fp16",
        False,
        3,
        True,
    )
    assert (meta["num_layers"], meta["attention_fused"], meta["batch"]) == (2, True, [1, 16])
    assert (meta["tensorrt_version"], meta["gpu_sm"], meta["gpu_name"]) == ("10.3.0", "sm_90", "Fake GPU")
    assert meta["verification"] is None and meta["timing_cache"] == str(cache) and meta["config"]["img_size"] == 32


@needs_polygraphy
def test_polygraphy_errors_become_ours():
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    colors = G_LOGGER.colors
    with pytest.raises(export.ExportError, match=r"^TensorRT could not build m.onnx: Could not parse ONNX correctly$"):
        with trt_common.polygraphy_logging(export.ExportError, "TensorRT could not build m.onnx"):
            assert G_LOGGER.colors is False
            raise PolygraphyException("Could not parse ONNX correctly")
    assert G_LOGGER.colors == colors
    with pytest.raises(KeyError):  # other errors pass through unchanged
        with trt_common.polygraphy_logging(export.ExportError, "x"):
            raise KeyError("k")


def test_missing_polygraphy_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "polygraphy", None)  # import polygraphy now raises ImportError
    monkeypatch.delitem(sys.modules, "polygraphy.backend", raising=False)
    installed = r"polygraphy is not installed here.*pip install -e '\.\[tensorrt\]' in a vit-fast checkout"
    with pytest.raises(RuntimeError, match=installed):
        trt_common.require_polygraphy()


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
