"""The artifact entries of a model repository: :func:`onnx_entry` (a ViT exported here, or an ONNX file copied
with its metadata and external data, verified against eager PyTorch) and :func:`tensorrt_entry` (an engine and
its metadata; its I/O comes from that metadata, since opening an engine needs a GPU)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.export._common import (
    ArtifactError,
    check_readable_file,
    external_data_files,
    metadata_batch,
    metadata_path,
    read_metadata,
)
from vit_fast.util.batches import MAX_BATCH
from vit_fast.util.dtypes import DTYPE_NAMES, parse_dtype
from vit_fast.util.files import copy_new, make_folders, write_json_atomic
from vit_fast.util.progress import Stages

from .checks import check_model_name, plan_batching
from .config import (
    DEFAULT_QUEUE_DELAY_US,
    MODEL_FILES,
    ONNX_SUFFIXES,
    PLATFORMS,
    VERSION,
    EntryConfig,
    provenance_comments,
)
from .layout import ModelEntry, published_folder
from .specs import engine_specs, input_layout, onnx_specs


def _verification_record(report: Any) -> dict[str, Any]:
    """The record kept beside a verified artifact: pass/fail, the worst row's error/bound ratio, the runtime."""
    worst = report.worst()
    return {
        "passed": report.passed,
        "worst_ratio": worst.ratio,
        "runtime": report.runtime,
        "dtype": report.dtype,
        "rule": report.rule,
        "rows": len(report.rows),
    }


def _check_data_names(path: Path, names: list[str]) -> list[str]:
    """``names`` (the external data files of ONNX file ``path``), refused where one would take the place of the
    file Triton loads or of its metadata in the version folder."""
    taken = {MODEL_FILES["onnx"], metadata_path(MODEL_FILES["onnx"]).name}
    clash = [n for n in names if n in taken]
    if clash:
        raise ArtifactError(
            f"{str(path)!r} keeps tensors in external data named {clash[0]!r}, the name of a file the model folder "
            "needs: save the ONNX file with another external data name (onnx.save_model(..., location=...))"
        )
    return names


def onnx_entry(
    source: nn.Module | str | os.PathLike,
    name: str,
    batch: Sequence[int] | None = None,
    dtype: torch.dtype | str = torch.float32,
    instances: int = 1,
    kind: str = "gpu",
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    verify: bool = True,
    model: nn.Module | str | None = None,
    seed: int | None = None,
    source_name: str | None = None,
    progress: bool = True,
    verify_batches: Sequence[int] | None = None,
) -> ModelEntry:
    """An ``onnxruntime_onnx`` entry from a :class:`vit_fast.VisionTransformer` (exported with ``to_onnx``, batch
    range 1..max) or from an ONNX file (copied with its metadata and the external data files its graph names, each
    inside the file's folder). ``verify``: run the ONNX file against eager PyTorch (``vit_fast.export.verify``; a
    file against ``model``, else the source its metadata names) and keep the record; ``verify_batches``: see
    docs/deploy.md, section "A model repository for Triton Inference Server". ``dtype``: a model's only."""
    check_model_name(name)
    serving = dict(instances=instances, kind=kind, queue_delay_us=queue_delay_us)
    from vit_fast.model.vit import VisionTransformer

    if isinstance(source, VisionTransformer):
        dtype = parse_dtype(dtype)
        if verify and dtype == torch.bfloat16:
            raise ValueError(
                "a bf16 ONNX file cannot be verified on ONNX Runtime (its CPU provider has no bf16 Conv): "
                "use dtype fp16 or fp32, or verify=False"
            )
        plan = plan_batching(batch, **serving)
        described = source_name or "a vit_fast.VisionTransformer"
        meta, path, reference = None, None, source
        rng: tuple[int, int] | None = (1, plan.max_batch_size)
    else:
        path = check_readable_file(source, "ONNX file")
        if path.suffix.lower() not in ONNX_SUFFIXES:
            raise ValueError(f"{str(path)!r} is not an ONNX file (.onnx)")
        meta = read_metadata(path) or {}
        onnx_specs(path, input_layout(meta, path))  # readable, batchable: fail before any work
        _check_data_names(path, external_data_files(path))
        rng = metadata_batch(meta, path) if meta.get("batch") else None
        plan = plan_batching(batch, **serving, limit=rng, what=f"ONNX file {str(path)!r}")
        reference = model if model is not None else meta.get("source")
        if verify and reference is None:
            raise ValueError(
                f"cannot verify {str(path)!r}: its metadata names no source model; pass the model it was exported "
                "from, or skip verification"
            )
        described = str(path.resolve())
    if verify and verify_batches is not None:
        from vit_fast.export.verify import check_verify_batches

        verify_batches = list(verify_batches)
        check_verify_batches(verify_batches, rng or (1, MAX_BATCH))

    def build(folder: Path) -> EntryConfig:
        version = folder / VERSION
        version.mkdir()
        target = version / MODEL_FILES["onnx"]
        shown = published_folder(folder) / VERSION / MODEL_FILES["onnx"]  # where it is served from: what we name
        record = None
        if path is None:
            from vit_fast.export.onnx import to_onnx

            what = f"exporting {shown} (ONNX, {DTYPE_NAMES[dtype]}, batch 1..{plan.max_batch_size})"
            with Stages("vit-fast export", progress).step(what):
                to_onnx(  # verified below, where it will be served from
                    source, target, batch=(1, plan.max_batch_size), dtype=dtype, source=source_name,
                    progress=False, verify=False,
                )  # fmt: skip
        else:
            copy_new(path, target)
            # the weights files the graph itself names travel with it under those names (read again here: what
            # was checked before the work is what is copied), whatever its metadata says
            for data_name in _check_data_names(path, external_data_files(path)):
                make_folders((version / data_name).parent, "external data folder")
                copy_new(path.parent / data_name, version / data_name)
            if metadata_path(path).is_file():
                copy_new(metadata_path(path), metadata_path(target))
        if verify:
            from vit_fast.export.verify import verify as verify_artifact

            report = verify_artifact(
                reference,
                target,
                batches=verify_batches,
                seed=seed,
                print_table=progress,
                raise_on_failure=True,
                artifact_name=str(shown),
                batch_flag="--verify-batch",
            )
            record = _verification_record(report)
            # the report names the file it checked in the staging folder; name it where it now lives
            details = report.to_dict() | {"artifact": f"{VERSION}/{MODEL_FILES['onnx']}"}
            write_json_atomic({**record, "report": details}, folder / "verification.json")
        else:
            write_json_atomic(
                {"passed": None, "note": "not verified (verification was skipped)"}, folder / "verification.json"
            )
        specs = onnx_specs(target, input_layout(meta, path) if path is not None else None)
        return _artifact_config(name, "onnx", specs, plan, provenance_comments(described, record))

    return ModelEntry(name, build)


