"""TensorRT engines from our ONNX files, built through NVIDIA's polygraphy loaders (TensorRT 10): an fp32 ONNX file
built weakly typed with its normalization, softmax and reduction layers pinned to fp32 (:class:`Fp32Pins`), a 16-bit
one strongly typed; the engine verified while staged and published with its metadata only when it passed. Why each
choice: docs/development.md, "TensorRT engines"."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vit_fast.backend.env import git_commit
from vit_fast.util.dtypes import DTYPE_NAMES, ONNX_ELEM_TYPES
from vit_fast.util.files import claim, json_text, publish_to, staging_dir, write_atomic, write_new
from vit_fast.util.progress import Stages

from ._common import (
    ArtifactError,
    ExportError,
    check_artifact_outputs,
    check_batch_range,
    check_readable_file,
    check_report_path,
    external_data_files,
    file_sha256,
    metadata_batch,
    metadata_path,
    read_metadata,
    vit_fast_version,
)
from .graph import image_axes
from .trt_common import gpu_sm, polygraphy_logging, require_polygraphy, require_tensorrt, trt_dtype_name
from .verify import VerifyOptions, record_verification, verify_options, verify_staged

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
_FLOAT_TYPE_NAMES = {"FLOAT", "HALF", "BF16"}


class Fp32Pins:
    """The network postprocess of a weakly typed fp16/bf16 build (polygraphy ``PostprocessNetwork`` calls it with
    ``network=``): every layer of a :data:`FP32_PINNED_LAYER_TYPES` type whose outputs are all floating point (a
    reduction over a shape tensor stays integer) gets ``layer.precision`` and each output's type set to ``float32``
    (``trt.float32``), constraints that ``precision_constraints="obey"`` makes binding (both setters are deprecated
    from TensorRT 10.12 on, still honoured). ``pinned`` lists the names of the layers pinned."""

    def __init__(self, float32: Any) -> None:
        self.float32 = float32
        self.pinned: list[str] = []

    def __call__(self, network: Any) -> None:
        for layer in network:
            out_types = [trt_dtype_name(layer.get_output(j).dtype) for j in range(layer.num_outputs)]
            if trt_dtype_name(layer.type) in FP32_PINNED_LAYER_TYPES and set(out_types) <= _FLOAT_TYPE_NAMES:
                layer.precision = self.float32
                for j in range(layer.num_outputs):
                    layer.set_output_type(j, self.float32)
                self.pinned.append(layer.name)


def check_weak_typing(builder_flag: Any, precision: str, trt_version: str) -> None:
    """Raise an ExportError when this TensorRT's ``trt.BuilderFlag`` lacks what a weakly typed ``precision`` build
    sets (FP16 or BF16, and OBEY_PRECISION_CONSTRAINTS so the fp32 pins hold): TensorRT 11 removed every
    weak-typing flag (networks are always strongly typed there)."""
    names = ("FP16" if precision == "fp16" else "BF16", "OBEY_PRECISION_CONSTRAINTS")
    missing = [n for n in names if not hasattr(builder_flag, n)]
    if missing:
        raise ExportError(
            f"TensorRT {trt_version} has no BuilderFlag.{'/'.join(missing)} (TensorRT 11 removed weakly typed "
            f"builds), so an fp32 ONNX file cannot be built as a {precision} engine here: export a {precision} ONNX "
            f"file (to_onnx(dtype={precision!r})), which is built strongly typed, or install tensorrt>=10,<11"
        )


def engine_profile(
    input_name: str, dims: list[int], batch: tuple[int, int, int], meta: dict[str, Any] | None, onnx_path: Path
) -> dict[str, Any]:
    """The optimization profile ``{"input", "min", "opt", "max"}`` (shapes as lists) for the ONNX input
    ``input_name`` of ``dims`` (-1 where symbolic): the batch axis from ``batch=(min, opt, max)``, the rest
    as the graph has them; a dynamic height/width (``dynamic_size`` exports) is built for the model's native
    size from the metadata, on the axes of the input's layout."""
    chw = list(dims[1:])
    if any(d < 0 for d in chw):
        cfg = (meta or {}).get("config") or {}
        if "img_size" not in cfg:
            raise ValueError(f"{str(onnx_path)!r} has a dynamic image size and no metadata naming the native size")
        img = cfg["img_size"]
        h, w = (img, img) if isinstance(img, int) else img
        _, h_axis, w_axis = image_axes((meta or {}).get("preprocess"))
        chw[h_axis - 1], chw[w_axis - 1] = h, w
    return {"input": input_name, **{key: [b, *chw] for key, b in zip(("min", "opt", "max"), batch, strict=True)}}


