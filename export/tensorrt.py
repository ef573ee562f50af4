"""TensorRT engines from our ONNX files, written against TensorRT 10's Python API.

Building: an fp32 ONNX file is parsed into a weakly typed network and built with the FP16 or
BF16 builder flag, with every normalization, softmax and floating-point reduction layer pinned
to fp32 (``OBEY_PRECISION_CONSTRAINTS``), since their reductions overflow in fp16; ``"fp32"``
clears the TF32 flag TensorRT sets by default. An fp16/bf16 ONNX file is built STRONGLY_TYPED
(the graph's own types rule; ``precision`` must match). TensorRT 11 has no weakly typed builds:
there an fp32 ONNX file builds only as an fp32 engine. One
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

from vit_fast.files import write_atomic

from ._common import (
    ArtifactError,
    ExportError,
    Stages,
    check_batch_range,
    check_output_path,
    check_readable_file,
    git_commit,
    metadata_path,
    publish,
    read_metadata,
    staging_dir,
    vit_fast_version,
)

PRECISIONS = ("fp16", "bf16", "fp32")
_ONNX_DTYPES = {1: "fp32", 10: "fp16", 16: "bf16"}
_FUSED_ATTENTION_MARKS = ("mha", "attention", "fmha", "flash")
#: layer types kept in fp32 in a weakly typed fp16/bf16 build. TensorRT 10's ONNX parser imports
#: ``LayerNormalization`` (opset >= 17) as one INormalizationLayer (LayerType.NORMALIZATION) and
#: ``Softmax`` as ISoftMaxLayer (LayerType.SOFTMAX); a LayerNorm decomposed by an older opset, and
#: mean pooling, are ReduceMean -> LayerType.REDUCE.
FP32_PINNED_LAYER_TYPES = ("NORMALIZATION", "SOFTMAX", "REDUCE")
_FLOAT_TYPE_NAMES = ("FLOAT", "HALF", "BF16")
#: torch dtypes of the engine I/O tensor types we run (``trt.DataType`` member names)
TORCH_DTYPES: dict[str, torch.dtype] = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16}


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


def trt_dtype_name(dtype: Any) -> str:
    """The member name of a ``trt.DataType`` (``"FLOAT"``, ``"HALF"``, ``"BF16"``, ...).

    pybind11 enums have ``.name``; ``str()`` of one is ``"DataType.HALF"``, used as a fallback.
    """
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rsplit(".", 1)[-1]


def torch_dtype(dtype: Any, tensor: str, engine_path: str | os.PathLike) -> torch.dtype:
    """The torch dtype for an engine I/O tensor's ``trt.DataType``; an ArtifactError for others."""
    name = trt_dtype_name(dtype)
    if name not in TORCH_DTYPES:
        raise ArtifactError(
            f"engine {str(engine_path)!r}: tensor {tensor!r} has TensorRT type {name}; vit-fast runs engines whose "
            f"inputs and outputs are {', '.join(TORCH_DTYPES)}"
        )
    return TORCH_DTYPES[name]


def pins_fp32(layer_type: str, output_types: list[str]) -> bool:
    """Whether a layer (``trt.LayerType`` name, its outputs' ``trt.DataType`` names) is pinned to fp32 in a
    weakly typed fp16/bf16 build: normalization, softmax and reductions, and only when every output is a
    floating-point tensor (a reduction over a shape tensor stays integer)."""
    return layer_type in FP32_PINNED_LAYER_TYPES and all(t in _FLOAT_TYPE_NAMES for t in output_types)


