"""What :func:`vit_fast.export.onnx.to_onnx` checks and records around the trace: its arguments before any work
(:func:`check_onnx_args`, :func:`check_graph_args` -> :class:`GraphSpec`), what a failed trace raised
(:func:`trace_errors`), the traced graph after it (:func:`finish_graph`, :func:`save_graph`), the metadata
(:func:`onnx_metadata`, :func:`write_metadata`) and :func:`onnx_op_counts`. The trace and the staging/publishing
live in ``onnx`` and ``onnx_native``."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.backend.env import git_commit
from vit_fast.util.dtypes import DTYPE_NAMES, parse_dtype
from vit_fast.util.files import OWNER_FILE, json_text, write_new
from vit_fast.util.interrupts import interrupt_behind
from vit_fast.util.text import plain_text

from ._common import (
    ExportError,
    check_batch_range,
    metadata_path,
    plain_model,
    vit_fast_version,
    weights_record,
)
from .graph import DEFAULT_INPUT_NAME, check_io_names, check_outputs, check_preprocess, image_axes

EXPORTERS = ("dynamo", "torchscript")
ATTENTION = ("decomposed", "fused")
MIN_OPSET = 17  # LayerNormalization
FUSED_ATTENTION_OPSET = 23  # Attention
TORCHSCRIPT_MAX_OPSET = 20
METADATA_PROP = "vit_fast"  # metadata_props key holding the whole metadata as JSON


@dataclass(frozen=True)
class OnnxOptions:
    """:func:`vit_fast.export.to_onnx`'s options, as given (each one: docs/deploy.md, section The Python API);
    ``to_onnx`` hands them to the one builder it picks for the model's kind."""

    batch: tuple[int, int] = (1, 64)
    dtype: torch.dtype | str = torch.float32
    opset: int | None = None
    exporter: str = "dynamo"
    dynamic_size: bool = False
    attention: str = "decomposed"
    source: str | None = None
    progress: bool = True
    outputs: str | Sequence[str] | None = None
    input_name: str = DEFAULT_INPUT_NAME
    output_names: str | Sequence[str] | None = None
    preprocess: dict[str, Any] | None = None
    verify: Any = True  # bool or VerifyOptions
    report: str | os.PathLike | None = None
    overwrite: bool = False
    max_grid: int | None = None


def newest_opset() -> int:
    """The newest opset both torch's exporter and the installed onnx package support."""
    newest = 23
    try:
        from torch.onnx import _constants

        newest = int(getattr(_constants, "ONNX_MAX_OPSET", newest))
    except ImportError:
        pass
    try:
        import onnx

        newest = min(newest, int(onnx.defs.onnx_opset_version()))
    except ImportError:  # checked later with the extra's install hint
        pass
    return newest


def check_onnx_args(
    model: Any, batch: Any, dtype: Any, opset: Any, exporter: Any, dynamic_size: Any, attention: Any
) -> tuple[tuple[int, int], torch.dtype, int]:
    """Validate :func:`to_onnx`'s arguments before any work; returns (batch, dtype, opset)."""
    plain_model(model, "to_onnx")
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    if not isinstance(dynamic_size, bool):
        raise ValueError(f"dynamic_size must be True or False, got {dynamic_size!r}")
    batch = check_batch_range(batch, ("min", "max"))
    dtype = parse_dtype(dtype)
    if opset is None:
        opset = FUSED_ATTENTION_OPSET if attention == "fused" else 18
    if isinstance(opset, bool) or not isinstance(opset, int):
        raise ValueError(f"opset must be an int, got {opset!r}")
    if opset < MIN_OPSET:
        raise ValueError(f"opset {opset} is too old: need >= {MIN_OPSET} so each LayerNorm is one LayerNormalization")
    if attention == "fused" and exporter != "dynamo":
        raise ValueError(
            "attention='fused' needs exporter='dynamo': the fused route is the ONNX Attention op (opset 23), "
            f"and the TorchScript exporter stops at opset {TORCHSCRIPT_MAX_OPSET}"
        )
    if attention == "fused" and opset < FUSED_ATTENTION_OPSET:
        raise ValueError(
            f"attention='fused' needs opset >= {FUSED_ATTENTION_OPSET} (the ONNX Attention op), got opset {opset}: "
            f"pass opset={FUSED_ATTENTION_OPSET} or leave opset unset"
        )
    newest = newest_opset()
    if opset > newest:
        raise ValueError(
            f"opset {opset} is newer than this torch.onnx exporter and onnx can write (at most {newest}): "
            f"pass --opset {newest} or lower, or leave it unset (18)"
        )
    if exporter == "torchscript" and opset > TORCHSCRIPT_MAX_OPSET:
        raise ValueError(
            f"the TorchScript exporter supports opset <= {TORCHSCRIPT_MAX_OPSET}, got {opset}: use exporter='dynamo'"
        )
    return batch, dtype, opset


