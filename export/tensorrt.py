"""TensorRT engines from our ONNX files, written against TensorRT 10's Python API.

Building: an fp32 ONNX file is parsed into a weakly typed network and built with the FP16 or
BF16 builder flag, with every normalization and softmax layer pinned to fp32
(``OBEY_PRECISION_CONSTRAINTS``), since their reductions overflow in fp16. An fp16/bf16 ONNX
file is built STRONGLY_TYPED (the graph's own types rule; ``precision`` must match). One
optimization profile from ``batch=(min, opt, max)``; a timing cache file is read before and
written after each build so later builds reuse the measured tactics. The engine inspector's
layer list tells whether attention became one fused layer. The engine is verified against eager
PyTorch before it is moved to ``engine_path``; one that fails is not left there.

Loading: the metadata beside an engine records the TensorRT version and GPU compute capability
it was built for and its batch profile; a mismatch raises an error saying what to rebuild.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from vit_fast._atomic import write_atomic

from ._common import (
    ArtifactError,
    ExportError,
    Stages,
    check_batch_range,
    check_output_path,
    check_readable_file,
    commit,
    git_commit,
    metadata_path,
    read_metadata,
    staging_dir,
    vit_fast_version,
)

PRECISIONS = ("fp16", "bf16", "fp32")
_ONNX_DTYPES = {1: "fp32", 10: "fp16", 16: "bf16"}
_FUSED_ATTENTION_MARKS = ("mha", "attention", "fmha", "flash")


def require_tensorrt() -> Any:
    """``import tensorrt``, or a RuntimeError that says it is missing and what it needs."""
    try:
        import tensorrt as trt
    except ImportError as err:
        raise RuntimeError(
            "TensorRT is not installed here (import tensorrt failed: "
            f"{err}); it needs an NVIDIA GPU and `pip install tensorrt` (TensorRT 10) from NVIDIA's index"
        ) from err
    if int(trt.__version__.split(".")[0]) < 10:
        raise RuntimeError(f"vit-fast needs TensorRT >= 10, found {trt.__version__}")
    return trt


def gpu_sm() -> str:
    """The current GPU's compute capability as ``"sm_90"``; ``"none"`` without a GPU."""
    if not torch.cuda.is_available():
        return "none"
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def check_tensorrt_args(
    onnx_path: Any, engine_path: Any, batch: Any, precision: Any, timing_cache: Any
) -> tuple[Path, Path, tuple[int, int, int], dict[str, Any] | None, str]:
    """Every check :func:`to_tensorrt` makes before TensorRT is touched; returns the cleaned arguments
    (onnx path, engine path, batch triple, ONNX metadata or None, ONNX dtype name)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    batch = check_batch_range(batch, ("min", "opt", "max"))
    onnx_path = check_readable_file(onnx_path, "ONNX file")
    engine_path = check_output_path(engine_path)
    if timing_cache is not None:
        cache = Path(timing_cache)
        if cache.exists() and not cache.is_file():
            raise ValueError(f"timing cache {str(cache)!r} is not a file")
        if not cache.parent.is_dir():
            raise ValueError(f"timing cache folder {str(cache.parent)!r} does not exist")
    import onnx

    try:
        proto = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as err:
        raise ArtifactError(f"cannot read {str(onnx_path)!r} as an ONNX model: {type(err).__name__}: {err}") from err
    if not proto.graph.input:
        raise ArtifactError(f"{str(onnx_path)!r} is not an ONNX model (its graph has no inputs)")
    onnx_dtype = _ONNX_DTYPES.get(proto.graph.input[0].type.tensor_type.elem_type, "unknown")
    if onnx_dtype in ("fp16", "bf16") and precision != onnx_dtype:
        raise ValueError(
            f"{str(onnx_path)!r} is a {onnx_dtype} model, built strongly typed: precision must be {onnx_dtype!r}, "
            f"got {precision!r} (export an fp32 ONNX file to choose the engine precision freely)"
        )
    meta = read_metadata(onnx_path)
    if meta and meta.get("batch"):
        lo, hi = meta["batch"]
        if batch[0] < lo or batch[2] > hi:
            raise ValueError(
                f"engine batch profile {batch} lies outside the ONNX file's exported batch range [{lo}, {hi}]: "
                f"pick min >= {lo} and max <= {hi}, or re-export with batch=({min(lo, batch[0])}, {max(hi, batch[2])})"
            )
    return onnx_path, engine_path, batch, meta, onnx_dtype


def default_timing_cache(engine_path: Path, trt_version: str, sm: str) -> Path:
    """One cache per TensorRT version and GPU, shared by every build in the engine's folder."""
    return engine_path.parent / f"vit-fast-trt{trt_version}-{sm}.timing-cache"


