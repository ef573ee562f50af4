"""Shared by ONNX export, TensorRT build, the runners and verification: the export errors, argument
and path checks, and the metadata JSON beside an artifact. Nothing here imports onnx, onnxruntime or
tensorrt. (dtypes, atomic writes, progress and the commit have their own homes: vit_fast.dtypes,
vit_fast.files, vit_fast.progress, vit_fast.env.)"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METADATA_SUFFIX = ".json"


class ExportError(RuntimeError):
    """An export or engine build failed; the message says which step and what to try."""


class ArtifactError(ValueError):
    """An artifact (or the metadata beside it) cannot be read or does not fit this machine."""


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
