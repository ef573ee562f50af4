"""Triton Inference Server model repositories from a model, an ONNX file or a TensorRT engine.

Triton's own layout, one folder per model::

    REPO/NAME/config.pbtxt              platform, inputs/outputs, max_batch_size, dynamic batching,
                                        instance groups, and comments naming the source and its verification
    REPO/NAME/verification.json         the verification record the artifact was published with
    REPO/NAME/1/model.onnx | model.plan the artifact, with its vit-fast metadata beside it (model.onnx.json)
                                        and the external data files its graph names, under those names

Input and output names, dtypes and dims are read from the artifact (the ONNX graph, a uint8 input
declared in its recorded layout; for an engine, its vit-fast metadata and the ONNX file it was built
from where that lies beside it, since opening an engine needs a GPU); ``max_batch_size`` is bounded by the
batch range the artifact was exported or built for. Every folder is built in a private staging folder
beside its target and renamed into place only when all of them are complete; an existing non-empty model
folder is refused unless ``force=True``, before any work, and a model folder that appeared or changed while
the new one was built (a version folder added, a file edited) is never moved away: the write is refused and it
stays as it is. Other entries (the python-backend entry of ``vit_fast.serve``)
plug in as :class:`ModelEntry` builders.

Here: the entries (:func:`onnx_entry`, :func:`tensorrt_entry`), the all-or-nothing writer
(:func:`write_repository`) and :func:`to_tritonserver`. The config.pbtxt model (tensors, batching,
rendering, the serving-argument checks, reading an artifact's I/O) lives in ``triton_config``; its
names are re-exported here, so callers keep importing ``vit_fast.export.tritonserver``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.util.batches import MAX_BATCH
from vit_fast.util.dtypes import DTYPE_NAMES, parse_dtype
from vit_fast.util.files import (
    check_output_dir,
    claim_folder,
    clean_stale_staging,
    copy_new,
    make_folders,
    make_staging,
    publish_folders,
    refuse_non_utf8,
    write_json_atomic,
    write_new,
)
from vit_fast.util.progress import Stages

from . import triton_config
from ._common import (
    ENGINE_SUFFIXES,
    ONNX_SUFFIXES,
    ArtifactError,
    check_readable_file,
    external_data_files,
    metadata_batch,
    metadata_path,
    read_metadata,
)
from .triton_config import *  # noqa: F403  (the config names, re-exported: callers import them from here)
from .triton_config import (
    DEFAULT_QUEUE_DELAY_US,
    MODEL_FILES,
    PLATFORMS,
    VERSION,
    EntryConfig,
    check_model_name,
    engine_specs,
    input_layout,
    model_name_for,
    onnx_specs,
    plan_batching,
    provenance_comments,
)


@dataclass
class ModelEntry:
    """One model folder to write: ``build(folder)`` writes its files under ``folder`` (the version folder
    ``folder/1`` included) and returns its config; :func:`write_repository` does the rest."""

    name: str
    build: Callable[[Path], EntryConfig]


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


# --------------------------------------------------------------------------- entries
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
    """An ``onnxruntime_onnx`` entry from a :class:`vit_fast.VisionTransformer` (exported here with
    ``to_onnx``, batch range 1..max) or from an ONNX file (copied with its metadata and the external data
    files its graph names, each of which must lie inside the file's folder).

    ``verify``: run the ONNX file against eager PyTorch (``vit_fast.export.verify``) and keep the
    record; for a file, against ``model`` or else the source its metadata names. ``verify_batches``: the
    batch sizes verified (default: the minimum, an odd batch and the maximum of the file's range), inside that
    range; fewer make a quicker check and leave the served batch sizes as they are. ``dtype`` applies to a
    model only (a file keeps its own). Arguments are checked here, before any work.
    """
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
        from .verify import check_verify_batches

        verify_batches = list(verify_batches)
        check_verify_batches(verify_batches, rng or (1, MAX_BATCH))

    def build(folder: Path) -> EntryConfig:
        version = folder / VERSION
        version.mkdir()
        target = version / MODEL_FILES["onnx"]
        shown = published_folder(folder) / VERSION / MODEL_FILES["onnx"]  # where it is served from: what we name
        record = None
        if path is None:
            from .onnx import to_onnx

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
            from .verify import verify as verify_artifact

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
        inputs, outputs = onnx_specs(target, input_layout(meta, path) if path is not None else None)
        return EntryConfig(
            name=name,
            platform=PLATFORMS["onnx"],
            inputs=inputs,
            outputs=outputs,
            batching=plan,
            comments=provenance_comments(described, record),
        )

    return ModelEntry(name, build)


def tensorrt_entry(
    engine: str | os.PathLike,
    name: str,
    batch: Sequence[int] | None = None,
    instances: int = 1,
    kind: str = "gpu",
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
) -> ModelEntry:
    """A ``tensorrt_plan`` entry from an engine built by ``vit-fast export tensorrt`` (its metadata is
    required: it records the profile, precision and the verification the engine passed when built).

    ``max_batch_size`` is bounded by the engine's profile; the default preferred sizes are its
    ``opt`` and ``max``. TensorRT engines run on a GPU only, so ``kind`` must be "gpu".
    """
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
        return EntryConfig(
            name=name,
            platform=PLATFORMS["tensorrt"],
            inputs=inputs,
            outputs=outputs,
            batching=plan,
            comments=[
                *provenance_comments(str(path.resolve()), record),
                f"engine: {where}; it loads on that GPU and TensorRT only",
            ],
        )

    return ModelEntry(name, build)


# --------------------------------------------------------------------------- writing
def published_folder(folder: Path) -> Path:
    """Where a model folder that :func:`write_repository` builds at ``folder`` (inside its staging folder in the
    repository) is published: what progress lines and tables name, never the staging path."""
    return folder.parent.parent / folder.name


def check_repository(repo: str | os.PathLike, names: Sequence[str], force: bool = False) -> Path:
    """Check that ``repo`` can hold the model folders ``names`` (before any work); returns it.

    The repository folder may be missing (it is created, its parent must exist); it (or, when missing, its
    parent) must be writable, and a link on the way must lead somewhere. A model folder that exists and is
    not empty is refused unless ``force``; duplicate names are refused. Each model folder is claimed
    (:func:`vit_fast.util.files.claim_folder`): the write replaces only what is there now.
    """
    repo = Path(repo)
    refuse_non_utf8(repo, "model repository", "ONNX Runtime (verifying the model where it will be served from)")
    if repo.exists() and not repo.is_dir():
        raise ValueError(f"model repository {str(repo)!r} is a file; give a folder")
    check_output_dir(repo, "model repository")  # a link that leads nowhere, a folder that cannot be written
    parent = repo.parent if str(repo.parent) else Path(".")
    if not repo.exists() and not parent.is_dir():
        raise ValueError(f"folder {str(parent)!r} for the model repository does not exist: create it first")
    if len(set(names)) != len(names):
        raise ValueError(f"model names must differ, got {list(names)}")
    for name in names:
        check_model_name(name)
        target = repo / name
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise ValueError(f"{str(target)!r} exists and is not a folder: remove it or pick another model name")
        if target.is_dir() and any(target.iterdir()) and not force:
            raise FileExistsError(
                f"model folder {str(target)!r} exists and is not empty: pass force (--force) to replace it, "
                "or pick another name or repository"
            )
    for name in names:
        claim_folder(repo / name)
    return repo


def write_repository(
    repo: str | os.PathLike, entries: Sequence[ModelEntry], force: bool = False, progress: bool = True
) -> list[Path]:
    """Build each entry's model folder in a staging folder inside ``repo``, then move them all into place.

    Nothing appears in ``repo`` unless every entry was built. With ``force``, an existing model folder of
    the same name is swapped out and removed after the new one is in place, but only while it is as
    :func:`check_repository` saw it: a model folder that appeared or changed meanwhile (a version added)
    stays as it is and the write is refused (:class:`vit_fast.util.files.OutputChanged`), nothing published.
    Returns the model folders.
    """
    names = [e.name for e in entries]
    repo = check_repository(repo, names, force)
    make_folders(repo, "model repository")
    stages = Stages("vit-fast export", progress)
    clean_stale_staging(repo)  # a killed run's staging folder, proven ours by its marker and free lock
    staging, lock = make_staging(repo, "vit-fast-repo")  # .vit-fast-repo.tmp-TOKEN
    try:
        for entry in entries:
            folder = staging / entry.name
            folder.mkdir()
            with stages.step(f"building model folder {entry.name!r}"):
                config = entry.build(folder)
            if config.name != entry.name:
                raise RuntimeError(f"entry {entry.name!r} produced a config named {config.name!r}")
            write_new(folder / "config.pbtxt", config.to_pbtxt())
        # the folders replaced end up inside the staging folder, and go with it
        publish_folders([(staging / e.name, repo / e.name) for e in entries])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(lock)
    published = [repo / e.name for e in entries]
    for target in published:
        stages.note(f"wrote {target}/config.pbtxt")
    return published


def to_tritonserver(
    source: nn.Module | str | os.PathLike,
    repo: str | os.PathLike,
    name: str | None = None,
    batch: Sequence[int] | None = None,
    dtype: torch.dtype | str = torch.float32,
    instances: int = 1,
    kind: str = "gpu",
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    force: bool = False,
    verify: bool = True,
    model: nn.Module | str | None = None,
    seed: int | None = None,
    source_name: str | None = None,
    extra: Sequence[ModelEntry] = (),
    progress: bool = True,
    verify_batches: Sequence[int] | None = None,
) -> list[Path]:
    """Write a Triton model repository entry for ``source`` into ``repo``; returns the model folders.

    - ``source``: a :class:`vit_fast.VisionTransformer` (exported to ONNX here and verified), an
      ``.onnx`` file, or a TensorRT engine (``.plan`` / ``.engine``) with its vit-fast metadata.
    - ``name``: the Triton model name (default: the file stem, or ``source_name``'s).
    - ``batch``: the batch sizes to serve, e.g. ``(1, 8, 64)``: the largest is ``max_batch_size``, sizes
      above 1 the dynamic batcher's preferred sizes. Default 8 and 64 within the artifact's range.
    - ``instances`` x ``kind`` ("gpu" -> KIND_GPU, "cpu" -> KIND_CPU): the instance group.
    - ``queue_delay_us``: the dynamic batcher's ``max_queue_delay_microseconds``.
    - ``extra``: more entries written in the same all-or-nothing step (the python-backend entry).
    - ``verify_batches``: the batch sizes an ONNX entry is verified at (:func:`onnx_entry`).

    Existing non-empty model folders are refused unless ``force``. Bad arguments raise before any work.
    """
    from vit_fast.model.vit import VisionTransformer

    if name is None:
        name = model_name_for(source_name or ("vit" if isinstance(source, VisionTransformer) else source))
    common = dict(batch=batch, instances=instances, kind=kind, queue_delay_us=queue_delay_us)
    if isinstance(source, VisionTransformer) or Path(str(source)).suffix.lower() in ONNX_SUFFIXES:
        entry = onnx_entry(
            source,
            name,
            dtype=dtype,
            verify=verify,
            model=model,
            seed=seed,
            source_name=source_name,
            progress=progress,
            verify_batches=verify_batches,
            **common,
        )
    elif Path(str(source)).suffix.lower() in ENGINE_SUFFIXES:
        entry = tensorrt_entry(source, name, **common)
    else:
        raise ValueError(
            f"cannot tell what {str(source)!r} is: give a vit_fast.VisionTransformer, an .onnx file or a TensorRT "
            f"engine ({', '.join(ENGINE_SUFFIXES)})"
        )
    check_repository(repo, [entry.name, *(e.name for e in extra)], force)
    return write_repository(repo, [entry, *extra], force=force, progress=progress)


#: this module's names, and the config names it re-exports (callers import both from here)
__all__ = [
    "ENGINE_SUFFIXES",
    "ONNX_SUFFIXES",
    "ModelEntry",
    "check_repository",
    "onnx_entry",
    "published_folder",
    "tensorrt_entry",
    "to_tritonserver",
    "write_repository",
    *triton_config.__all__,
]
