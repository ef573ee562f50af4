"""The ``config.pbtxt`` model of a Triton Inference Server model folder, apart from writing any files:

- the tensors (:class:`TensorSpec`), batching and placement (:class:`Batching`) and the whole config
  (:class:`EntryConfig`, rendered by ``to_pbtxt``);
- the checks of the serving arguments (model name, instances and kind, queue delay, batch sizes;
  :func:`plan_batching` checks and plans them all);
- the tensors Triton sees of an ONNX file or a vit-fast engine (:func:`onnx_specs`, :func:`engine_specs`)
  and of a ViT (:func:`model_io`);
- the provenance comments that open every config.

The repository writer that fills model folders with artifacts is ``tritonserver``; ``vit_fast.serve``
uses both.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.backend.env import git_commit
from vit_fast.util.batches import MAX_BATCH, parse_batch_list
from vit_fast.util.dtypes import parse_dtype

from ._common import ArtifactError, inside, metadata_path, vit_fast_version

#: torch dtype -> Triton model-config data type (uint8: the pixels an artifact with a preprocessing front takes)
TRITON_TYPES: dict[torch.dtype, str] = {
    torch.float32: "TYPE_FP32",
    torch.float16: "TYPE_FP16",
    torch.bfloat16: "TYPE_BF16",
    torch.uint8: "TYPE_UINT8",
}
#: artifact format -> Triton platform
PLATFORMS = {"onnx": "onnxruntime_onnx", "tensorrt": "tensorrt_plan"}
#: artifact format -> the file name Triton looks for in a version folder
MODEL_FILES = {"onnx": "model.onnx", "tensorrt": "model.plan", "python": "model.py"}
#: --kind -> Triton instance-group kind
KINDS = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}
#: batch sizes offered when none are asked for: (preferred..., max); clipped to the artifact's range
DEFAULT_BATCH = (1, 8, 64)
#: how long Triton's dynamic batcher may hold a request to fill a batch (microseconds)
DEFAULT_QUEUE_DELAY_US = 100
INPUT_NAME = "images"
VERSION = "1"
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as Triton sees it: ``dims`` exclude the batch dimension; -1 is variable.
    ``layout`` (``"NCHW"`` / ``"NHWC"``, inputs only) is the image layout the config states as the input's
    ``format``; None states none."""

    name: str
    dtype: torch.dtype
    dims: tuple[int, ...]
    layout: str | None = None


@dataclass(frozen=True)
class Batching:
    """How Triton batches and places one model: the largest batch, the dynamic batcher's preferred
    sizes and queue delay (microseconds), and the instance group (``instances`` of ``kind``)."""

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    queue_delay_us: int
    instances: int
    kind: str


