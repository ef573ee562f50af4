"""ONNX export of a :class:`vit_fast.VisionTransformer`: the torch backend traced in ``graph.ExportGraph`` with a
symbolic batch (and with ``dynamic_size=True`` symbolic height and width), the metadata in the model and beside it,
every file staged, verified and moved into place only when all of it succeeded. Argument and graph checks and the
metadata live in ``onnx_checks``; the routes (fused attention, dynamic size, bf16): docs/development.md, "ONNX
export"."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit_fast.util.dtypes import DTYPE_NAMES
from vit_fast.util.files import publish_to, staging_dir
from vit_fast.util.progress import Stages

from ._common import (
    check_artifact_outputs,
    check_report_path,
    metadata_path,
    plain_model,
)
from .graph import DEFAULT_INPUT_NAME, ExportGraph, example_images, image_axes
from .native import native_family
from .onnx_checks import (
    GraphSpec,
    OnnxOptions,
    check_graph_args,
    check_onnx_args,
    finish_graph,
    onnx_metadata,
    onnx_op_counts,
    trace_errors,
    verifies_on_cpu,
    write_metadata,
)
from .onnx_native import native_to_onnx
from .verify import VerifyOptions, record_verification, verify_options, verify_staged

# single-file protobufs must stay below 2 GiB; larger weights go to external data beside the model
_EXTERNAL_DATA_BYTES = 1_800_000_000


class FusedAttention(nn.Module):
    """Export stand-in for :class:`vit_fast.model.layers.Attention`: the same parameters and math, with the
    core written as ``scaled_dot_product_attention`` so the exporter emits one ONNX ``Attention``."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.qkv, self.proj = attn.qkv, attn.proj
        self.num_heads, self.head_dim, self.scale = attn.num_heads, attn.head_dim, attn.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, scale=self.scale)  # [B, H, T, Dh]
        return self.proj(x.transpose(1, 2).reshape(B, T, D))


def _describe(model: nn.Module) -> str:
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return type(model).__name__
    h, w = cfg.img_hw
    return (
        f"{type(model).__name__}(depth={cfg.depth}, embed_dim={cfg.embed_dim}, heads={cfg.num_heads}, "
        f"img={h}x{w}, patch={cfg.patch_size}, tokens={cfg.num_tokens})"
    )


def _export_copy(
    model: nn.Module, dtype: torch.dtype, dynamic_size: bool, attention: str, spec: GraphSpec
) -> ExportGraph:
    """The graph to trace: a CPU copy of the model on the torch backend, in eval mode and ``dtype``, wrapped
    with the outputs and preprocessing of ``spec``; the caller's model is untouched."""
    m = copy.deepcopy(model).cpu().to(dtype).eval()
    m.set_backend("torch")
    if dynamic_size and not m.cfg.dynamic_img_size:
        m.cfg = m.cfg.replace(dynamic_img_size=True)
    if attention == "fused":
        for block in m.blocks:
            block.attn = FusedAttention(block.attn)
    graph = ExportGraph(m, spec.outputs, spec.preprocess).to(dtype).eval()
    for p in graph.parameters():
        p.requires_grad_(False)
    return graph


def _example_input(
    cfg: Any, batch: tuple[int, int], dynamic_size: bool, dtype: torch.dtype, spec: GraphSpec
) -> torch.Tensor:
    trace_batch = min(max(2, batch[0]), max(2, batch[1]))  # >= 2, so no exporter specialises the batch to 1
    h, w = cfg.img_hw
    if dynamic_size:  # off the native grid, so the traced graph keeps the position-embedding resize
        h, w = h + cfg.patch_size, w + 2 * cfg.patch_size
    gen = torch.Generator().manual_seed(0)
    return example_images(trace_batch, cfg.in_chans, h, w, dtype, spec.preprocess, gen)


#: torch's dynamo exporter logs a warning per torchvision detection op it cannot register when torchvision is
#: missing (nms, roi_align, roi_pool, deform_conv2d): nothing a ViT uses, so it is silenced while we export
_REGISTRATION_LOGGER = "torch.onnx._internal.exporter._registration"


