"""ONNX export of a :class:`vit_fast.VisionTransformer`.

The torch backend is traced (on a CPU copy of the model, in eval mode), the batch dimension is
symbolic, each LayerNorm is one ``LayerNormalization`` node (opset >= 17), and the metadata goes
both into the model's ``metadata_props`` and into a JSON file beside it. Files are staged in a
private folder beside the target and moved into place only when everything succeeded.

Routes, as measured with torch 2.13 / onnxruntime 1.31 (CPU):

- ``attention="fused"``: every attention block becomes one ONNX ``Attention`` node (opset 23;
  the module is traced through ``F.scaled_dot_product_attention``, which the dynamo exporter
  maps to that op). ONNX Runtime's CPU provider runs it. onnxruntime's transformer optimizer
  (``model_type="vit"``) fuses no attention in our graphs, so it is not used.
- ``dynamic_size=True``: height and width are symbolic; the position embedding is resampled in
  the graph by ``Resize`` (cubic, a=-0.5, antialias=1, exclude_outside=1, opset 18: PyTorch's
  antialiased bicubic), which ONNX Runtime runs. The dynamo exporter emits it by itself; for the
  TorchScript exporter, which has no symbolic for ``aten::_upsample_bicubic2d_aa``, one is
  registered for the duration of the export.
- bf16 weights export, but ONNX Runtime's CPU provider cannot run them (no bf16 ``Conv``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit_fast.dtypes import DTYPE_NAMES, parse_dtype
from vit_fast.env import git_commit
from vit_fast.files import publish, staging_dir
from vit_fast.progress import Stages

from ._common import ExportError, check_batch_range, check_output_path, metadata_path, vit_fast_version

EXPORTERS = ("dynamo", "torchscript")
ATTENTION = ("decomposed", "fused")
MIN_OPSET = 17  # LayerNormalization
FUSED_ATTENTION_OPSET = 23  # Attention
TORCHSCRIPT_MAX_OPSET = 20
INPUT_NAME = "images"
METADATA_PROP = "vit_fast"  # metadata_props key holding the whole metadata as JSON
# single-file protobufs must stay below 2 GiB; larger weights go to external data beside the model
_EXTERNAL_DATA_BYTES = 1_800_000_000


class FusedAttention(nn.Module):
    """Export stand-in for :class:`vit_fast.layers.Attention`: the same parameters and math, with the
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


def check_onnx_args(
    model: Any, batch: Any, dtype: Any, opset: Any, exporter: Any, dynamic_size: Any, attention: Any
) -> tuple[tuple[int, int], torch.dtype, int]:
    """Validate :func:`to_onnx`'s arguments before any work; returns (batch, dtype, opset)."""
    from vit_fast.model import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise TypeError(
            f"to_onnx exports a vit_fast.VisionTransformer, got {type(model).__name__}: "
            "convert timm / Hugging Face models first with vit_fast.optimize(model)"
        )
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
    if exporter == "torchscript" and opset > TORCHSCRIPT_MAX_OPSET:
        raise ValueError(
            f"the TorchScript exporter supports opset <= {TORCHSCRIPT_MAX_OPSET}, got {opset}: use exporter='dynamo'"
        )
    return batch, dtype, opset


def _export_copy(model: nn.Module, dtype: torch.dtype, dynamic_size: bool, attention: str) -> nn.Module:
    """A CPU copy on the torch backend, in eval mode and ``dtype``; the caller's model is untouched."""
    m = copy.deepcopy(model).cpu().to(dtype).eval()
    m.set_backend("torch")
    if dynamic_size and not m.cfg.dynamic_img_size:
        m.cfg = m.cfg.replace(dynamic_img_size=True)
    if attention == "fused":
        for block in m.blocks:
            block.attn = FusedAttention(block.attn)
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _example_input(m: nn.Module, batch: tuple[int, int], dynamic_size: bool, dtype: torch.dtype) -> torch.Tensor:
    cfg = m.cfg
    trace_batch = min(max(2, batch[0]), max(2, batch[1]))  # >= 2, so no exporter specialises the batch to 1
    h, w = cfg.img_hw
    if dynamic_size:  # off the native grid, so the traced graph keeps the position-embedding resize
        h, w = h + cfg.patch_size, w + 2 * cfg.patch_size
    gen = torch.Generator().manual_seed(0)
    return torch.randn(trace_batch, cfg.in_chans, h, w, generator=gen).to(dtype)