def _artifact_config(name: str, artifact_format: str, specs: tuple, plan: Any, comments: list[str]) -> EntryConfig:
    """The config.pbtxt of an artifact entry: its format's Triton platform, ``specs`` = (inputs, outputs)."""
    inputs, outputs = specs
    return EntryConfig(
        name=name,
        platform=PLATFORMS[artifact_format],
        inputs=inputs,
        outputs=outputs,
        batching=plan,
        comments=comments,
    )


def tensorrt_entry(
    engine: str | os.PathLike,
    name: str,
    batch: Sequence[int] | None = None,
    instances: int = 1,
    kind: str = "gpu",
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
) -> ModelEntry:
    """A ``tensorrt_plan`` entry from an engine built by ``vit-fast export tensorrt`` (its metadata is required: it
    records the profile, precision and the verification the engine passed when built). ``max_batch_size`` is bounded
    by the engine's profile; the default preferred sizes are its ``opt`` and ``max``. TensorRT engines run on a GPU
    only, so ``kind`` must be "gpu"."""
    check_model_name(name)
    path = check_readable_file(engine, "TensorRT engine")
    if kind != "gpu":
        raise ValueError("a TensorRT engine runs on a GPU only: use kind 'gpu' (KIND_GPU)")
    meta = read_metadata(path)
    if not meta or meta.get("format") != "tensorrt":
        raise ArtifactError(
            f"engine {str(path)!r} has no vit-fast metadata beside it ({metadata_path(path).name}): the repository "
            "needs its profile and I/O; build it with vit-fast export tensorrt"
        )
    inputs, outputs, profile = engine_specs(path, meta)
    limit, what = (profile[0], profile[2]), f"engine {str(path)!r}"
    plan = plan_batching(batch, instances, kind, queue_delay_us, limit=limit, opt=profile[1], what=what)
    where = f"TensorRT {meta.get('tensorrt_version', '?')} for {meta.get('gpu_name', '?')} ({meta.get('gpu_sm', '?')})"
    record = dict(meta["verification"], runtime=where) if isinstance(meta.get("verification"), dict) else None

    def build(folder: Path) -> EntryConfig:
        version = folder / VERSION
        version.mkdir()
        target = version / MODEL_FILES["tensorrt"]
        copy_new(path, target)
        copy_new(metadata_path(path), metadata_path(target))
        note = "verified when the engine was built (vit-fast export tensorrt)"
        data = {**record, "note": note} if record else {"passed": None, "note": "the engine was built unverified"}
        write_json_atomic(data, folder / "verification.json")
        comments = [
            *provenance_comments(str(path.resolve()), record),
            f"engine: {where}; it loads on that GPU and TensorRT only",
        ]
        return _artifact_config(name, "tensorrt", (inputs, outputs), plan, comments)

    return ModelEntry(name, build)
