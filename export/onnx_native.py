"""ONNX export of a native-resolution tower (timm ``NaFlexVit``, transformers ``Siglip2VisionModel``; the graph and
what it takes: :mod:`.native`), reached through :func:`vit_fast.export.to_onnx`. The same house rules as the plain
exporter: every output path checked before any work, the file staged beside its target, verified there (at three
image-size mixes by default, :mod:`.verify_native`) and published with its metadata only once it passed."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.util.dtypes import DTYPE_NAMES, parse_dtype
from vit_fast.util.files import publish_to, staging_dir
from vit_fast.util.progress import Stages

from ._common import (
    ExportError,
    check_artifact_outputs,
    check_batch_range,
    check_report_path,
    metadata_path,
)
from .native import (
    INPUTS,
    NativeGraph,
    check_native_outputs,
    example_batch,
    grid_of,
    max_grid_of,
    native_family,
    native_refusal,
    patch_size,
    plain_copy,
    transformers_checks_off,
)
from .onnx_checks import (
    MIN_OPSET,
    TORCHSCRIPT_MAX_OPSET,
    OnnxOptions,
    newest_opset,
    onnx_metadata,
    save_graph,
    symbolic_dims,
    trace_errors,
    write_metadata,
)
from .verify import record_verification, verify_options
from .verify_native import check_mixes, verify_native

#: the most tokens (patches) an image of an exported graph may have, the token axis's upper bound for torch.export
MAX_TOKENS = 16384


def _describe(model: nn.Module) -> str:
    p, (gh, gw) = patch_size(model), grid_of(model)
    return f"{type(model).__name__}(patch={p}, position table {gh}x{gw})"


def _config(model: nn.Module) -> dict[str, Any]:
    """What the metadata records of the architecture."""
    family = native_family(model)
    if family == "naflexvit":
        return {
            "architecture": getattr(model, "pretrained_cfg", {}).get("architecture", type(model).__name__),
            "embed_dim": int(model.embed_dim),
            "depth": len(model.blocks),
            "num_classes": int(model.num_classes),
            "patch_size": patch_size(model),
            "pos_embed_grid": list(grid_of(model)),
        }
    cfg = model.config
    return {
        "architecture": "Siglip2VisionModel",
        "embed_dim": int(cfg.hidden_size),
        "depth": int(cfg.num_hidden_layers),
        "num_classes": 0,
        "patch_size": int(cfg.patch_size),
        "pos_embed_grid": list(grid_of(model)),
    }


def check_native_args(
    model: nn.Module,
    exporter: str,
    attention: str,
    preprocess: Any,
    input_name: str | None,
    max_grid: Any,
) -> None:
    """The plain exporter's options a native-resolution graph does not take, and the model refused by name."""
    reason = native_refusal(model, exporter)
    if reason is not None:
        raise ValueError(f"to_onnx refuses {reason}")
    if attention != "decomposed":
        raise ValueError(f"attention={attention!r}: a {type(model).__name__} graph is exported with its own attention")
    if preprocess is not None:
        raise ValueError(f"preprocess=: a {type(model).__name__} graph takes packed patches, not uint8 images")
    if input_name not in (None, "images"):
        raise ValueError(
            f"input_name=: a {type(model).__name__} graph has three inputs, named {INPUTS[native_family(model)]}"
        )
    if max_grid is not None and (
        isinstance(max_grid, bool) or not isinstance(max_grid, int) or not 1 <= max_grid <= 512
    ):
        raise ValueError(f"max_grid is the largest image side in patches, an int from 1 to 512; got {max_grid!r}")


def _trace(
    exporter: str,
    graph: NativeGraph,
    inputs: tuple[torch.Tensor, ...],
    out: Path,
    opset: int,
    batch: tuple[int, int],
    names: Sequence[str],
    output_names: Sequence[str],
) -> None:
    family = graph.family
    quiet = [("ignore", DeprecationWarning, "")]
    if exporter == "torchscript":  # a NaFlexVit only (native_refusal): every axis named, the outputs' too
        axes = {"batch": 0, "tokens": 1}
        dynamic = {name: {v: k for k, v in axes.items()} for name in names}
        dynamic |= {
            name: ({0: "batch", 1: "out_tokens"} if kind == "last_hidden_state" else {0: "batch"})
            for kind, name in zip(graph.outputs, output_names, strict=True)
        }
        how: dict[str, Any] = dict(dynamo=False, dynamic_axes=dynamic, do_constant_folding=True)
        # the gathers' indices are never negative (rows and columns of the resized table)
        quiet += [("ignore", torch.jit.TracerWarning, ""), ("ignore", Warning, "Exporting aten::index operator of")]
        checks: contextlib.AbstractContextManager = contextlib.nullcontext()
    else:
        b = torch.export.Dim("batch", min=1, max=max(3, batch[1]))  # the example holds 3 images
        t = torch.export.Dim("tokens", min=1, max=MAX_TOKENS)
        third = {0: b, 1: t} if family == "naflexvit" else {0: b}  # patch_valid [B, T]; spatial_shapes [B, 2]
        how = dict(dynamo=True, dynamic_shapes=({0: b, 1: t}, {0: b, 1: t}, third), verbose=False)
        # batch and tokens are shared by the inputs
        quiet += [("ignore", FutureWarning, ""), ("ignore", Warning, "# The axis name")]
        checks = transformers_checks_off()
    with warnings.catch_warnings(), checks:
        for action, category, message in quiet:
            warnings.filterwarnings(action, message=message, category=category)
        torch.onnx.export(
            graph,
            inputs,
            str(out),
            opset_version=opset,
            input_names=list(names),
            output_names=list(output_names),
            **how,
        )


