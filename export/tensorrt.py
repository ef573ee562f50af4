"""TensorRT engines from our ONNX files, written against TensorRT 10's Python API.

Building: an fp32 ONNX file is parsed into a weakly typed network and built with the FP16 or
BF16 builder flag, with every normalization, softmax and floating-point reduction layer pinned
to fp32 (``OBEY_PRECISION_CONSTRAINTS``), since their reductions overflow in fp16; ``"fp32"``
clears the TF32 flag TensorRT sets by default. An fp16/bf16 ONNX file is built STRONGLY_TYPED
(the graph's own types rule; ``precision`` must match). TensorRT 11 has no weakly typed builds:
there an fp32 ONNX file builds only as an fp32 engine. One
optimization profile from ``batch=(min, opt, max)``; a timing cache file is read before and
written after each build so later builds reuse the measured tactics. The engine inspector's
layer list tells whether attention became one fused layer. The engine is verified (every output of
the ONNX graph, its preprocessing front included) against eager PyTorch while it is still staged, and
published with its metadata (and the report) only when it passed; one that fails is not left there.

The metadata beside an engine records the TensorRT version and GPU compute capability it was
built for and its batch profile; ``runners.EngineRunner`` loads and runs engines, checking that
metadata with ``trt_common.check_engine_compat`` (a mismatch says what to rebuild).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from vit_fast.dtypes import DTYPE_NAMES, ONNX_ELEM_TYPES
from vit_fast.env import git_commit
from vit_fast.files import json_text, publish_to, staging_dir, write_atomic
from vit_fast.progress import Stages

from ._common import (
    ArtifactError,
    ExportError,
    check_artifact_outputs,
    check_batch_range,
    check_readable_file,
    check_report_path,
    metadata_path,
    read_metadata,
    vit_fast_version,
)
from .graph import image_axes
from .trt_common import gpu_sm, require_tensorrt, trt_dtype_name
from .verify import VerifyOptions, stage_report, verify_options, verify_staged

#: what an engine's metadata carries over from the ONNX file's: the graph's I/O and where its weights came from
CARRIED_FROM_ONNX = (
    "config",
    "source",
    "outputs",
    "output_names",
    "input",
    "input_dtype",
    "input_layout",
    "preprocess",
    "weights",
)

PRECISIONS = ("fp16", "bf16", "fp32")
_FUSED_ATTENTION_MARKS = ("mha", "attention", "fmha", "flash")
#: layer types kept in fp32 in a weakly typed fp16/bf16 build. TensorRT 10's ONNX parser imports
#: ``LayerNormalization`` (opset >= 17) as one INormalizationLayer (LayerType.NORMALIZATION) and
#: ``Softmax`` as ISoftMaxLayer (LayerType.SOFTMAX); a LayerNorm decomposed by an older opset, and
#: mean pooling, are ReduceMean -> LayerType.REDUCE.
FP32_PINNED_LAYER_TYPES = ("NORMALIZATION", "SOFTMAX", "REDUCE")
_FLOAT_TYPE_NAMES = ("FLOAT", "HALF", "BF16")


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
    onnx_path: Any, engine_path: Any, batch: Any, precision: Any, timing_cache: Any, overwrite: bool = False
) -> tuple[Path, Path, tuple[int, int, int], dict[str, Any] | None, str]:
    """Every check :func:`to_tensorrt` makes before TensorRT is touched; returns the cleaned arguments
    (onnx path, engine path, batch triple, ONNX metadata or None, ONNX dtype name)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    batch = check_batch_range(batch, ("min", "opt", "max"))
    onnx_path = check_readable_file(onnx_path, "ONNX file")
    engine_path = check_artifact_outputs(engine_path, "engine", overwrite)
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
    # the graph's compute dtype: its input's, or for uint8 pixels (a preprocessing front) its first output's
    elem = ONNX_ELEM_TYPES.get(proto.graph.input[0].type.tensor_type.elem_type)
    if elem is None and proto.graph.output:
        elem = ONNX_ELEM_TYPES.get(proto.graph.output[0].type.tensor_type.elem_type)
    onnx_dtype = DTYPE_NAMES[elem] if elem is not None else "unknown"
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


def attention_fused(layers: list[Any]) -> bool:
    """Whether an engine's layer list (inspector JSON ``Layers``) holds a fused attention layer."""
    for layer in layers:
        text = json.dumps(layer).lower() if not isinstance(layer, str) else layer.lower()
        if any(mark in text for mark in _FUSED_ATTENTION_MARKS):
            return True
    return False


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
    verify: bool | VerifyOptions = True,
    progress: bool = True,
    *,
    report: str | os.PathLike | None = None,
    overwrite: bool = False,
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
    - ``verify``: True (default) or :class:`VerifyOptions`: the staged engine is verified before anything
      is published and the result recorded in its metadata; False publishes it unverified (recorded so).
    - ``report``: with ``verify``, the verification report as JSON, published with the engine.
    - ``overwrite``: replace existing files that vit-fast did not write.

    Every output path is checked before TensorRT is touched. Writes ``engine_path`` and
    ``engine_path + ".json"`` (TensorRT version, GPU SM, precision, profile, whether attention was
    fused, the graph's I/O, the weights, the verification) only when the engine passed verification.
    """
    onnx_path, engine_path, batch, onnx_meta, onnx_dtype = check_tensorrt_args(
        onnx_path, engine_path, batch, precision, timing_cache, overwrite
    )
    options = verify_options(verify, report)
    report_path = check_report_path(report, overwrite) if report is not None else None
    if options is not None and model is None and not (onnx_meta and onnx_meta.get("source")):
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
    chw = list(inp.shape)[1:]
    if any(d < 0 for d in chw):  # dynamic H/W: build for the native size, on the axes of the input's layout
        cfg = (onnx_meta or {}).get("config") or {}
        if "img_size" not in cfg:
            raise ValueError(f"{str(onnx_path)!r} has a dynamic image size and no metadata naming the native size")
        img = cfg["img_size"]
        h, w = (img, img) if isinstance(img, int) else img
        _, h_axis, w_axis = image_axes((onnx_meta or {}).get("preprocess"))
        chw[h_axis - 1], chw[w_axis - 1] = h, w
    chw = tuple(chw)
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
        **{key: (onnx_meta or {}).get(key) for key in CARRIED_FROM_ONNX},
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
        "verification": None,
        "vit_fast_version": vit_fast_version(),
        "git_commit": git_commit(),
    }
    stages.note(f"{len(layers)} engine layers; attention fused: {meta['attention_fused']}")
    with contextlib.ExitStack() as stack:
        staged = stack.enter_context(staging_dir(engine_path)) / engine_path.name
        staged.write_bytes(bytes(serialized))
        metadata_path(staged).write_text(json_text(meta))
        moves = [(staged, engine_path), (metadata_path(staged), metadata_path(engine_path))]
        if options is not None:
            with stages.step("verifying the engine against eager PyTorch"):
                result = verify_staged(model if model is not None else meta["source"], staged, options, engine_path)
            meta["verification"] = result.record()
            metadata_path(staged).write_text(json_text(meta))
            if report_path is not None:
                moves.append(stage_report(stack, result, report_path))
        publish_to(moves)
    return engine_path


__all__ = [
    "PRECISIONS",
    "attention_fused",
    "check_tensorrt_args",
    "default_timing_cache",
    "pins_fp32",
    "to_tensorrt",
    "weak_typing_flags",
]
