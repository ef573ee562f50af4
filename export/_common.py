"""Shared by ONNX export, TensorRT build and verification: argument checks, metadata beside an
artifact, atomic writes into the target folder, progress lines. Nothing here imports onnx,
onnxruntime or tensorrt."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from vit_fast._atomic import write_atomic
from vit_fast.info import git_commit  # noqa: F401  (re-exported: export metadata records it)

#: names a user may give for each supported artifact dtype
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES: dict[torch.dtype, str] = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

METADATA_SUFFIX = ".json"


class ExportError(RuntimeError):
    """An export or engine build failed; the message says which step and what to try."""


class ArtifactError(ValueError):
    """An artifact (or the metadata beside it) cannot be read or does not fit this machine."""


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` / ``"fp16"`` / ``"bfloat16"`` ... as a torch dtype (one of fp32, fp16, bf16)."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPE_NAMES:
            return dtype
    elif isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.lower().removeprefix("torch.")]
    raise ValueError(
        f"dtype must be one of torch.float32, torch.float16, torch.bfloat16 (or fp32/fp16/bf16), got {dtype!r}"
    )


def check_batch_range(batch: Any, names: Sequence[str] = ("min", "max")) -> tuple[int, ...]:
    """Validate a batch range: ``len(names)`` ints, each >= 1, non-decreasing. Returns it as a tuple."""
    what = f"({', '.join(names)})"
    if not isinstance(batch, (tuple, list)) or len(batch) != len(names):
        raise ValueError(f"batch must be a {len(names)}-tuple of ints {what}, got {batch!r}")
    for name, value in zip(names, batch, strict=True):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"batch {what}: {name} must be an int, got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ValueError(f"batch {what}: {name} must be >= 1, got {value}")
    for i in range(len(names) - 1):
        (n0, v0), (n1, v1) = (names[i], batch[i]), (names[i + 1], batch[i + 1])
        if v0 > v1:
            raise ValueError(f"batch {what} = {tuple(batch)}: {n0} {v0} > {n1} {v1}; need {' <= '.join(names)}")
    return tuple(int(v) for v in batch)


def check_output_path(path: str | os.PathLike) -> Path:
    """The output path, after checking that its folder exists and can be written (before any work)."""
    path = Path(path)
    if path.exists() and path.is_dir():
        raise ValueError(f"output {str(path)!r} is a folder; give a file path such as {str(path / 'model.onnx')!r}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"output folder {str(folder)!r} does not exist: create it first (mkdir -p {folder})")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"output folder {str(folder)!r} cannot be written: {err.strerror or err}") from err
    return path


def check_readable_file(path: str | os.PathLike, what: str = "file") -> Path:
    """Raise a FileNotFoundError / ArtifactError naming ``path`` unless it is a readable file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    if not path.is_file():
        raise ArtifactError(f"{what} {str(path)!r} is not a file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as err:
        raise ArtifactError(f"{what} {str(path)!r} cannot be read: {err.strerror or err}") from err
    return path


# --------------------------------------------------------------------------- metadata
def metadata_path(artifact: str | os.PathLike) -> Path:
    """The JSON file written beside an artifact: ``model.onnx`` -> ``model.onnx.json``."""
    return Path(str(artifact) + METADATA_SUFFIX)


def read_metadata(artifact: str | os.PathLike) -> dict[str, Any] | None:
    """The metadata JSON beside ``artifact``, or None when there is none; a corrupt file raises naming it."""
    path = metadata_path(artifact)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"metadata {str(path)!r} beside {str(artifact)!r} cannot be read as JSON: {err}") from err
    if not isinstance(data, dict):
        raise ArtifactError(f"metadata {str(path)!r} holds a {type(data).__name__}, expected a JSON object")
    return data


def vit_fast_version() -> str:
    from vit_fast import __version__

    return __version__


# --------------------------------------------------------------------------- atomic writes
@contextlib.contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """A private temporary folder beside ``target``; removed with everything in it on exit.

    Files are written there under their final names and moved into place with :func:`commit`
    (``os.replace`` within one file system), so a failure leaves nothing at or beside the target.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def commit(staged: Sequence[Path], folder: Path) -> list[Path]:
    """Move staged files into ``folder`` in order (data first, the model, its metadata last).

    If a move fails, the files already moved are removed again, so the target is never half-written.
    """
    moved: list[Path] = []
    try:
        for src in staged:
            dst = folder / src.name
            os.replace(src, dst)
            moved.append(dst)
    except BaseException:
        for dst in moved:
            dst.unlink(missing_ok=True)
        raise
    return moved


def write_json_atomic(data: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``data`` as indented JSON to ``path`` through a temporary file in the same folder."""
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


# --------------------------------------------------------------------------- progress
class Stages:
    """Progress as one line per step on stderr: ``[vit-fast export] tracing ... done (6.2 s)``."""

    def __init__(self, prefix: str, enabled: bool = True) -> None:
        self.prefix = prefix
        self.enabled = enabled

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        start = time.perf_counter()
        if self.enabled:
            print(f"[{self.prefix}] {text} ...", file=sys.stderr, flush=True)
        yield
        if self.enabled:
            print(f"[{self.prefix}] {text}: done ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if self.enabled:
            print(f"[{self.prefix}] {text}", file=sys.stderr, flush=True)