def _finish(traced: Path, tmp: Path, path: Path, meta: dict[str, Any], family: str) -> list[Path]:
    """Check that every input is symbolic in batch (and tokens), add the metadata, save under the final name."""
    import onnx

    proto = onnx.load(str(traced))
    for value in proto.graph.input:
        symbolic = symbolic_dims(value)
        want = [True] if (family == "siglip2" and value.name == "spatial_shapes") else [True, True]
        if symbolic[: len(want)] != want:
            raise ExportError(
                f"the exported graph's input {value.name!r} is not dynamic in batch and tokens: "
                f"{value.type.tensor_type.shape}"
            )
    return save_graph(proto, tmp, path, meta)


def native_to_onnx(model: nn.Module, path: str | os.PathLike, options: OnnxOptions) -> Path:
    """:func:`vit_fast.export.to_onnx` for a native-resolution model, the builder
    :func:`vit_fast.export.onnx.onnx_builder` picks for one; see docs/deploy.md."""
    o = options
    check_native_args(model, o.exporter, o.attention, o.preprocess, o.input_name, o.max_grid)
    batch, dtype, opset, exporter, output_names = o.batch, o.dtype, o.opset, o.exporter, o.output_names
    family = native_family(model)
    max_grid = max_grid_of(model, o.max_grid)
    batch = check_batch_range(batch, ("min", "max"))
    dtype = parse_dtype(dtype)
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"a {type(model).__name__} exports in fp32 or fp16, got {DTYPE_NAMES[dtype]}")
    opset = 18 if opset is None else opset
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= newest_opset():
        raise ValueError(f"opset must be an int from {MIN_OPSET} to {newest_opset()}, got {opset!r}")
    if exporter == "torchscript" and opset > TORCHSCRIPT_MAX_OPSET:
        raise ValueError(f"the TorchScript exporter supports opset <= {TORCHSCRIPT_MAX_OPSET}, got {opset}")
    kinds = check_native_outputs(model, o.outputs)
    names = (
        kinds if output_names is None else ((output_names,) if isinstance(output_names, str) else tuple(output_names))
    )
    if len(names) != len(kinds) or len(set(names)) != len(names) or set(names) & set(INPUTS[family]):
        raise ValueError(f"output_names {names} must give one new name for each of the outputs {kinds}")
    verify_with = verify_options(o.verify, o.report)
    if verify_with is not None:
        if verify_with.batches is not None or verify_with.image_sizes is not None:
            raise ValueError(
                f"a {type(model).__name__} is verified at image-size mixes: give VerifyOptions(size_mixes=...), not "
                "batches or image_sizes"
            )
        mixes = check_mixes(model, verify_with.size_mixes, max_grid)
        if max(len(m) for m in mixes) > batch[1]:
            raise ValueError(f"a size mix of {max(len(m) for m in mixes)} images is past the batch range {batch}")
    path = check_artifact_outputs(path, "onnx", o.overwrite)
    report_path = check_report_path(o.report, o.overwrite, artifact=path) if o.report is not None else None
    import onnx  # noqa: F401  (fail early and clearly where the onnx extra is missing)

    stages = Stages("vit-fast export", o.progress)
    graph = NativeGraph(plain_copy(model, dtype, max_grid), kinds)
    p = patch_size(model)
    # three images of different sizes, padded: nothing the trace could take for a constant
    example = example_batch(model, [(p, p), (4 * p, 3 * p), (3 * p, 3 * p)], dtype, torch.Generator().manual_seed(0))
    meta = onnx_metadata(model, exporter, opset, dtype, batch, kinds, names, o.source) | {
        "family": family,
        "config": _config(model),
        "tokens": [1, MAX_TOKENS],
        "max_grid": max_grid if family == "naflexvit" else None,
        "dynamic_size": True,
        "inputs": list(INPUTS[family]),
        "input": INPUTS[family][0],
    }
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(staging_dir(path))
        traced = tmp / path.name
        what = f"tracing {_describe(model)} with the {exporter} exporter (opset {opset}, {DTYPE_NAMES[dtype]})"
        with stages.step(what), trace_errors(exporter, _describe(model), path), torch.no_grad():
            _trace(exporter, graph, example, traced, opset=opset, batch=batch, names=INPUTS[family], output_names=names)
        del graph
        with stages.step("checking the graph and writing metadata"):
            staged = _finish(traced, tmp, path, meta, family)
        moves = [(f, path.parent / f.name) for f in staged]
        if verify_with is not None:
            with stages.step(f"verifying {path.name} against eager PyTorch on ONNX Runtime at {len(mixes)} size mixes"):
                result = verify_native(
                    model,
                    traced,
                    mixes,
                    seed=verify_with.seed,
                    provider=verify_with.provider,
                    print_table=verify_with.print_table,
                    artifact_name=str(path),
                )
            record_verification(stack, result, meta, lambda m: write_metadata(traced, m), report_path, moves)
        publish_to(moves)
    stages.note(f"wrote {path} and {metadata_path(path).name}" + ("" if verify_with is None else "; verified: True"))
    if verify_with is not None and verify_with.on_published is not None:
        verify_with.on_published(result)
    return path


__all__ = ["MAX_TOKENS", "check_native_args", "native_to_onnx"]
