"""Triton Inference Server model repositories from a model, an ONNX file or a TensorRT engine.

Triton's own layout, one folder per model::

    REPO/NAME/config.pbtxt              platform, inputs/outputs, max_batch_size, dynamic batching,
                                        instance groups, and comments naming the source and its verification
    REPO/NAME/verification.json         the verification record the artifact was published with
    REPO/NAME/1/model.onnx | model.plan the artifact, with its vit-fast metadata beside it (model.onnx.json)

Input and output names, dtypes and dims are read from the artifact (the ONNX graph; for an
engine, its vit-fast metadata and the ONNX file it was built from, since opening an engine
needs a GPU); ``max_batch_size`` is bounded by the batch range the artifact was exported or
built for. Every folder is built in a private staging folder beside its target and renamed into
place only when all of them are complete; an existing non-empty model folder is refused unless
``force=True``, before any work. Other entries (the python-backend entry of ``vit_fast.serve``)
plug in as :class:`ModelEntry` builders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.dtypes import parse_dtype
from vit_fast.env import git_commit
from vit_fast.files import write_json_atomic
from vit_fast.progress import Stages

from ._common import ArtifactError, check_readable_file, metadata_path, read_metadata, vit_fast_version

#: torch dtype -> Triton model-config data type
TRITON_TYPES: dict[torch.dtype, str] = {
    torch.float32: "TYPE_FP32",
    torch.float16: "TYPE_FP16",
    torch.bfloat16: "TYPE_BF16",
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
ONNX_SUFFIXES = (".onnx",)
ENGINE_SUFFIXES = (".plan", ".engine", ".trt")


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as Triton sees it: ``dims`` exclude the batch dimension; -1 is variable."""

    name: str
    dtype: torch.dtype
    dims: tuple[int, ...]


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
                f"    dims: [ {', '.join(map(str, s.dims))} ]\n  }}"
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