def weak_typing_flags(builder_flag: Any, precision: str, trt_version: str) -> list[Any]:
    """The ``trt.BuilderFlag`` members for a weakly typed ``precision`` build (FP16 or BF16, plus
    OBEY_PRECISION_CONSTRAINTS so the fp32 pins hold), or an ExportError when this TensorRT has none:
    TensorRT 11 removed every weak-typing flag (networks are always strongly typed there)."""
    names = ("FP16" if precision == "fp16" else "BF16", "OBEY_PRECISION_CONSTRAINTS")
    missing = [n for n in names if not hasattr(builder_flag, n)]
    if missing:
        raise ExportError(
            f"TensorRT {trt_version} has no BuilderFlag.{'/'.join(missing)} (TensorRT 11 removed weakly typed "
            f"builds), so an fp32 ONNX file cannot be built as a {precision} engine here: export a {precision} ONNX "
            f"file (to_onnx(dtype={precision!r})), which is built strongly typed, or install tensorrt>=10,<11"
        )
    return [getattr(builder_flag, n) for n in names]


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

    _DTYPES = TORCH_DTYPES

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
        # Runtime.deserialize_cuda_engine returns None (and logs the reason) for a corrupt plan or one built by
        # another TensorRT version / for another GPU; "require a non-null engine" is NVIDIA's advice.
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
        outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if len(inputs) != 1 or not outputs:
            raise ArtifactError(
                f"engine {str(self.path)!r} has inputs {inputs} and outputs {outputs}; vit-fast engines have one "
                "image input and at least one output"
            )
        self.input_name, self.output_name = inputs[0], outputs[0]
        self.output_names = outputs
        self.input_dtype = torch_dtype(self.engine.get_tensor_dtype(self.input_name), self.input_name, self.path)
        # the precision the engine computes in, which verify() runs eager in and judges by: an fp16 engine
        # built from an fp32 ONNX file keeps fp32 I/O but must be compared with eager fp16, not fp32
        precision = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(str(meta.get("precision")))
        self.dtype = precision or self.input_dtype
        self.output_dtypes = {n: torch_dtype(self.engine.get_tensor_dtype(n), n, self.path) for n in outputs}
        # get_tensor_profile_shape(name, profile_index) -> [min, opt, max] (TensorRT 10 Python API)
        lo, opt, hi = (tuple(s) for s in self.engine.get_tensor_profile_shape(self.input_name, 0))
        self.profile = (lo[0], opt[0], hi[0])
        self.image_shape = opt[1:]
        self.batch_range = (lo[0], hi[0])
        self.fixed_batch = None
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise ArtifactError(f"TensorRT could not create an execution context for {str(self.path)!r}")
        # enqueueV3 on the legacy default stream makes TensorRT add cudaStreamSynchronize calls (it warns
        # "Using default stream in enqueueV3() may lead to performance issues"): run on a stream of our own.
        self.stream = torch.cuda.Stream()
        self.runtime = f"tensorrt {trt.__version__} {torch.cuda.get_device_name()}"

    def check_batch(self, batch: int) -> None:
        check_batch_in_profile(batch, self.profile, self.path)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        self.check_batch(x.shape[0])
        x = x.to(device="cuda", dtype=self.input_dtype).contiguous()
        # set_input_shape / set_tensor_address / execute_async_v3 return False (with a logged error) on failure
        if not self.context.set_input_shape(self.input_name, tuple(x.shape)):
            raise ArtifactError(
                f"engine {str(self.path)!r} rejects input shape {tuple(x.shape)}: it was built for images "
                f"{self.image_shape} and batch min/opt/max {self.profile}"
            )
        outs = {}
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            outs[name] = torch.full(shape, float("nan"), dtype=self.output_dtypes[name], device="cuda")
        for name, t in [(self.input_name, x), *outs.items()]:
            if not self.context.set_tensor_address(name, t.data_ptr()):
                raise RuntimeError(f"TensorRT rejected the buffer for tensor {name!r} of {str(self.path)!r}")
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)  # x and the outputs were written on the current stream
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError(f"TensorRT execution of {str(self.path)!r} failed")
        self.stream.synchronize()
        return outs[self.output_name].cpu()