def check_engine_compat(meta: dict[str, Any], engine_path: str | os.PathLike, trt_version: str, sm: str) -> None:
    """Raise an ArtifactError saying what to rebuild when ``meta`` is for another TensorRT or GPU."""
    built_trt, built_sm = meta.get("tensorrt_version"), meta.get("gpu_sm")
    onnx_src = meta.get("onnx", "the ONNX file")
    rebuild = f"rebuild it here: vit-fast export tensorrt {onnx_src} --out {engine_path}"
    if built_trt and built_trt != trt_version:
        raise ArtifactError(
            f"engine {str(engine_path)!r} was built with TensorRT {built_trt}, this machine has TensorRT "
            f"{trt_version}; engines do not load across versions: {rebuild}"
        )
    if built_sm and built_sm != sm:
        raise ArtifactError(
            f"engine {str(engine_path)!r} was built for GPU {built_sm} ({meta.get('gpu_name', '?')}), this GPU is "
            f"{sm}; engines are specific to the compute capability: {rebuild}"
        )


def check_batch_in_profile(batch: int, profile: tuple[int, int, int], engine_path: str | os.PathLike) -> None:
    """Raise an ArtifactError when ``batch`` lies outside the engine's optimization profile."""
    lo, opt, hi = profile
    if not lo <= batch <= hi:
        raise ArtifactError(
            f"batch {batch} is outside engine {str(engine_path)!r}'s profile (min {lo}, opt {opt}, max {hi}): "
            f"rebuild with --batch {min(lo, batch)} {opt} {max(hi, batch)} (to_tensorrt(batch=...)) to cover it"
        )


def attention_fused(layers: list[Any]) -> bool:
    """Whether an engine's layer list (inspector JSON ``Layers``) holds a fused attention layer."""
    for layer in layers:
        text = json.dumps(layer).lower() if not isinstance(layer, str) else layer.lower()
        if any(mark in text for mark in _FUSED_ATTENTION_MARKS):
            return True
    return False


class TensorRTRunner:
    """A serialized engine, checked against its metadata and run on the GPU with torch tensors."""

    _DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16}

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        meta = read_metadata(self.path) or {}
        trt = require_tensorrt()
        if not torch.cuda.is_available():
            raise RuntimeError(f"running TensorRT engine {str(self.path)!r} needs a CUDA GPU; none is visible")
        check_engine_compat(meta, self.path, trt.__version__, gpu_sm())
        self.trt = trt
        logger = trt.Logger(trt.Logger.WARNING)
        self.runtime_obj = trt.Runtime(logger)
        try:
            self.engine = self.runtime_obj.deserialize_cuda_engine(self.path.read_bytes())
        except Exception as err:
            raise ArtifactError(f"TensorRT cannot load engine {str(self.path)!r}: {err}") from err
        if self.engine is None:
            raise ArtifactError(
                f"TensorRT cannot load engine {str(self.path)!r} (corrupt, or built with another TensorRT version "
                f"or GPU): rebuild it with vit-fast export tensorrt"
            )
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        self.input_name, self.output_name = inputs[0], outputs[0]
        self.dtype = self._DTYPES[self.engine.get_tensor_dtype(self.input_name).name]
        lo, opt, hi = (tuple(s) for s in self.engine.get_tensor_profile_shape(self.input_name, 0))
        self.profile = (lo[0], opt[0], hi[0])
        self.batch_range = (lo[0], hi[0])
        self.fixed_batch = None
        self.context = self.engine.create_execution_context()
        self.runtime = f"tensorrt {trt.__version__} {torch.cuda.get_device_name()}"

    def check_batch(self, batch: int) -> None:
        check_batch_in_profile(batch, self.profile, self.path)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        self.check_batch(x.shape[0])
        x = x.to(device="cuda", dtype=self.dtype).contiguous()
        self.context.set_input_shape(self.input_name, tuple(x.shape))
        shape = tuple(self.context.get_tensor_shape(self.output_name))
        out_dtype = self._DTYPES[self.engine.get_tensor_dtype(self.output_name).name]
        out = torch.full(shape, float("nan"), dtype=out_dtype, device="cuda")
        self.context.set_tensor_address(self.input_name, x.data_ptr())
        self.context.set_tensor_address(self.output_name, out.data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"TensorRT execution of {str(self.path)!r} failed")
        stream.synchronize()
        return out.cpu()


