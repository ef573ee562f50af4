"""The ``config.pbtxt`` model of a Triton model folder, apart from writing any files: its tensors
(:class:`TensorSpec`), batching and placement (:class:`Batching`), the whole config (:class:`EntryConfig`,
rendered by ``to_pbtxt``), the tensors of a ViT (:func:`model_io`) and the provenance comments that open it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vit_fast.backend.env import git_commit
from vit_fast.export._common import vit_fast_version
from vit_fast.export.formats import FORMATS

#: torch dtype -> Triton model-config data type (uint8: the pixels an artifact with a preprocessing front takes)
TRITON_TYPES: dict[torch.dtype, str] = {
    torch.float32: "TYPE_FP32",
    torch.float16: "TYPE_FP16",
    torch.bfloat16: "TYPE_BF16",
    torch.uint8: "TYPE_UINT8",
}
#: the suffixes of the artifacts a repository serves, from the export formats' registry
ONNX_SUFFIXES, ENGINE_SUFFIXES = FORMATS["onnx"].suffixes, FORMATS["tensorrt"].suffixes
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
