"""The tensors Triton sees of an artifact: an ONNX file (:func:`onnx_specs`) or a vit-fast TensorRT engine
(:func:`engine_specs`, from its metadata), and the image layout its metadata records (:func:`input_layout`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vit_fast.export._common import ArtifactError, inside, metadata_path
from vit_fast.util.dtypes import parse_dtype

from .config import TensorSpec


def onnx_specs(path: Path, layout: str | None = None) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX graph whose dim 0 is a symbolic batch: float tensors, and uint8 pixels
    for an input (a preprocessing front; ``layout``, from the artifact's metadata, is stated for them)."""
    import onnx

    from vit_fast.export.runners import INPUT_ELEM_TYPES
    from vit_fast.util.dtypes import ONNX_ELEM_TYPES

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as err:
        raise ArtifactError(f"cannot read {str(path)!r} as an ONNX model: {type(err).__name__}: {err}") from err
    weights = {t.name for t in proto.graph.initializer}
    specs: dict[str, list[TensorSpec]] = {"input": [], "output": []}
    for key, values in (("input", proto.graph.input), ("output", proto.graph.output)):
        for v in values:
            if v.name in weights:
                continue
            tt = v.type.tensor_type
            types = INPUT_ELEM_TYPES if key == "input" else ONNX_ELEM_TYPES
            if tt.elem_type not in types:
                raise ArtifactError(
                    f"{str(path)!r}: {key} {v.name!r} has ONNX element type {tt.elem_type}, not fp32, fp16 or bf16"
                    + (" (nor uint8 pixels)" if key == "input" else "")
                    + ": Triton repositories serve the graphs vit-fast export onnx writes"
                )
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            if not dims or dims[0] != -1:
                raise ArtifactError(
                    f"{str(path)!r}: {key} {v.name!r} has shape {dims} without a variable batch dimension 0, so Triton "
                    "cannot batch it: export it with vit-fast export onnx (dim 0 symbolic)"
                )
            dtype = types[tt.elem_type]
            stated = layout if dtype == torch.uint8 and len(dims) == 4 else None  # Triton states it for 3 dims
            specs[key].append(TensorSpec(v.name, dtype, tuple(dims[1:]), stated))
    if not specs["input"] or not specs["output"]:
        raise ArtifactError(f"{str(path)!r} is not an ONNX model with inputs and outputs")
    return specs["input"], specs["output"]


def input_layout(meta: dict[str, Any] | None, path: Path) -> str | None:
    """The image layout an artifact's metadata records for its uint8 input (``input_layout``, else its
    preprocessing front's), or None where it records none; a value other than NCHW / NHWC raises naming it."""
    meta = meta or {}
    front = meta.get("preprocess") if isinstance(meta.get("preprocess"), dict) else {}
    layout = meta.get("input_layout") or front.get("layout")
    if layout is None:
        return None
    if layout not in ("NCHW", "NHWC"):
        raise ArtifactError(f"metadata of {str(path)!r}: input_layout {layout!r} is not NCHW or NHWC: fix that field")
    return layout


def engine_specs(path: Path, meta: dict[str, Any]) -> tuple[list[TensorSpec], list[TensorSpec], tuple[int, int, int]]:
    """Inputs, outputs and the batch profile (min, opt, max) of a vit-fast TensorRT engine, from its metadata: the
    input from the recorded optimization profile, the outputs from the ONNX file the engine was built from where it
    lies beside the engine, else from the recorded outputs and model config. I/O dtypes: a strongly typed engine
    keeps its ONNX file's dtype, a weakly typed one fp32 I/O. See docs/development.md, section The Triton model
    repository."""
    profiles = meta.get("profiles") or []
    if not profiles or not {"input", "min", "opt", "max"} <= set(profiles[0]):
        raise ArtifactError(f"metadata of engine {str(path)!r} records no optimization profile: rebuild it")
    p = profiles[0]
    io_dtype = parse_dtype(meta["precision"]) if meta.get("strongly_typed") else torch.float32
    pixels = meta.get("input_dtype") == "uint8"
    layout = input_layout(meta, path) if pixels else None
    dims = tuple(int(d) for d in p["max"][1:])
    inputs = [TensorSpec(p["input"], torch.uint8 if pixels else io_dtype, dims, layout if len(dims) == 3 else None)]
    recorded = meta.get("onnx")
    onnx_file = None
    if isinstance(recorded, str) and recorded.strip():
        field = "field 'onnx' (its file name)"
        onnx_file = inside(path.parent, Path(recorded).name, source=metadata_path(path), field=field)
    if onnx_file is not None and onnx_file.is_file():
        _, onnx_outputs = onnx_specs(onnx_file)
        outputs = [TensorSpec(s.name, io_dtype, s.dims) for s in onnx_outputs]
    else:
        outputs = _recorded_outputs(path, meta, io_dtype)
    profile = (int(p["min"][0]), int(p["opt"][0]), int(p["max"][0]))
    return inputs, outputs, profile


def _recorded_outputs(path: Path, meta: dict[str, Any], dtype: torch.dtype) -> list[TensorSpec]:
    """An engine's outputs from its metadata alone: the recorded output kinds and names (default: the
    model's logits, or its features without a head) with dims from the recorded model config."""
    from vit_fast.model.config import ViTConfig

    raw = meta.get("config")
    try:
        cfg = ViTConfig.from_dict(raw) if isinstance(raw, dict) else None
    except (TypeError, ValueError) as err:
        raise ArtifactError(f"engine {str(path)!r}: the model config in its metadata is unusable: {err}") from err
    if cfg is None:
        raise ArtifactError(
            f"engine {str(path)!r}: the ONNX file it was built from is not beside it and its metadata records no "
            "model config, so its outputs are unknown: put the ONNX file beside the engine, or rebuild it with "
            "vit-fast export tensorrt"
        )
    tokens = -1 if cfg.dynamic_img_size or meta.get("dynamic_size") else cfg.num_tokens
    dims = {"logits": (cfg.num_classes,), "pooled": (cfg.embed_dim,), "last_hidden_state": (tokens, cfg.embed_dim)}
    kinds = meta.get("outputs") or ["logits" if cfg.num_classes else "pooled"]
    # named as exported; metadata from before outputs were recorded: the single output's name of that time
    former = ["logits" if cfg.num_classes else "features"]
    names = meta.get("output_names") or (kinds if meta.get("outputs") else former)
    if not isinstance(kinds, list) or not isinstance(names, list) or len(kinds) != len(names):
        raise ArtifactError(f"engine {str(path)!r}: its metadata's outputs {kinds!r} and output_names {names!r} differ")
    unknown = [k for k in kinds if k not in dims]
    if unknown:
        raise ArtifactError(f"engine {str(path)!r}: its metadata names unknown outputs {unknown}: rebuild it")
    return [TensorSpec(str(n), dtype, dims[k]) for k, n in zip(kinds, names, strict=True)]