def check_tensorrt_args(
    onnx_path: Any, engine_path: Any, batch: Any, precision: Any, timing_cache: Any, overwrite: bool = False
) -> tuple[Path, Path, tuple[int, int, int], dict[str, Any] | None, str, dict[str, Any]]:
    """Every check :func:`to_tensorrt` makes before TensorRT is touched; returns the cleaned arguments
    (onnx path, engine path, batch triple, ONNX metadata or None, ONNX dtype name, :func:`engine_profile`)."""
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
    external_data_files(onnx_path, proto)  # each inside the file's folder and there, before TensorRT's parser opens it
    # the graph's compute dtype: its input's, or for uint8 pixels (a preprocessing front) its first output's
    inp = proto.graph.input[0]
    elem = ONNX_ELEM_TYPES.get(inp.type.tensor_type.elem_type)
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
        lo, hi = metadata_batch(meta, onnx_path)
        if batch[0] < lo or batch[2] > hi:
            raise ValueError(
                f"engine batch profile {batch} lies outside the ONNX file's exported batch range [{lo}, {hi}]: "
                f"pick min >= {lo} and max <= {hi}, or re-export with batch=({min(lo, batch[0])}, {max(hi, batch[2])})"
            )
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in inp.type.tensor_type.shape.dim]
    return onnx_path, engine_path, batch, meta, onnx_dtype, engine_profile(inp.name, dims, batch, meta, onnx_path)


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


def reuse_timing_cache(cache_path: Path, notes: list[str]) -> Callable[[Any, Any, Any], None]:
    """The config postprocess (``PostprocessConfig`` calls it with builder, network, config) attaching the cache read
    from ``cache_path`` in place of the empty one ``CreateConfig`` attached. A corrupt one or one from another
    TensorRT/GPU is replaced by a fresh empty one, with a note in ``notes``. How each is told, and why not
    polygraphy's ``load_timing_cache``: docs/development.md, section TensorRT engines."""

    def attach(builder: Any, network: Any, config: Any) -> None:
        data = cache_path.read_bytes() if cache_path.is_file() else b""
        if not data:
            return
        try:
            cache = config.create_timing_cache(data)
        except Exception:  # a corrupt blob: start afresh
            cache = None
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            return
        notes.append(f"timing cache {str(cache_path)!r} does not fit this TensorRT/GPU: starting an empty one")
        if not config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False):
            raise ExportError("TensorRT could not attach an empty timing cache")

    return attach