def _run_exporter(
    m: nn.Module,
    x: torch.Tensor,
    out: Path,
    exporter: str,
    opset: int,
    batch: tuple[int, int],
    dynamic_size: bool,
    output_name: str,
    external_data: bool,
) -> None:
    with warnings.catch_warnings():  # the exporters' own deprecation chatter says nothing about this model
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        p = m.cfg.patch_size
        if exporter == "dynamo":
            dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1, max=max(2, batch[1]))}
            if dynamic_size:
                gh, gw = m.cfg.grid_size
                dims[2] = p * torch.export.Dim("grid_h", min=1, max=max(64, 4 * gh))
                dims[3] = p * torch.export.Dim("grid_w", min=1, max=max(64, 4 * gw))
            torch.onnx.export(
                m,
                (x,),
                str(out),
                dynamo=True,
                opset_version=opset,
                input_names=[INPUT_NAME],
                output_names=[output_name],
                dynamic_shapes={"x": dims},
                external_data=external_data,
                verbose=False,
            )
        else:
            axes = {0: "batch", 2: "height", 3: "width"} if dynamic_size else {0: "batch"}
            with _bicubic_aa_symbolic(opset):
                torch.onnx.export(
                    m,
                    (x,),
                    str(out),
                    dynamo=False,
                    opset_version=opset,
                    input_names=[INPUT_NAME],
                    output_names=[output_name],
                    dynamic_axes={INPUT_NAME: axes, output_name: {0: "batch"}},
                    do_constant_folding=True,
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


def _symbolic_dims(value_info: Any) -> list[bool]:
    return [bool(d.dim_param) and not d.HasField("dim_value") for d in value_info.type.tensor_type.shape.dim]


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
) -> Path:
    """Export ``model`` (a :class:`vit_fast.VisionTransformer`) to an ONNX file at ``path``.

    - ``batch=(min, max)``: the batch range served; dim 0 of the input ``images [B, C, H, W]``
      is symbolic (checked in the saved graph) and the range is recorded in the metadata.
    - ``dtype``: weights and input dtype, float32 / float16 / bfloat16 (a converted copy).
    - ``opset``: default 18 (23 with ``attention="fused"``); at least 17.
    - ``exporter``: ``"dynamo"`` (torch.export) or ``"torchscript"``.
    - ``dynamic_size``: symbolic H and W (multiples of the patch size). The exported copy gets
      ``cfg.dynamic_img_size=True``; the caller's model is not changed.
    - ``attention="fused"``: one ONNX ``Attention`` node per block (opset 23, dynamo only).
    - ``source``: how the model was named (preset, checkpoint), kept in the metadata so a later
      TensorRT build can verify against it.

    Writes ``path`` (plus ``path + ".data"`` for weights over ~1.8 GB) and ``path + ".json"``
    atomically; returns ``path``. The output is named ``logits`` (``features`` when
    ``num_classes == 0``). Raises ValueError / TypeError for bad arguments before any work and
    :class:`ExportError` when the exporter fails.
    """
    batch, dtype, opset = check_onnx_args(model, batch, dtype, opset, exporter, dynamic_size, attention)
    path = check_output_path(path)
    import onnx  # noqa: F401  (fail early and clearly where the onnx extra is missing)

    stages = Stages("vit-fast export", progress)
    cfg = model.cfg
    output_name = "logits" if cfg.num_classes else "features"
    m = _export_copy(model, dtype, dynamic_size, attention)
    x = _example_input(m, batch, dynamic_size, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    external = weight_bytes > _EXTERNAL_DATA_BYTES
    meta = {
        "format": "onnx",
        "config": cfg.to_dict() | ({"dynamic_img_size": True} if dynamic_size else {}),
        "exporter": exporter,
        "opset": opset,
        "dtype": DTYPE_NAMES[dtype],
        "batch": list(batch),
        "dynamic_size": dynamic_size,
        "attention": attention,
        "input": INPUT_NAME,
        "output": output_name,
        "source": source,
        "vit_fast_version": vit_fast_version(),
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
    }
    with staging_dir(path) as tmp:
        traced = tmp / path.name
        what = f"tracing {_describe(model)} with the {exporter} exporter (opset {opset}, {DTYPE_NAMES[dtype]})"
        with stages.step(what):
            try:
                with torch.no_grad():
                    _run_exporter(m, x, traced, exporter, opset, batch, dynamic_size, output_name, external)
            except Exception as err:
                other = "torchscript" if exporter == "dynamo" else "dynamo"
                hint = f"; try exporter={other!r}" if attention != "fused" else ""
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ExportError(
                    f"the {exporter} exporter could not trace {_describe(model)}: {type(err).__name__}: {first}{hint}"
                ) from err
        with stages.step("checking the graph and writing metadata"):
            final = _finish(traced, tmp, path, meta, external, dynamic_size, attention, cfg.depth)
        publish(final, path.parent)
    stages.note(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) and {metadata_path(path).name}")
    return path


def _finish(
    traced: Path,
    tmp: Path,
    path: Path,
    meta: dict[str, Any],
    external: bool,
    dynamic_size: bool,
    attention: str,
    depth: int,
) -> list[Path]:
    """Check the traced graph, add metadata, save it under its final name in ``tmp``; return files to move."""
    import onnx

    proto = onnx.load(str(traced))  # external data, if any, is read in too
    graph_input = proto.graph.input[0]
    symbolic = _symbolic_dims(graph_input)
    if not symbolic or not symbolic[0]:
        raise ExportError(
            f"the exported graph's input {graph_input.name!r} has a fixed batch dimension "
            f"({graph_input.type.tensor_type.shape}); expected a symbolic one"
        )
    if dynamic_size and not (symbolic[2] and symbolic[3]):
        raise ExportError(f"dynamic_size=True, but the exported graph's height/width are fixed: {symbolic}")
    ops = [n.op_type for n in proto.graph.node]
    if attention == "fused" and ops.count("Attention") != depth:
        raise ExportError(f"expected {depth} fused Attention nodes, found {ops.count('Attention')}")
    meta["op_counts"] = {op: ops.count(op) for op in sorted(set(ops))}
    if external:  # recorded before the props are written, so the file and the JSON beside it agree
        meta["external_data"] = path.name + ".data"
    del proto.metadata_props[:]
    for key, value in (
        (METADATA_PROP, json.dumps(meta, sort_keys=True)),
        ("vit_fast.config", json.dumps(meta["config"], sort_keys=True)),
        ("vit_fast.dtype", meta["dtype"]),
        ("vit_fast.batch", json.dumps(meta["batch"])),
        ("vit_fast.exporter", meta["exporter"]),
        ("vit_fast.opset", str(meta["opset"])),
        ("vit_fast.version", meta["vit_fast_version"]),
        ("vit_fast.git_commit", meta["git_commit"]),
    ):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.producer_name, proto.doc_string = "vit-fast", f"vit-fast {meta['vit_fast_version']} ({meta['exporter']})"

    for f in tmp.iterdir():  # the exporter's own files are replaced by ours
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
    meta_file.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
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