@dataclass
class EntryConfig:
    """Everything one ``config.pbtxt`` says; :meth:`to_pbtxt` writes it in protobuf text format."""

    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batching: Batching
    platform: str | None = None
    backend: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    comments: list[str] = field(default_factory=list)

    def to_pbtxt(self) -> str:
        """The model configuration as Triton reads it (``ModelConfig`` of model_config.proto, text format)."""
        lines = [f"# {c}" for c in self.comments] + [f'name: "{self.name}"']
        if self.platform:
            lines.append(f'platform: "{self.platform}"')
        if self.backend:
            lines.append(f'backend: "{self.backend}"')
        b = self.batching
        lines.append(f"max_batch_size: {b.max_batch_size}")
        for key, specs in (("input", self.inputs), ("output", self.outputs)):
            items = [
                f'  {{\n    name: "{s.name}"\n    data_type: {TRITON_TYPES[s.dtype]}\n'
                + (f"    format: FORMAT_{s.layout}\n" if s.layout else "")
                + f"    dims: [ {', '.join(map(str, s.dims))} ]\n  }}"
                for s in specs
            ]
            lines.append(f"{key} [\n" + ",\n".join(items) + "\n]")
        lines.append(f"instance_group [\n  {{\n    count: {b.instances}\n    kind: {KINDS[b.kind]}\n  }}\n]")
        batcher = []
        if b.preferred_batch_sizes:
            batcher.append(f"  preferred_batch_size: [ {', '.join(map(str, b.preferred_batch_sizes))} ]")
        batcher.append(f"  max_queue_delay_microseconds: {b.queue_delay_us}")
        lines.append("dynamic_batching {\n" + "\n".join(batcher) + "\n}")
        for key, value in self.parameters.items():
            lines.append(
                f"parameters {{\n  key: {json.dumps(key)}\n  value: {{ string_value: {json.dumps(value)} }}\n}}"
            )
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- argument checks
def check_model_name(name: str) -> str:
    """A Triton model name: letters, digits, ``.``, ``_``, ``-`` (it is a folder and a URL path segment)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", ".."):
        raise ValueError(f"model name {name!r} is not usable by Triton: use letters, digits, '.', '_' and '-' only")
    return name


def model_name_for(spec: str | os.PathLike) -> str:
    """The default Triton model name for a model spec or artifact path: its file stem, other characters as ``_``."""
    stem = Path(str(spec)).stem if Path(str(spec)).suffix else Path(str(spec)).name
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip(".") or "vit"


def machine_kind(engine: bool = False) -> tuple[str, str]:
    """The instance kind to write when none is asked for, and why: ``"gpu"`` for a TensorRT engine (it runs on a
    GPU only) and where torch sees a CUDA GPU, else ``"cpu"`` (a KIND_GPU model fails to load on a server
    without one)."""
    if engine:
        return "gpu", "a TensorRT engine runs on a GPU only"
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return "gpu", f"torch sees {count} CUDA GPU{'s' if count != 1 else ''} here"
    return "cpu", "no CUDA GPU is visible to torch here; pass --kind gpu for a repository a GPU server will load"


def check_instances(instances: Any, kind: Any) -> tuple[int, str]:
    """Validate the instance group: ``instances`` >= 1 and ``kind`` "gpu" or "cpu"."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances must be an int >= 1 (model instances per device), got {instances!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return instances, kind


def check_queue_delay(queue_delay_us: Any) -> int:
    if isinstance(queue_delay_us, bool) or not isinstance(queue_delay_us, int) or queue_delay_us < 0:
        raise ValueError(f"queue delay must be an int >= 0 (microseconds), got {queue_delay_us!r}")
    return queue_delay_us


def parse_batch_sizes(text: str | Sequence[int]) -> list[int]:
    """``"1,8,64"`` -> ``[1, 8, 64]`` (a sequence of ints is checked and returned as a list)."""
    return parse_batch_list(text)


def batch_plan(
    batch: Sequence[int] | None, limit: tuple[int, int] | None = None, opt: int | None = None, what: str = "artifact"
) -> tuple[int, list[int]]:
    """``(max_batch_size, preferred_batch_sizes)`` from the sizes asked for.

    ``batch``: the sizes to serve, the largest being the maximum batch (sizes above 1 become
    Triton's preferred batch sizes; a preferred size of 1 would dispatch every request alone).
    Default: 8 and 64 (or ``opt``), clipped to ``limit=(min, max)``, the artifact's batch range.
    Triton forms any batch from 1 to the maximum, so a range that starts above 1 is refused.
    """
    lo, hi = limit if limit is not None else (1, None)
    if lo > 1:
        raise ValueError(
            f"the {what} serves batches from {lo} up, but Triton's dynamic batcher sends any batch from 1 to "
            f"max_batch_size: export or build it with a batch range that starts at 1"
        )
    if batch is None:
        top = hi if hi is not None else DEFAULT_BATCH[-1]
        wanted = {b for b in (*DEFAULT_BATCH[1:-1], opt) if b is not None and 1 < b < top}
        return top, sorted(wanted | ({top} if top > 1 else set()))
    sizes = list(batch)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH for b in sizes):
        raise ValueError(
            f"batch sizes must be ints >= 1 (at most {MAX_BATCH}) such as 1,8,64 (the largest is the maximum), got "
            f"{batch!r}"
        )
    top = max(sizes)
    if hi is not None and top > hi:
        raise ValueError(
            f"batch {top} exceeds the {what}'s batch range (up to {hi}): pass batch sizes <= {hi}, or re-export it "
            f"with a larger maximum batch"
        )
    return top, sorted({b for b in sizes if b > 1})