def to_tensorrt(
    onnx_path: str | os.PathLike,
    engine_path: str | os.PathLike,
    batch: tuple[int, int, int] = (1, 8, 64),
    precision: str = "fp16",
    timing_cache: str | os.PathLike | None = None,
    workspace_gib: float | None = None,
    model: Any = None,
    verify: bool = True,
    progress: bool = True,
) -> Path:
    """Build a TensorRT engine from an ONNX file exported by :func:`vit_fast.export.to_onnx`.

    - ``batch=(min, opt, max)``: the optimization profile (images ``[B, C, H, W]`` at the
      model's native size); must lie inside the ONNX file's exported batch range.
    - ``precision``: ``"fp16"`` / ``"bf16"`` (normalization and softmax kept in fp32) or ``"fp32"``.
    - ``timing_cache``: a file read before and written after the build (default: one per
      TensorRT version and GPU in the engine's folder).
    - ``model``: the :class:`vit_fast.VisionTransformer` (or its name) to verify against;
      default the ``source`` recorded in the ONNX metadata.

    Writes ``engine_path`` and ``engine_path + ".json"`` (TensorRT version, GPU SM, precision,
    profile, whether attention was fused) only when the engine passed verification.
    """
    onnx_path, engine_path, batch, onnx_meta, onnx_dtype = check_tensorrt_args(
        onnx_path, engine_path, batch, precision, timing_cache
    )
    if verify and model is None and not (onnx_meta and onnx_meta.get("source")):
        raise ValueError(
            f"cannot verify the engine: pass model= (the model {str(onnx_path)!r} was exported from) "
            "or verify=False; the ONNX metadata names no source model"
        )
    trt = require_tensorrt()
    if not torch.cuda.is_available():
        raise RuntimeError("building a TensorRT engine needs a CUDA GPU; none is visible")
    stages = Stages("vit-fast export", progress)
    sm = gpu_sm()
    cache_path = Path(timing_cache) if timing_cache else default_timing_cache(engine_path, trt.__version__, sm)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    strongly_typed = onnx_dtype in ("fp16", "bf16")
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    with stages.step(f"parsing {onnx_path}"):
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise ExportError(f"TensorRT's ONNX parser rejected {str(onnx_path)!r}: {errors}")
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if workspace_gib:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    pinned = 0
    if not strongly_typed and precision != "fp32":
        config.set_flag(trt.BuilderFlag.FP16 if precision == "fp16" else trt.BuilderFlag.BF16)
        config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            if layer.type in (trt.LayerType.NORMALIZATION, trt.LayerType.SOFTMAX):
                layer.precision = trt.float32
                for j in range(layer.num_outputs):
                    layer.set_output_type(j, trt.float32)
                pinned += 1
    inp = network.get_input(0)
    chw = tuple(inp.shape)[1:]
    if any(d < 0 for d in chw):  # dynamic H/W: build for the native size
        cfg = (onnx_meta or {}).get("config") or {}
        if "img_size" not in cfg:
            raise ValueError(f"{str(onnx_path)!r} has a dynamic image size and no metadata naming the native size")
        img = cfg["img_size"]
        h, w = (img, img) if isinstance(img, int) else img
        chw = (chw[0], h, w)
    profile = builder.create_optimization_profile()
    profile.set_shape(inp.name, (batch[0], *chw), (batch[1], *chw), (batch[2], *chw))
    config.add_optimization_profile(profile)
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    with stages.step(f"building a {precision} engine for batch {batch} on {torch.cuda.get_device_name()} ({sm})"):
        serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT could not build an engine from {str(onnx_path)!r} (see its log above)")
    write_atomic(cache_path, bytes(config.get_timing_cache().serialize()))

    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(serialized)
    inspector = engine.create_engine_inspector()
    try:
        layers = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON)).get("Layers", [])
    except (ValueError, AttributeError):
        layers = []
    meta = {
        "format": "tensorrt",
        "onnx": str(onnx_path),
        "config": (onnx_meta or {}).get("config"),
        "source": (onnx_meta or {}).get("source"),
        "tensorrt_version": trt.__version__,
        "gpu_sm": sm,
        "gpu_name": torch.cuda.get_device_name(),
        "precision": precision,
        "strongly_typed": strongly_typed,
        "fp32_pinned_layers": pinned,
        "profiles": [{"input": inp.name, "min": [batch[0], *chw], "opt": [batch[1], *chw], "max": [batch[2], *chw]}],
        "batch": [batch[0], batch[2]],
        "num_layers": len(layers),
        "attention_fused": attention_fused(layers),
        "timing_cache": str(cache_path),
        "vit_fast_version": vit_fast_version(),
        "git_commit": git_commit(),
    }
    stages.note(f"{len(layers)} engine layers; attention fused: {meta['attention_fused']}")
    with staging_dir(engine_path) as tmp:
        staged = tmp / engine_path.name
        staged.write_bytes(bytes(serialized))
        metadata_path(staged).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if verify:
            from .verify import verify as verify_artifact

            with stages.step("verifying the engine against eager PyTorch"):
                report = verify_artifact(model if model is not None else meta["source"], staged)
            meta["verification"] = {"passed": report.passed, "worst_ratio": report.worst().ratio}
            metadata_path(staged).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        commit([staged, metadata_path(staged)], engine_path.parent)
    return engine_path


__all__ = [
    "PRECISIONS",
    "TensorRTRunner",
    "attention_fused",
    "check_batch_in_profile",
    "check_engine_compat",
    "check_tensorrt_args",
    "gpu_sm",
    "require_tensorrt",
    "to_tensorrt",
]