@contextlib.contextmanager
def _quiet_registration() -> Iterator[None]:
    logger = logging.getLogger(_REGISTRATION_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run_exporter(
    m: ExportGraph, x: torch.Tensor, out: Path, options: OnnxOptions, spec: GraphSpec, external_data: bool
) -> None:
    """Trace ``m`` on ``x`` into ``out`` with the exporter, opset, batch range and dynamic size of ``options``
    (already checked)."""
    exporter, opset, batch, dynamic_size = options.exporter, options.opset, options.batch, options.dynamic_size
    _, h_axis, w_axis = image_axes(spec.preprocess)
    cfg = m.model.cfg
    with warnings.catch_warnings(), _quiet_registration():  # chatter that says nothing about this model
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        p = cfg.patch_size
        if exporter == "dynamo":
            dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1, max=max(2, batch[1]))}
            if dynamic_size:
                gh, gw = cfg.grid_size
                dims[h_axis] = p * torch.export.Dim("grid_h", min=1, max=max(64, 4 * gh))
                dims[w_axis] = p * torch.export.Dim("grid_w", min=1, max=max(64, 4 * gw))
            how = dict(dynamo=True, dynamic_shapes=(dims,), external_data=external_data, verbose=False)
            symbolics: contextlib.AbstractContextManager = contextlib.nullcontext()
        else:
            axes = {0: "batch", h_axis: "height", w_axis: "width"} if dynamic_size else {0: "batch"}
            out_axes = {
                name: ({0: "batch", 1: "tokens"} if kind == "last_hidden_state" and dynamic_size else {0: "batch"})
                for kind, name in zip(spec.outputs, spec.output_names, strict=True)
            }
            how = dict(dynamo=False, dynamic_axes={spec.input_name: axes, **out_axes}, do_constant_folding=True)
            symbolics = _bicubic_aa_symbolic(opset)
        with symbolics:
            torch.onnx.export(
                m,
                (x,),
                str(out),
                opset_version=opset,
                input_names=[spec.input_name],
                output_names=list(spec.output_names),
                **how,
            )


def _resize_bicubic_aa(g: Any, x: Any, output_size: Any, align_corners: Any, *scales: Any) -> Any:
    """TorchScript-exporter symbolic for ``aten::_upsample_bicubic2d_aa``: ONNX Resize with PyTorch's
    antialiased-bicubic semantics (a = -0.5, excluding outside taps), sizes possibly symbolic."""
    from torch.onnx import symbolic_helper as sh

    shape = g.op("Shape", x)
    batch_channels = g.op(
        "Slice", shape, g.op("Constant", value_t=torch.tensor([0])), g.op("Constant", value_t=torch.tensor([2]))
    )
    size = sh._maybe_get_const(output_size, "is")
    if sh._is_value(size):
        hw = g.op("Cast", output_size, to_i=7)  # INT64
    else:
        hw = g.op("Constant", value_t=torch.tensor(size, dtype=torch.int64))
    empty = g.op("Constant", value_t=torch.tensor([], dtype=torch.float32))
    corners = bool(sh._maybe_get_const(align_corners, "b"))
    return g.op(
        "Resize",
        x,
        empty,
        empty,
        g.op("Concat", batch_channels, hw, axis_i=0),
        mode_s="cubic",
        cubic_coeff_a_f=-0.5,
        exclude_outside_i=1,
        antialias_i=1,
        coordinate_transformation_mode_s="align_corners" if corners else "half_pixel",
    )


@contextlib.contextmanager
def _bicubic_aa_symbolic(opset: int) -> Iterator[None]:
    name = "aten::_upsample_bicubic2d_aa"
    torch.onnx.register_custom_op_symbolic(name, _resize_bicubic_aa, opset)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic(name, opset)


def to_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    batch: tuple[int, int] = (1, 64),
    dtype: torch.dtype | str = torch.float32,
    opset: int | None = None,
    exporter: str = "dynamo",
    dynamic_size: bool = False,
    attention: str = "decomposed",
    source: str | None = None,
    progress: bool = True,
    *,
    outputs: str | Sequence[str] | None = None,
    input_name: str = DEFAULT_INPUT_NAME,
    output_names: str | Sequence[str] | None = None,
    preprocess: dict[str, Any] | None = None,
    verify: bool | VerifyOptions = True,
    report: str | os.PathLike | None = None,
    overwrite: bool = False,
    max_grid: int | None = None,
) -> Path:
    """Export ``model`` (a :class:`vit_fast.VisionTransformer`, a subclass with ``as_vit_fast()``, or a transformers
    ViT converted with ``vit_fast.from_hf``) to an ONNX file at ``path``, verified on ONNX Runtime before anything is
    published (on by default); returns ``path``. Raises ValueError / TypeError for bad arguments before any work,
    :class:`VerificationError` (nothing published) and :class:`ExportError` when the exporter fails. Each argument,
    and native-resolution towers: docs/deploy.md, section The Python API."""
    options = OnnxOptions(
        batch=batch,
        dtype=dtype,
        opset=opset,
        exporter=exporter,
        dynamic_size=dynamic_size,
        attention=attention,
        source=source,
        progress=progress,
        outputs=outputs,
        input_name=input_name,
        output_names=output_names,
        preprocess=preprocess,
        verify=verify,
        report=report,
        overwrite=overwrite,
        max_grid=max_grid,
    )
    return onnx_builder(model)(model, path, options)