@dataclass(frozen=True)
class GraphSpec:
    """What the exported graph takes and returns: output kinds, I/O names, the preprocessing front."""

    outputs: tuple[str, ...]
    input_name: str
    output_names: tuple[str, ...]
    preprocess: dict[str, Any] | None


def check_graph_args(cfg: Any, outputs: Any, input_name: Any, output_names: Any, preprocess: Any) -> GraphSpec:
    """Validate :func:`to_onnx`'s graph arguments against the model config ``cfg``, before any work."""
    kinds = check_outputs(outputs, cfg.num_classes)
    name, names = check_io_names(input_name, output_names, kinds)
    return GraphSpec(kinds, name, names, check_preprocess(preprocess, cfg.in_chans))


def symbolic_dims(value_info: Any) -> list[bool]:
    """Per axis of a graph input: whether it is symbolic (named, with no fixed value)."""
    return [bool(d.dim_param) and not d.HasField("dim_value") for d in value_info.type.tensor_type.shape.dim]


def verifies_on_cpu(provider: str | None) -> bool:
    """Whether verification would run on ONNX Runtime's CPU provider."""
    if provider is not None:
        return provider == "CPUExecutionProvider"
    try:
        import onnxruntime as ort
    except ImportError:
        return True
    return "CUDAExecutionProvider" not in ort.get_available_providers()