def _attach_timing_cache(config: Any, cache_path: Path) -> tuple[Any, str | None]:
    """Attach the timing cache read from ``cache_path`` (an empty one when there is none) to ``config``.

    ``create_timing_cache(b"")`` makes an empty cache; ``set_timing_cache(cache, ignore_mismatch=False)``
    returns False for a cache from another device. A cache TensorRT will not take (corrupt, another
    TensorRT version or GPU) is replaced by an empty one, and the note says so; it is overwritten after
    the build. Returns (the attached cache, the note or None).
    """
    note = None
    data = cache_path.read_bytes() if cache_path.is_file() else b""
    cache = None
    if data:
        try:
            cache = config.create_timing_cache(data)
        except Exception:  # a corrupt blob: start afresh
            cache = None
        if cache is not None and not config.set_timing_cache(cache, ignore_mismatch=False):
            cache = None
        if cache is None:
            note = f"timing cache {str(cache_path)!r} does not fit this TensorRT/GPU: starting an empty one"
    if cache is None:
        cache = config.create_timing_cache(b"")
        if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
            raise ExportError("TensorRT could not create an empty timing cache")
    return cache, note


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
    - ``precision``: ``"fp16"`` / ``"bf16"`` (normalization, softmax and reductions kept in fp32) or
      ``"fp32"`` (TF32 off).
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
    weak_flags = (
        weak_typing_flags(trt.BuilderFlag, precision, trt.__version__)
        if (not strongly_typed and precision != "fp32")
        else []
    )
    # TensorRT 10: networks are always explicit-batch (EXPLICIT_BATCH is deprecated and ignored), so the
    # only creation flag is STRONGLY_TYPED, passed as a bit mask.
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    with stages.step(f"parsing {onnx_path}"):
        # parse_from_file (not parse(bytes)) so weights stored beside the file as external data are found
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise ExportError(f"TensorRT's ONNX parser rejected {str(onnx_path)!r}: {errors}")
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the inspector lists layer details only then
    if workspace_gib:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    # BuilderFlag.TF32 is on by default: fp32 matmuls would round their inputs to 10-bit mantissas, which an
    # "fp32" engine must not do (verification compares it with true fp32 eager PyTorch).
    tf32 = precision != "fp32"
    if not tf32 and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    pinned = 0
    if weak_flags:
        for flag in weak_flags:
            config.set_flag(flag)
        # In a weakly typed network layer.precision / set_output_type are constraints that
        # OBEY_PRECISION_CONSTRAINTS makes binding (both are deprecated from TensorRT 10.12 on, still honoured).
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            out_types = [trt_dtype_name(layer.get_output(j).dtype) for j in range(layer.num_outputs)]
            if pins_fp32(trt_dtype_name(layer.type), out_types):
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
    cache, cache_note = _attach_timing_cache(config, cache_path)
    if cache_note:
        stages.note(cache_note)
    with stages.step(f"building a {precision} engine for batch {batch} on {torch.cuda.get_device_name()} ({sm})"):
        # returns an IHostMemory, or None on failure (the reason goes to the logger)
        serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT could not build an engine from {str(onnx_path)!r} (see its log above)")
    # the attached cache gained the tactics timed in this build; serialize() returns an IHostMemory (a buffer)
    write_atomic(cache_path, bytes((config.get_timing_cache() or cache).serialize()))

    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(serialized)
    if engine is None:
        raise ExportError(f"TensorRT built an engine from {str(onnx_path)!r} but cannot load it (see its log above)")
    inspector = engine.create_engine_inspector()
    # get_engine_information returns a JSON string {"Layers": [...], "Bindings": [...]}: each layer a dict
    # with ProfilingVerbosity.DETAILED (set above), only its name (a string) with LAYER_NAMES_ONLY.
    try:
        layers = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON)).get("Layers", [])
    except (ValueError, AttributeError, TypeError):
        layers = []
    del inspector, engine, runtime  # free the inspected copy before verification loads its own
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
        "tf32": tf32,
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
        publish([staged, metadata_path(staged)], engine_path.parent)
    return engine_path


__all__ = [
    "PRECISIONS",
    "TensorRTRunner",
    "attention_fused",
    "check_batch_in_profile",
    "check_engine_compat",
    "check_tensorrt_args",
    "gpu_sm",
    "pins_fp32",
    "require_tensorrt",
    "to_tensorrt",
    "torch_dtype",
    "trt_dtype_name",
    "weak_typing_flags",
]