def onnx_builder(model: nn.Module) -> Callable[[nn.Module, str | os.PathLike, OnnxOptions], Path]:
    """The one choice of graph: a native-resolution tower's own (:func:`.onnx_native.native_to_onnx`) for timm's
    NaFlexVit and transformers' Siglip2VisionModel, else the plain ViT's (:func:`plain_to_onnx`)."""
    return native_to_onnx if native_family(model) is not None else plain_to_onnx


def plain_to_onnx(model: nn.Module, path: str | os.PathLike, options: OnnxOptions) -> Path:
    """:func:`to_onnx` for a plain ViT (or one ``plain_model`` converts)."""
    o = options
    batch, dtype, opset = check_onnx_args(model, o.batch, o.dtype, o.opset, o.exporter, o.dynamic_size, o.attention)
    model = plain_model(model, "to_onnx")
    cfg = model.cfg
    spec = check_graph_args(cfg, o.outputs, o.input_name, o.output_names, o.preprocess)
    verify_with = verify_options(o.verify, o.report, batch_range=batch)
    if verify_with is not None and dtype == torch.bfloat16 and verifies_on_cpu(verify_with.provider):
        raise ValueError(
            "bf16 ONNX files cannot be verified on ONNX Runtime's CPU provider (no bf16 Conv, and its Python API "
            "has no bf16 arrays): export fp16 or fp32, or export without verification (verify=False; --no-verify "
            "on the command line) and verify the TensorRT engine built from it"
        )
    weight_bytes = sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()
    external = weight_bytes > _EXTERNAL_DATA_BYTES
    path = check_artifact_outputs(path, "onnx", o.overwrite, external_data=external)
    report_path = check_report_path(o.report, o.overwrite, artifact=path) if o.report is not None else None
    import onnx  # noqa: F401  (fail early and clearly where the onnx extra is missing)

    o = replace(o, batch=batch, dtype=dtype, opset=opset)
    stages = Stages("vit-fast export", o.progress)
    m = _export_copy(model, dtype, o.dynamic_size, o.attention, spec)
    x = _example_input(cfg, batch, o.dynamic_size, dtype, spec)
    meta = onnx_metadata(model, o.exporter, opset, dtype, batch, spec.outputs, spec.output_names, o.source) | {
        "config": cfg.to_dict() | ({"dynamic_img_size": True} if o.dynamic_size else {}),
        "dynamic_size": o.dynamic_size,
        "attention": o.attention,
        "input": spec.input_name,
        "input_dtype": "uint8" if spec.preprocess else DTYPE_NAMES[dtype],
        "input_layout": spec.preprocess["layout"] if spec.preprocess else "NCHW",
        "preprocess": spec.preprocess,
    }
    other = "torchscript" if o.exporter == "dynamo" else "dynamo"
    hint = f"; try exporter={other!r}" if o.attention != "fused" else ""
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(staging_dir(path))
        traced = tmp / path.name
        what = f"tracing {_describe(model)} with the {o.exporter} exporter (opset {opset}, {DTYPE_NAMES[dtype]})"
        with stages.step(what), trace_errors(o.exporter, _describe(model), path, hint), torch.no_grad():
            _run_exporter(m, x, traced, o, spec, external)
        del m
        with stages.step("checking the graph and writing metadata"):
            staged = finish_graph(traced, tmp, path, meta, external, o.dynamic_size, o.attention, cfg.depth, spec)
        moves = [(f, path.parent / f.name) for f in staged]
        if verify_with is not None:
            with stages.step(f"verifying {path.name} against eager PyTorch on ONNX Runtime"):
                result = verify_staged(model, traced, verify_with, path)
            record_verification(stack, result, meta, lambda m: write_metadata(traced, m), report_path, moves)
        publish_to(moves)
    written = f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) and {metadata_path(path).name}"
    stages.note(written + ("" if verify_with is None else f"; verified: {meta['verification']['passed']}"))
    if verify_with is not None and verify_with.on_published is not None:
        verify_with.on_published(result)
    return path


__all__ = [
    "FusedAttention",
    "OnnxOptions",
    "check_onnx_args",
    "onnx_builder",
    "onnx_op_counts",
    "plain_to_onnx",
    "to_onnx",
]