def engine_loaders(
    trt: Any,
    onnx_path: Path,
    profile: dict[str, Any],
    precision: str,
    strongly_typed: bool,
    cache_path: Path,
    save_cache: Path,
    workspace_gib: float | None = None,
) -> tuple[Any, Any, Fp32Pins | None, Any, list[str]]:
    """The polygraphy loaders of one build, lazy until ``engine()`` parses, configures and builds (returning the
    serialized engine): ``(NetworkFromOnnxPath, CreateConfig, the fp32 pins of a weakly typed build or None,
    EngineBytesFromNetwork, the timing-cache notes filled during the build)``. ``trt`` is the tensorrt module,
    ``profile`` from :func:`engine_profile`; the cache is read from ``cache_path`` and saved to ``save_cache``."""
    pg = require_polygraphy()
    weak = not strongly_typed and precision != "fp32"
    if weak:
        check_weak_typing(trt.BuilderFlag, precision, trt.__version__)
    network = pg.NetworkFromOnnxPath(str(onnx_path), strongly_typed=strongly_typed)
    pins = Fp32Pins(trt.float32) if weak else None
    shapes = [tuple(profile[key]) for key in ("min", "opt", "max")]
    config = pg.CreateConfig(
        fp16=weak and precision == "fp16",
        bf16=weak and precision == "bf16",
        # TF32 (on in TensorRT by default) rounds fp32 matmul inputs to 10-bit mantissas, which an "fp32" engine
        # must not do: verification compares it with true fp32 eager PyTorch
        tf32=precision != "fp32",
        precision_constraints="obey" if weak else None,
        profiles=[pg.Profile().add(profile["input"], *shapes)],
        profiling_verbosity=trt.ProfilingVerbosity.DETAILED,  # the inspector lists layer details only then
        memory_pool_limits={trt.MemoryPoolType.WORKSPACE: int(workspace_gib * (1 << 30))} if workspace_gib else None,
    )
    notes: list[str] = []
    engine = pg.EngineBytesFromNetwork(
        pg.PostprocessNetwork(network, pins, name="vit-fast fp32 pins") if pins else network,
        pg.PostprocessConfig(config, reuse_timing_cache(cache_path, notes)),
        save_timing_cache=str(save_cache),
    )
    return network, config, pins, engine, notes


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
    """Build a TensorRT engine from an ONNX file exported by :func:`vit_fast.export.to_onnx`, verify it while staged
    and write ``engine_path`` and ``engine_path + ".json"`` only when it passed; every output path is checked before
    TensorRT is touched. ``batch=(min, opt, max)``, ``precision`` (``"fp16"`` / ``"bf16"`` / ``"fp32"``),
    ``timing_cache``, ``workspace_gib``, ``model``, ``verify``, ``report`` and ``overwrite``: docs/deploy.md, section
    The Python API."""
    onnx_path, engine_path, batch, onnx_meta, onnx_dtype, profile = check_tensorrt_args(
        onnx_path, engine_path, batch, precision, timing_cache, overwrite
    )
    options = verify_options(verify, report, batch_range=(batch[0], batch[2]))
    report_path = check_report_path(report, overwrite, artifact=engine_path) if report is not None else None
    if options is not None and model is None and not (onnx_meta and onnx_meta.get("source")):
        raise ValueError(
            f"cannot verify the engine: pass model= (the model {str(onnx_path)!r} was exported from) "
            "or verify=False; the ONNX metadata names no source model"
        )
    trt = require_tensorrt()
    require_polygraphy()
    if not torch.cuda.is_available():
        raise RuntimeError("building a TensorRT engine needs a CUDA GPU; none is visible")
    stages = Stages("vit-fast export", progress)
    sm, gpu = gpu_sm(), torch.cuda.get_device_name()
    cache_path = Path(timing_cache) if timing_cache else default_timing_cache(engine_path, trt.__version__, sm)
    claim(cache_path, overwrite=True)  # a cache, read before the build and replaced after it, whatever it holds then
    strongly_typed = onnx_dtype in ("fp16", "bf16")
    with contextlib.ExitStack() as stack:
        staging = stack.enter_context(staging_dir(engine_path))
        staged, saved_cache = staging / engine_path.name, staging / "timing.cache"
        with polygraphy_logging(ExportError, f"TensorRT could not build an engine from {str(onnx_path)!r}"):
            _, config, pins, build, notes = engine_loaders(
                trt, onnx_path, profile, precision, strongly_typed, cache_path, saved_cache, workspace_gib
            )
            with stages.step(f"parsing {onnx_path}, building a {precision} engine for batch {batch} on {gpu} ({sm})"):
                serialized = build()
            for note in notes:
                stages.note(note)
            # the attached cache with the tactics timed in this build, saved by polygraphy into the staging folder
            if saved_cache.is_file():
                write_atomic(cache_path, saved_cache.read_bytes())
            write_new(staged, bytes(serialized))
            engine = require_polygraphy().EngineFromBytes(serialized)()  # kept alive while its inspector is used
            inspector = engine.create_engine_inspector()
        # a JSON string {"Layers": [...], "Bindings": [...]}: each layer a dict with ProfilingVerbosity.DETAILED (set by
        # engine_loaders), only its name with LAYER_NAMES_ONLY
        try:
            layers = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON)).get("Layers", [])
        except (ValueError, AttributeError, TypeError):
            layers = []
        del inspector, engine, serialized  # free the inspected engine and the plan before verification loads its own
        meta = {
            "format": "tensorrt",
            "onnx": str(onnx_path),
            **{key: (onnx_meta or {}).get(key) for key in CARRIED_FROM_ONNX},
            "tensorrt_version": trt.__version__,
            "gpu_sm": sm,
            "gpu_name": gpu,
            "precision": precision,
            "strongly_typed": strongly_typed,
            "fp32_pinned_layers": len(pins.pinned) if pins else 0,
            "tf32": config.tf32,
            "profiles": [profile],
            "batch": [batch[0], batch[2]],
            "num_layers": len(layers),
            "attention_fused": attention_fused(layers),
            "timing_cache": str(cache_path),
            "verification": None,
            "sha256": file_sha256(staged),  # the proof, bound to the engine's bytes, that vit-fast wrote it
            "vit_fast_version": vit_fast_version(),
            "git_commit": git_commit(),
        }
        stages.note(f"{len(layers)} engine layers; attention fused: {meta['attention_fused']}")
        write_new(metadata_path(staged), json_text(meta))
        moves = [(staged, engine_path), (metadata_path(staged), metadata_path(engine_path))]
        if options is not None:
            with stages.step("verifying the engine against eager PyTorch"):
                result = verify_staged(model if model is not None else meta["source"], staged, options, engine_path)
            record_verification(stack, result, meta, _metadata_writer(staged), report_path, moves)
        publish_to(moves)
    if options is not None and options.on_published is not None:
        options.on_published(result)
    return engine_path


def _metadata_writer(engine: Path) -> Callable[[dict[str, Any]], None]:
    """What rewrites the metadata beside the staged ``engine``."""
    return lambda meta: write_new(metadata_path(engine), json_text(meta), replace=True)


__all__ = [
    "PRECISIONS",
    "Fp32Pins",
    "attention_fused",
    "check_tensorrt_args",
    "check_weak_typing",
    "default_timing_cache",
    "engine_loaders",
    "engine_profile",
    "reuse_timing_cache",
    "to_tensorrt",
]