def _props(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """The ONNX ``metadata_props`` vit-fast writes: the whole record, and its main fields on their own."""
    return [
        (METADATA_PROP, json.dumps(meta, sort_keys=True)),
        ("vit_fast.config", json.dumps(meta["config"], sort_keys=True)),
        ("vit_fast.dtype", meta["dtype"]),
        ("vit_fast.batch", json.dumps(meta["batch"])),
        ("vit_fast.exporter", meta["exporter"]),
        ("vit_fast.opset", str(meta["opset"])),
        ("vit_fast.version", meta["vit_fast_version"]),
        ("vit_fast.git_commit", meta["git_commit"]),
        ("vit_fast.weights", meta["weights"]["description"]),
        ("vit_fast.verified", json.dumps(bool(meta["verification"] and meta["verification"]["passed"]))),
    ]


def set_props(proto: Any, meta: dict[str, Any]) -> None:
    """Replace ``proto``'s ONNX metadata props with ``meta``'s, each value as the string an ONNX prop holds."""
    del proto.metadata_props[:]
    for key, value in _props(meta):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value


@contextlib.contextmanager
def trace_errors(exporter: str, described: str, path: Path, hint: str = "") -> Iterator[None]:
    """What the trace of ``described`` (a model) raises, as an :class:`ExportError` naming the exporter and the
    first line of its error, ``hint`` after it; a failed write (a full disk, a vanished folder: not the exporter's
    fault) names the folder of ``path`` and gets no hint."""
    try:
        yield
    except OSError as err:
        raise ExportError(f"cannot write the traced graph beside {str(path)!r}: {err.strerror or err}") from err
    except Exception as err:
        if (interrupt := interrupt_behind(err)) is not None:  # Ctrl-C the exporter reported as its own failure
            raise interrupt from err
        text = plain_text(str(err)).strip()
        first = text.splitlines()[0] if text else type(err).__name__
        raise ExportError(
            f"the {exporter} exporter could not trace {described}: {type(err).__name__}: {first}{hint}"
        ) from err


def onnx_metadata(
    model: nn.Module,
    exporter: str,
    opset: int,
    dtype: torch.dtype,
    batch: Sequence[int],
    outputs: Sequence[str],
    output_names: Sequence[str],
    source: str | None,
) -> dict[str, Any]:
    """The fields every ONNX file's metadata holds: how it was traced, its dtype and batch range, its outputs
    (kinds, names, the first name), the model's source and weights, the verification (None until recorded) and
    the versions and commit that wrote it."""
    return {
        "format": "onnx",
        "exporter": exporter,
        "opset": opset,
        "dtype": DTYPE_NAMES[dtype],
        "batch": list(batch),
        "outputs": list(outputs),
        "output_names": list(output_names),
        "output": output_names[0],
        "source": source,
        "weights": weights_record(model),
        "verification": None,
        "vit_fast_version": vit_fast_version(),
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
    }


def write_metadata(staged: Path, meta: dict[str, Any]) -> None:
    """Rewrite a staged ONNX file's metadata props and the JSON beside it with ``meta`` (the graph and any
    external data are left as they are)."""
    import onnx

    proto = onnx.load(str(staged), load_external_data=False)
    set_props(proto, meta)
    onnx.save_model(proto, str(staged))
    write_new(metadata_path(staged), json_text(meta), replace=True)


def finish_graph(
    traced: Path,
    tmp: Path,
    path: Path,
    meta: dict[str, Any],
    external: bool,
    dynamic_size: bool,
    attention: str,
    depth: int,
    spec: GraphSpec,
) -> list[Path]:
    """Check the traced graph, add metadata, save it under its final name in ``tmp``; return files to move."""
    import onnx

    proto = onnx.load(str(traced))  # external data, if any, is read in too
    graph_input = proto.graph.input[0]
    symbolic = symbolic_dims(graph_input)
    _, h_axis, w_axis = image_axes(spec.preprocess)
    if not symbolic or not symbolic[0]:
        raise ExportError(
            f"the exported graph's input {graph_input.name!r} has a fixed batch dimension "
            f"({graph_input.type.tensor_type.shape}); expected a symbolic one"
        )
    if dynamic_size and not (symbolic[h_axis] and symbolic[w_axis]):
        raise ExportError(f"dynamic_size=True, but the exported graph's height/width are fixed: {symbolic}")
    names = [o.name for o in proto.graph.output]
    if graph_input.name != spec.input_name or names != list(spec.output_names):
        raise ExportError(
            f"the exported graph's I/O is {graph_input.name!r} -> {names}, expected {spec.input_name!r} -> "
            f"{list(spec.output_names)}"
        )
    fused = sum(n.op_type == "Attention" for n in proto.graph.node)
    if attention == "fused" and fused != depth:
        raise ExportError(f"expected {depth} fused Attention nodes, found {fused}")
    return save_graph(proto, tmp, path, meta, external)


def save_graph(proto: Any, tmp: Path, path: Path, meta: dict[str, Any], external: bool = False) -> list[Path]:
    """Save a checked graph ``proto`` and its metadata in the staging folder ``tmp`` under ``path``'s name, in place
    of the exporter's own files: ``meta`` gains the graph's op counts (and its external data file, ``external``) and
    goes into the graph's props and the JSON beside it. Returns the files to move."""
    import onnx

    ops = [n.op_type for n in proto.graph.node]
    meta["op_counts"] = {op: ops.count(op) for op in sorted(set(ops))}
    if external:  # recorded before the props are written, so the file and the JSON beside it agree
        meta["external_data"] = path.name + ".data"
    set_props(proto, meta)
    proto.producer_name, proto.doc_string = "vit-fast", f"vit-fast {meta['vit_fast_version']} ({meta['exporter']})"
    for f in tmp.iterdir():  # the exporter's own files are replaced by ours (the run's lock file stays)
        if f.name != OWNER_FILE:
            f.unlink()
    out = tmp / path.name
    files = []
    if external:
        data_name = path.name + ".data"
        onnx.save_model(proto, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location=data_name)
        files.append(tmp / data_name)
    else:
        onnx.save_model(proto, str(out))
    onnx.checker.check_model(str(out))
    meta_file = metadata_path(out)
    write_new(meta_file, json_text(meta))
    return [*files, out, meta_file]


def onnx_op_counts(path: str | os.PathLike) -> dict[str, int]:
    """``{op_type: count}`` of an ONNX file's top-level graph (domain-qualified for non-default domains)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    counts: dict[str, int] = {}
    for node in proto.graph.node:
        key = f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        counts[key] = counts.get(key, 0) + 1
    return counts


__all__ = [
    "ATTENTION",
    "EXPORTERS",
    "FUSED_ATTENTION_OPSET",
    "METADATA_PROP",
    "MIN_OPSET",
    "TORCHSCRIPT_MAX_OPSET",
    "GraphSpec",
    "OnnxOptions",
    "check_graph_args",
    "check_onnx_args",
    "finish_graph",
    "onnx_metadata",
    "onnx_op_counts",
    "save_graph",
    "symbolic_dims",
    "trace_errors",
    "verifies_on_cpu",
    "write_metadata",
]