@dataclass
class ModelEntry:
    """One model folder to write: ``build(folder)`` writes its files under ``folder`` (the version folder
    ``folder/1`` included) and returns its config; :func:`write_repository` does the rest."""

    name: str
    build: Callable[[Path], EntryConfig]


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
    items = str(text).split(",") if isinstance(text, str) else list(text)
    try:
        sizes = [int(str(b).strip()) for b in items]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise ValueError(f"batch sizes must be comma-separated ints >= 1 such as 1,8,64, got {text!r}")
    return sizes


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
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch sizes must be ints >= 1 such as 1,8,64 (the largest is the maximum), got {batch!r}")
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
def _onnx_specs(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX graph whose dim 0 is a symbolic batch."""
    import onnx

    from vit_fast.dtypes import ONNX_ELEM_TYPES

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
            if tt.elem_type not in ONNX_ELEM_TYPES:
                raise ArtifactError(
                    f"{str(path)!r}: {key} {v.name!r} has ONNX element type {tt.elem_type}, not fp32/16"
                )
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            if not dims or dims[0] != -1:
                raise ArtifactError(
                    f"{str(path)!r}: {key} {v.name!r} has shape {dims} without a variable batch dimension 0, so Triton "
                    "cannot batch it: export it with vit-fast export onnx (dim 0 symbolic)"
                )
            specs[key].append(TensorSpec(v.name, ONNX_ELEM_TYPES[tt.elem_type], tuple(dims[1:])))
    if not specs["input"] or not specs["output"]:
        raise ArtifactError(f"{str(path)!r} is not an ONNX model with inputs and outputs")
    return specs["input"], specs["output"]


def _engine_specs(path: Path, meta: dict[str, Any]) -> tuple[list[TensorSpec], list[TensorSpec], tuple[int, int, int]]:
    """Inputs, outputs and the batch profile (min, opt, max) of a vit-fast TensorRT engine, from its metadata.

    The input and its shape come from the recorded optimization profile; the output's name and dims from
    the ONNX file the engine was built from where it is still there, else from the recorded model config.
    I/O dtypes: a strongly typed engine keeps its ONNX file's dtype, a weakly typed one fp32 I/O.
    """
    profiles = meta.get("profiles") or []
    if not profiles or not {"input", "min", "opt", "max"} <= set(profiles[0]):
        raise ArtifactError(f"metadata of engine {str(path)!r} records no optimization profile: rebuild it")
    p = profiles[0]
    io_dtype = parse_dtype(meta["precision"]) if meta.get("strongly_typed") else torch.float32
    inputs = [TensorSpec(p["input"], io_dtype, tuple(int(d) for d in p["max"][1:]))]
    onnx_file = Path(meta["onnx"]) if meta.get("onnx") else None
    if onnx_file is not None and onnx_file.is_file():
        _, onnx_outputs = _onnx_specs(onnx_file)
        outputs = [TensorSpec(s.name, io_dtype, s.dims) for s in onnx_outputs]
    else:
        cfg = meta.get("config") or {}
        if "num_classes" not in cfg or "embed_dim" not in cfg:
            raise ArtifactError(
                f"engine {str(path)!r}: its ONNX file {str(onnx_file)!r} is gone and its metadata records no model "
                "config, so its output is unknown: rebuild it with vit-fast export tensorrt"
            )
        width = cfg["num_classes"] or cfg["embed_dim"]
        outputs = [TensorSpec("logits" if cfg["num_classes"] else "features", io_dtype, (int(width),))]
    profile = (int(p["min"][0]), int(p["opt"][0]), int(p["max"][0]))
    return inputs, outputs, profile


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
) -> ModelEntry:
    """An ``onnxruntime_onnx`` entry from a :class:`vit_fast.VisionTransformer` (exported here with
    ``to_onnx``, batch range 1..max) or from an ONNX file (copied with its metadata).

    ``verify``: run the ONNX file against eager PyTorch (``vit_fast.export.verify``) and keep the
    record; for a file, against ``model`` or else the source its metadata names. ``dtype`` applies to a
    model only (a file keeps its own). Arguments are checked here, before any work.
    """
    check_model_name(name)
    serving = dict(instances=instances, kind=kind, queue_delay_us=queue_delay_us)
    from vit_fast.model import VisionTransformer

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
    else:
        path = check_readable_file(source, "ONNX file")
        if path.suffix.lower() not in ONNX_SUFFIXES:
            raise ValueError(f"{str(path)!r} is not an ONNX file (.onnx)")
        meta = read_metadata(path) or {}
        _onnx_specs(path)  # readable, batchable: fail before any work
        rng = tuple(meta["batch"]) if meta.get("batch") else None
        plan = plan_batching(batch, **serving, limit=rng, what=f"ONNX file {str(path)!r}")
        reference = model if model is not None else meta.get("source")
        if verify and reference is None:
            raise ValueError(
                f"cannot verify {str(path)!r}: its metadata names no source model; pass the model it was exported "
                "from, or skip verification"
            )
        described = str(path.resolve())

    def build(folder: Path) -> EntryConfig:
        version = folder / VERSION
        version.mkdir(parents=True)
        target = version / MODEL_FILES["onnx"]
        record = None
        if path is None:
            from .onnx import to_onnx

            to_onnx(  # verified below, where it will be served from
                source, target, batch=(1, plan.max_batch_size), dtype=dtype, source=source_name,
                progress=progress, verify=False,
            )  # fmt: skip
        else:
            shutil.copyfile(path, target)
            if meta.get("external_data"):  # the graph names its weights file; it keeps that name
                shutil.copyfile(path.parent / meta["external_data"], version / meta["external_data"])
            if metadata_path(path).is_file():
                shutil.copyfile(metadata_path(path), metadata_path(target))
        if verify:
            from .verify import verify as verify_artifact

            report = verify_artifact(reference, target, seed=seed, print_table=progress, raise_on_failure=True)
            record = _verification_record(report)
            # the report names the file it checked in the staging folder; name it where it now lives
            details = report.to_dict() | {"artifact": f"{VERSION}/{MODEL_FILES['onnx']}"}
            write_json_atomic({**record, "report": details}, folder / "verification.json")
        else:
            write_json_atomic(
                {"passed": None, "note": "not verified (verification was skipped)"}, folder / "verification.json"
            )
        inputs, outputs = _onnx_specs(target)
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
    inputs, outputs, profile = _engine_specs(path, meta)
    limit, what = (profile[0], profile[2]), f"engine {str(path)!r}"
    plan = plan_batching(batch, instances, kind, queue_delay_us, limit=limit, opt=profile[1], what=what)
    where = f"TensorRT {meta.get('tensorrt_version', '?')} for {meta.get('gpu_name', '?')} ({meta.get('gpu_sm', '?')})"
    record = dict(meta["verification"], runtime=where) if isinstance(meta.get("verification"), dict) else None

    def build(folder: Path) -> EntryConfig:
        version = folder / VERSION
        version.mkdir(parents=True)
        target = version / MODEL_FILES["tensorrt"]
        shutil.copyfile(path, target)
        shutil.copyfile(metadata_path(path), metadata_path(target))
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
def check_repository(repo: str | os.PathLike, names: Sequence[str], force: bool = False) -> Path:
    """Check that ``repo`` can hold the model folders ``names`` (before any work); returns it.

    The repository folder may be missing (it is created, its parent must exist). A model folder that
    exists and is not empty is refused unless ``force``; duplicate names are refused.
    """
    repo = Path(repo)
    if repo.exists() and not repo.is_dir():
        raise ValueError(f"model repository {str(repo)!r} is a file; give a folder")
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
    return repo


def write_repository(
    repo: str | os.PathLike, entries: Sequence[ModelEntry], force: bool = False, progress: bool = True
) -> list[Path]:
    """Build each entry's model folder in a staging folder inside ``repo``, then rename them all into place.

    Nothing appears in ``repo`` unless every entry was built. With ``force``, an existing model folder of
    the same name is swapped out and removed after the new one is in place. Returns the model folders.
    """
    names = [e.name for e in entries]
    repo = check_repository(repo, names, force)
    repo.mkdir(exist_ok=True)
    stages = Stages("vit-fast export", progress)
    staging = Path(tempfile.mkdtemp(prefix=".vit-fast-repo.tmp-", dir=repo))
    published: list[tuple[Path, Path | None]] = []  # (model folder, the old folder it replaced)
    try:
        for entry in entries:
            folder = staging / entry.name
            folder.mkdir()
            with stages.step(f"building model folder {entry.name!r}"):
                config = entry.build(folder)
            if config.name != entry.name:
                raise RuntimeError(f"entry {entry.name!r} produced a config named {config.name!r}")
            (folder / "config.pbtxt").write_text(config.to_pbtxt())
        for entry in entries:
            target, old = repo / entry.name, None
            if target.is_dir():  # empty, or replaced under force: move it aside first
                old = staging / f".old-{entry.name}"
                os.rename(target, old)
            os.rename(staging / entry.name, target)
            published.append((target, old))
    except BaseException:
        for target, old in reversed(published):  # put back what was there before
            shutil.rmtree(target, ignore_errors=True)
            if old is not None:
                os.rename(old, target)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for target, _ in published:
        stages.note(f"wrote {target}/config.pbtxt")
    return [t for t, _ in published]


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

    Existing non-empty model folders are refused unless ``force``. Bad arguments raise before any work.
    """
    from vit_fast.model import VisionTransformer

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


def dtype_of(config_type: str) -> torch.dtype:
    """torch dtype for a Triton ``TYPE_*`` name (the inverse of :data:`TRITON_TYPES`)."""
    for dtype, name in TRITON_TYPES.items():
        if name == config_type:
            return dtype
    raise ValueError(
        f"no torch dtype for Triton data type {config_type!r}; vit-fast serves {list(TRITON_TYPES.values())}"
    )


__all__ = [
    "DEFAULT_BATCH",
    "ENGINE_SUFFIXES",
    "ONNX_SUFFIXES",
    "EntryConfig",
    "KINDS",
    "ModelEntry",
    "PLATFORMS",
    "TRITON_TYPES",
    "TensorSpec",
    "Batching",
    "batch_plan",
    "check_model_name",
    "check_repository",
    "dtype_of",
    "model_io",
    "model_name_for",
    "onnx_entry",
    "parse_batch_sizes",
    "plan_batching",
    "provenance_comments",
    "tensorrt_entry",
    "to_tritonserver",
    "write_repository",
]
