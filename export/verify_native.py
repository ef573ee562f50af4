"""Verification of a native-resolution artifact (timm ``NaFlexVit``, transformers ``Siglip2VisionModel``; see
:mod:`.native`) against eager PyTorch by the project's numerics rule: at several image-size mixes (each mix one
padded batch of images of different sizes), every output the graph returns, the float64 reference and eager in the
artifact's dtype on PyTorch's own forwards. ``last_hidden_state`` is compared at real tokens only (prefix tokens and
valid patches): what a model leaves at padding is no output. Each row names the images of its mix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.backend.env import module_version
from vit_fast.util.numerics import compare

from ._common import ArtifactError, check_report_path, read_metadata
from .native import INPUTS, NativeGraph, default_mixes, example_batch, native_family, plain_copy, valid_tokens
from .verify import draw_seed, finish_report, start_report
from .verify_report import VerifyReport, VerifyRow


def check_mixes(model: nn.Module, mixes: Any, max_grid: int | None) -> list[list[tuple[int, int]]]:
    """Validate image-size mixes (lists of (h, w) pixels, each at least one image); sides past ``max_grid``
    patches (the artifact's resize table) are refused, naming the limit."""
    from .native import patch_size

    if mixes is None:
        mixes = default_mixes(model)
    out = []
    p = patch_size(model)
    for mix in mixes:
        sizes = [tuple(size) for size in mix]
        if not sizes or any(
            len(s) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in s) for s in sizes
        ):
            raise ValueError(f"an image-size mix is a list of (h, w) pixel sizes, ints >= 1; got {mix!r}")
        if max_grid is not None:
            too_big = [s for s in sizes if -(-max(s) // p) > max_grid]
            if too_big:
                raise ValueError(
                    f"image size {too_big[0][0]}x{too_big[0][1]} is {-(-max(too_big[0]) // p)} patches a side, past "
                    f"the {max_grid} the artifact takes (max_grid): export with a larger max_grid"
                )
        out.append(sizes)
    return out


def _session(artifact: Path, provider: str | None) -> Any:
    import onnxruntime as ort

    provider = provider or "CPUExecutionProvider"
    if provider not in ort.get_available_providers():
        raise ArtifactError(f"ONNX Runtime provider {provider} is not available here")
    try:
        return ort.InferenceSession(str(artifact), providers=[provider])
    except Exception as err:
        raise ArtifactError(f"ONNX Runtime cannot load {str(artifact)!r}: {err}") from err


def verify_native(
    model: nn.Module,
    artifact: str | os.PathLike,
    size_mixes: list[list[tuple[int, int]]] | None = None,
    seed: int | None = None,
    provider: str | None = None,
    json_path: str | os.PathLike | None = None,
    print_table: bool = True,
    raise_on_failure: bool = True,
    overwrite: bool = False,
    artifact_name: str | None = None,
) -> VerifyReport:
    """Run the ONNX file ``artifact`` exported from the native-resolution ``model`` on ONNX Runtime at each of
    ``size_mixes`` (default :func:`vit_fast.export.native.default_mixes`: three) and judge every output against the
    model in float64 by the numerics rule, eager in the artifact's dtype giving the bound. Returns the report (each
    row names its images); raises :class:`VerificationError` naming the worst row when one fails."""
    if json_path is not None:
        json_path = check_report_path(json_path, overwrite, artifact=artifact)
    family = native_family(model)
    meta = read_metadata(artifact) or {}
    if meta and meta.get("family") not in (None, family):
        raise ValueError(f"{str(artifact)!r} was exported from a {meta.get('family')} model, not a {family}")
    mixes = check_mixes(model, size_mixes, meta.get("max_grid"))
    session = _session(Path(artifact), provider)
    names = [i.name for i in session.get_inputs()]
    if names != list(INPUTS[family]):
        raise ArtifactError(f"{str(artifact)!r} takes inputs {names}, not a {family} graph's {list(INPUTS[family])}")
    outputs = list(meta.get("outputs") or [o.name for o in session.get_outputs()])
    output_names = [o.name for o in session.get_outputs()]
    dtype = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16}.get(session.get_inputs()[0].type)
    if dtype is None:
        raise ArtifactError(f"{str(artifact)!r}: input type {session.get_inputs()[0].type} is not fp32 or fp16")
    reference = NativeGraph(plain_copy(model, torch.float64, None), outputs)
    eager = NativeGraph(plain_copy(model, dtype, None), outputs)
    seed = draw_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    runtime = f"onnxruntime {module_version('onnxruntime')} ({session.get_providers()[0]})"
    report = start_report(model, artifact_name or str(artifact), runtime, dtype, seed, output_names, meta)
    with torch.no_grad():
        for mix in mixes:
            inputs = example_batch(model, mix, dtype, gen)
            ref = reference.all_outputs(inputs[0].double(), *inputs[1:])
            ours_eager = eager.all_outputs(*inputs)
            got = session.run(output_names, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})
            valid = valid_tokens(model, inputs)
            for kind, name, value in zip(outputs, output_names, got, strict=True):
                out, want, eager_out = torch.from_numpy(value), ref[kind], ours_eager[kind]
                if tuple(out.shape) != tuple(want.shape):
                    raise ArtifactError(
                        f"artifact output {name!r} has shape {tuple(out.shape)}, eager's {kind} {tuple(want.shape)}"
                    )
                if kind == "last_hidden_state":
                    out, want, eager_out = out[valid][None], want[valid][None], eager_out[valid][None]
                row = compare(out, eager_out, want, dtype, kind == "logits")
                h, w = max(s[0] for s in mix), max(s[1] for s in mix)
                report.rows.append(VerifyRow(output=name, batch=len(mix), height=h, width=w, images=mix, **row))
    finish_report(report, print_table, json_path, raise_on_failure)
    return report


__all__ = ["check_mixes", "verify_native"]