def plan_batching(
    batch: Sequence[int] | None = None,
    instances: int = 1,
    kind: str = "gpu",
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    limit: tuple[int, int] | None = None,
    opt: int | None = None,
    what: str = "model",
) -> Batching:
    """Check the serving arguments every entry and ``vit-fast serve`` take, and plan them (see :func:`batch_plan`)."""
    check_instances(instances, kind)
    check_queue_delay(queue_delay_us)
    top, preferred = batch_plan(batch, limit, opt, what)
    return Batching(top, tuple(preferred), queue_delay_us, instances, kind)


# --------------------------------------------------------------------------- reading artifacts
def onnx_specs(path: Path, layout: str | None = None) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX graph whose dim 0 is a symbolic batch: float tensors, and uint8 pixels
    for an input (a preprocessing front; ``layout``, from the artifact's metadata, is stated for them)."""
    import onnx

    from vit_fast.util.dtypes import ONNX_ELEM_TYPES

    from .runners import INPUT_ELEM_TYPES

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
    """Inputs, outputs and the batch profile (min, opt, max) of a vit-fast TensorRT engine, from its metadata.

    The input and its shape come from the recorded optimization profile (uint8 pixels, in their recorded
    layout, for a graph with a preprocessing front); the outputs' names and dims from the ONNX file the
    engine was built from when it lies beside the engine (looked up by its name only: the path recorded at
    build time is never followed), else from the recorded outputs and model config.
    I/O dtypes: a strongly typed engine keeps its ONNX file's dtype, a weakly typed one fp32 I/O.
    """
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


# --------------------------------------------------------------------------- models and provenance
def model_io(model: nn.Module, dtype: torch.dtype) -> tuple[TensorSpec, TensorSpec]:
    """The input ``images [C, H, W]`` and output (``logits [num_classes]`` or ``features [D]``) of a
    :class:`vit_fast.VisionTransformer` served in ``dtype`` (batch dimension excluded)."""
    cfg = model.cfg
    h, w = cfg.img_hw
    if cfg.num_classes:
        output = TensorSpec("logits", dtype, (cfg.num_classes,))
    else:
        output = TensorSpec("features", dtype, (cfg.embed_dim,))
    return TensorSpec(INPUT_NAME, dtype, (cfg.in_chans, h, w)), output


def provenance_comments(source: str, verification: dict[str, Any] | str | None) -> list[str]:
    """The comment lines that open a config.pbtxt: who wrote it, from what, and how it was verified
    (a verification record, a sentence, or None for none)."""
    lines = [
        f"written by vit-fast {vit_fast_version()} (commit {git_commit()}) on {time.strftime('%Y-%m-%d')}",
        f"source: {source}",
    ]
    if verification is None:
        lines.append("verification: none (not verified; see verification.json)")
    elif isinstance(verification, str):
        lines.append(f"verification: {verification}")
    else:
        worst = verification.get("worst_ratio")
        ratio = f", worst error/bound {worst:.3g}" if isinstance(worst, (int, float)) else ""
        state = "PASSED" if verification.get("passed") else "FAILED"
        lines.append(f"verification: {state} against eager PyTorch{ratio} ({verification.get('runtime', '?')})")
    return lines


def dtype_of(config_type: str) -> torch.dtype:
    """torch dtype for a Triton ``TYPE_*`` name (the inverse of :data:`TRITON_TYPES`)."""
    for dtype, name in TRITON_TYPES.items():
        if name == config_type:
            return dtype
    raise ValueError(
        f"no torch dtype for Triton data type {config_type!r}; vit-fast serves {list(TRITON_TYPES.values())}"
    )


__all__ = [
    "Batching",
    "DEFAULT_BATCH",
    "DEFAULT_QUEUE_DELAY_US",
    "EntryConfig",
    "INPUT_NAME",
    "KINDS",
    "MODEL_FILES",
    "PLATFORMS",
    "TRITON_TYPES",
    "TensorSpec",
    "VERSION",
    "batch_plan",
    "check_instances",
    "check_model_name",
    "check_queue_delay",
    "dtype_of",
    "engine_specs",
    "input_layout",
    "machine_kind",
    "model_io",
    "model_name_for",
    "onnx_specs",
    "parse_batch_sizes",
    "plan_batching",
    "provenance_comments",
]
