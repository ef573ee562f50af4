"""What a source makes of a model repository: :func:`entries_for` (a ViT's ONNX and python entries, an ONNX
file's or an engine's entry), the one dispatch ``vit-fast export tritonserver`` and :func:`to_tritonserver` share."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from . import python_backend
from .checks import check_model_name, model_name_for
from .config import DEFAULT_QUEUE_DELAY_US, ENGINE_SUFFIXES, ONNX_SUFFIXES
from .entries import onnx_entry, tensorrt_entry
from .layout import ModelEntry, check_repository, write_repository

#: the entries a model source can make: its verified ONNX file, and the module itself on Triton's python backend
ENTRIES = ("onnx", "python")


def entry_names(name: str, entries: Sequence[str]) -> list[str]:
    """The model folders ``entries`` of a model named ``name`` (checked as given) make: ``NAME`` (onnx),
    ``NAME_python`` (python)."""
    check_model_name(name)
    return ([name] if "onnx" in entries else []) + ([f"{name}_python"] if "python" in entries else [])


def entries_for(
    source: nn.Module | str | os.PathLike,
    name: str,
    entries: Sequence[str] = ("onnx",),
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
) -> list[ModelEntry]:
    """The entries ``source`` makes, each checked before any work: for a :class:`vit_fast.VisionTransformer`,
    ``entries`` of :data:`ENTRIES` (``NAME``: :func:`onnx_entry`; ``NAME_python``: :func:`python_entry`); for an
    ``.onnx`` file its :func:`onnx_entry`, for a TensorRT engine its :func:`tensorrt_entry` (``entries`` "onnx")."""
    from vit_fast.model.vit import VisionTransformer

    unknown = [e for e in entries if e not in ENTRIES]
    if not entries or unknown:
        raise ValueError(f"entries must be some of {', '.join(ENTRIES)}, got {list(entries)!r}")
    common = dict(batch=batch, instances=instances, kind=kind, queue_delay_us=queue_delay_us)
    checked = dict(verify=verify, model=model, seed=seed, progress=progress, verify_batches=verify_batches)
    suffix = "" if isinstance(source, VisionTransformer) else Path(str(source)).suffix.lower()
    if not isinstance(source, VisionTransformer) and suffix not in (*ONNX_SUFFIXES, *ENGINE_SUFFIXES):
        raise ValueError(
            f"cannot tell what {str(source)!r} is: give a vit_fast.VisionTransformer, an .onnx file or a TensorRT "
            f"engine ({', '.join(ENGINE_SUFFIXES)})"
        )
    if suffix and list(dict.fromkeys(entries)) != ["onnx"]:
        raise ValueError(f"the python entry serves a model, not an artifact: {str(source)!r} makes its own entry only")
    if suffix in ENGINE_SUFFIXES:
        return [tensorrt_entry(source, name, **common)]
    made = []
    if "onnx" in entries:
        made.append(onnx_entry(source, name, dtype=dtype, source_name=source_name, **checked, **common))
    if "python" in entries:
        python = python_backend.python_entry  # looked up when called: tests put a stand-in there
        made.append(python(source, f"{name}_python", dtype=dtype, source_name=source_name, **common))
    return made


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
    """Write a Triton model repository entry for ``source`` into ``repo``; returns the model folders. ``source``: a
    :class:`vit_fast.VisionTransformer` (exported to ONNX on the spot and verified), an ``.onnx`` file, or a TensorRT
    engine (``.plan`` / ``.engine``) with its vit-fast metadata. ``name``, ``batch``, ``instances`` x ``kind``,
    ``queue_delay_us``, ``extra``, ``verify_batches``: docs/deploy.md, section "A model repository for Triton
    Inference Server". Existing non-empty model folders are refused unless ``force``. Bad arguments raise first."""
    from vit_fast.model.vit import VisionTransformer

    if name is None:
        name = model_name_for(source_name or ("vit" if isinstance(source, VisionTransformer) else source))
    kwargs = dict(batch=batch, dtype=dtype, instances=instances, kind=kind, queue_delay_us=queue_delay_us)
    kwargs |= dict(verify=verify, model=model, seed=seed, source_name=source_name, progress=progress)
    [entry] = entries_for(source, name, verify_batches=verify_batches, **kwargs)
    check_repository(repo, [entry.name, *(e.name for e in extra)], force)
    return write_repository(repo, [entry, *extra], force=force, progress=progress)
