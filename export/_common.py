"""Shared by every format's build (vit_fast.export.formats), the runners, verification and the bench: the export
errors, argument and output-path checks, the metadata JSON beside an artifact, the one place a model subclass (the
Hugging Face drop-in) becomes the plain module, and the weights record every artifact and report carries. Imports no
format's runtime at import time (dtypes, atomic writes and progress live in vit_fast.util)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit_fast.interop.checkpoints import file_sha256
from vit_fast.util.batches import MAX_BATCH
from vit_fast.util.files import (
    DIGEST_KEY,
    check_output_file,
    check_report_file,
    claim,
    contained_path,
    ownership_note,
    read_head,
    read_json,
    read_json_object,
    refuse_non_utf8,
    written_by_vit_fast,
)

from .formats import format_named, format_of

METADATA_SUFFIX = ".json"
#: native-resolution towers (timm, transformers) that export as they are (vit_fast.export.native), by class name
NATIVE_CLASSES = ("NaFlexVit", "Siglip2VisionModel")
REPORT_SUFFIXES = (".json",)
#: the metadata fields that name a file beside the artifact (kept inside its folder: contained_path)
METADATA_FILE_FIELDS = ("external_data",)


class ExportError(RuntimeError):
    """An export or engine build failed; the message says which step and what to try."""


class ArtifactError(ValueError):
    """An artifact (or the metadata beside it) cannot be read or does not fit this machine."""


def check_batch_range(batch: Any, names: Sequence[str] = ("min", "max")) -> tuple[int, ...]:
    """Validate a batch range: ``len(names)`` ints from 1 to ``MAX_BATCH``, non-decreasing. Returns it as a tuple."""
    what = f"({', '.join(names)})"
    if not isinstance(batch, (tuple, list)) or len(batch) != len(names):
        raise ValueError(f"batch must be a {len(names)}-tuple of ints {what}, got {batch!r}")
    for name, value in zip(names, batch, strict=True):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"batch {what}: {name} must be an int, got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ValueError(f"batch {what}: {name} must be >= 1, got {value}")
        if value > MAX_BATCH:
            raise ValueError(f"batch {what}: {name} {value} is too large: give sizes from 1 to {MAX_BATCH}")
    for i in range(len(names) - 1):
        (n0, v0), (n1, v1) = (names[i], batch[i]), (names[i + 1], batch[i + 1])
        if v0 > v1:
            raise ValueError(f"batch {what} = {tuple(batch)}: {n0} {v0} > {n1} {v1}; need {' <= '.join(names)}")
    return tuple(int(v) for v in batch)


def check_output_path(path: str | os.PathLike) -> Path:
    """The output path, after checking that it is not a folder and that its folder exists and can be written.

    The basic check only: :func:`check_artifact_outputs` and :func:`check_report_path` add the suffix and
    the refusal to replace a file vit-fast did not write."""
    return check_output_file(path, ("",), "output", ours=None)


def is_vit_fast_artifact(path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` itself proves it is an artifact vit-fast wrote: an ONNX file whose
    ``metadata_props`` carry vit-fast's record, or an engine whose bytes hash to the ``sha256`` that
    vit-fast's metadata recorded for it when it wrote them (an engine file cannot carry text of its own).
    The mere presence of a metadata file beside it proves nothing. Only regular files are read."""
    path = Path(path)
    if read_head(path, 0) is None:  # not a regular file (or a link to one): never opened
        return False
    if getattr(format_of(path), "carries_record", False):  # an ONNX file's metadata_props
        try:
            import onnx

            proto = onnx.load(str(path), load_external_data=False)
        except Exception:  # not ONNX at all, or onnx missing: not provably ours
            return False
        return any(p.key == "vit_fast" for p in proto.metadata_props)
    side = metadata_path(path)
    if not written_by_vit_fast(side):
        return False
    recorded = (read_json_object(side) or {}).get("sha256")
    return isinstance(recorded, str) and recorded == file_sha256(path)


def check_artifact_outputs(
    path: str | os.PathLike, kind: str, overwrite: bool = False, external_data: bool = False
) -> Path:
    """Every check on an artifact's output paths made before any work: the artifact (``kind``: a format's name or
    kind, :mod:`.formats`: suffix, folder, parent, writable, an existing file vit-fast did not write), its metadata
    ``PATH.json`` and, with ``external_data``, ``PATH.data``. A ValueError names the path and the fix. An existing
    vit-fast artifact may be replaced, anything else only with ``overwrite``, a folder never; every path is claimed
    (:func:`vit_fast.util.files.claim`). See docs/development.md, section Shared parts."""
    artifact_format = format_named(kind)
    what, suffixes = artifact_format.what, artifact_format.suffixes
    if artifact_format.utf8_paths is not None:  # e.g. onnx.checker and ONNX Runtime (the verification)
        refuse_non_utf8(path, what, artifact_format.utf8_paths)
    path = check_output_file(path, suffixes, what, ours=is_vit_fast_artifact, overwrite=overwrite)
    ours = is_vit_fast_artifact(path) if path.exists() else None
    sidecars = [(metadata_path(path), "metadata")] + (
        [(Path(str(path) + ".data"), "external data")] if external_data else []
    )
    for side, role in sidecars:
        if side.is_dir():
            raise ValueError(
                f"the {role} of {what} {str(path)!r} goes to {str(side)!r}, which is a folder: move it away or "
                "choose another output path"
            )
        if not side.exists() or overwrite:
            continue
        mine = written_by_vit_fast(side) if role == "metadata" else bool(ours)
        if not mine:
            note = ownership_note(side) if role == "metadata" else "it was not written by vit-fast"
            foreign = note.startswith("it was not")
            state = "was not written by vit-fast" if foreign else f"is not provably vit-fast's as written ({note})"
            raise ValueError(
                f"the {role} of {what} {str(path)!r} goes to {str(side)!r}, which exists and {state}; refusing to "
                "replace it: choose another output path, or allow replacing it (overwrite=True; --overwrite on the "
                "command line)"
            )
    for side, _ in sidecars:
        claim(side, overwrite=overwrite)
    return path


def check_report_path(
    path: str | os.PathLike, overwrite: bool = False, artifact: str | os.PathLike | None = None
) -> Path:
    """A JSON report's path, checked before any work (``.json``; a missing folder is made when written);
    never ``artifact``'s own metadata, nor any artifact's (:func:`vit_fast.util.files.check_report_file`)."""
    return check_report_file(path, "report", overwrite=overwrite, artifacts=() if artifact is None else (artifact,))


def plain_model(model: Any, what: str = "export") -> Any:
    """The plain :class:`vit_fast.VisionTransformer` for ``model``: itself, or, for a subclass whose ``forward``
    is not the plain one, its ``as_vit_fast()``; a transformers ViT (``vit_fast.optimize(hf_model)`` is one)
    converted by ``vit_fast.from_hf``. Export, verify and the bench take every model through here; anything else
    is a TypeError saying how to convert it."""
    from vit_fast.model.vit import VisionTransformer

    if type(model).__name__ in NATIVE_CLASSES:  # no VisionTransformer form: exported as it is
        raise TypeError(
            f"{what}: a {type(model).__name__} takes packed patches at each image's size and has no "
            "VisionTransformer form: export it with vit_fast.export.to_onnx (as it is) and check an artifact again "
            "with vit_fast.export.verify_native"
        )
    if type(model).__module__.startswith("transformers."):  # e.g. vit_fast.optimize(hf_model): the user's class
        from vit_fast.interop.convert import from_hf

        return from_hf(model).train(model.training)
    if not isinstance(model, VisionTransformer):
        raise TypeError(
            f"{what} takes a vit_fast.VisionTransformer, got {type(model).__name__}: "
            "convert timm / Hugging Face models first with vit_fast.optimize(model)"
        )
    if type(model).forward is VisionTransformer.forward:
        return model
    as_plain = getattr(model, "as_vit_fast", None)
    if as_plain is None:
        raise TypeError(
            f"{what}: {type(model).__name__} overrides VisionTransformer.forward and has no as_vit_fast() giving "
            "the plain module; pass a plain vit_fast.VisionTransformer"
        )
    return as_plain()


def weights_record(model: Any) -> dict[str, Any]:
    """Where ``model``'s weights came from, as every artifact and report records it: the one-line
    description (``random (seed 0)`` for a preset's random weights) and the ``weights_source`` dict."""
    describe = getattr(model, "describe_weights", None)
    return {
        "description": describe() if describe is not None else "unknown",
        "source": dict(getattr(model, "weights_source", None) or {}),
    }


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
    """The metadata JSON beside ``artifact`` (without the file's own ``vit_fast_digest``, which proves the file, not
    the artifact), or None when there is none; a corrupt file raises naming it, as does one too large, nested too
    deep or holding an integer too long to read (:func:`vit_fast.util.files.read_json`)."""
    path = metadata_path(artifact)
    if not path.exists():
        return None
    try:
        data = read_json(path, "metadata", f" beside {str(artifact)!r}")
    except (OSError, ValueError) as err:
        raise ArtifactError(str(err)) from err
    if not isinstance(data, dict):
        raise ArtifactError(f"metadata {str(path)!r} holds a {type(data).__name__}, expected a JSON object")
    data.pop(DIGEST_KEY, None)
    for field in METADATA_FILE_FIELDS:  # a name that leads out of the artifact's folder is refused for every reader
        if data.get(field) is not None:
            inside(path.parent, data[field], source=path, field=f"field {field!r}")
    return data


def inside(folder: str | os.PathLike, name: Any, *, source: str | os.PathLike, field: str) -> Path:
    """:func:`vit_fast.util.files.contained_path` for artifacts: ``folder / name``, or an ArtifactError naming the
    file ``source``, its ``field`` and the name when the name leads out of ``folder``."""
    try:
        return contained_path(folder, name, source=source, field=field)
    except ValueError as err:
        raise ArtifactError(str(err)) from None


def _node_tensors(nodes: Any) -> Any:
    """Every tensor held in the attributes of ``nodes``, subgraphs included."""
    for node in nodes:
        for attr in node.attribute:
            yield from ([attr.t] if attr.HasField("t") else [])
            yield from attr.tensors
            for sparse in [*([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []), *attr.sparse_tensors]:
                yield from (sparse.values, sparse.indices)
            for sub in [*([attr.g] if attr.HasField("g") else []), *attr.graphs]:
                yield from _graph_tensors(sub)


def _graph_tensors(graph: Any) -> Any:
    """Every tensor an ONNX graph holds: initializers (dense and sparse) and node attributes."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _node_tensors(graph.node)


def external_data_files(onnx_path: str | os.PathLike, proto: Any = None) -> list[str]:
    """The external data files the ONNX file ``onnx_path`` keeps its tensors in, as the graph itself names them (each
    tensor's ``location``; ``proto`` is the file already loaded with ``load_external_data=False``), in order, each
    once: what must travel with the file and what ONNX Runtime will open beside it. Each must stay inside the file's
    folder (:func:`inside`) and be a regular file there; an ArtifactError names the ONNX file, the tensor and the
    name."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    path = Path(onnx_path)
    if proto is None:
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as err:
            raise ArtifactError(f"cannot read {str(path)!r} as an ONNX model: {type(err).__name__}: {err}") from err
    names: dict[str, None] = {}
    tensors = [*_graph_tensors(proto.graph), *(t for f in proto.functions for t in _node_tensors(f.node))]
    for tensor in tensors:
        if not uses_external_data(tensor):
            continue
        location = ExternalDataInfo(tensor).location
        field = f"the external data location of tensor {tensor.name!r}"
        data = inside(path.parent, location, source=path, field=field)
        if location not in names and not data.is_file():
            raise ArtifactError(
                f"{str(path)!r} keeps tensor {tensor.name!r} in external data {location!r}, which is not a file in "
                f"{str(path.parent) or '.'!r}: copy it there beside the ONNX file"
            )
        names[location] = None
    return list(names)


def metadata_batch(meta: dict[str, Any], artifact: str | os.PathLike) -> tuple[int, int]:
    """The ``batch`` range ``artifact``'s metadata records, as (min, max) ints from 1 to ``MAX_BATCH``; an
    ArtifactError naming the file and the field otherwise (a hand-edited or hostile file)."""
    try:
        low, high = check_batch_range(meta.get("batch"))
    except ValueError as err:
        raise ArtifactError(
            f"metadata {str(metadata_path(artifact))!r}: field 'batch' is unusable ({err}): export the artifact "
            "again, or give the batches to use (--batch 1,3; Python: batches=[1, 3])"
        ) from None
    return low, high


def vit_fast_version() -> str:
    from vit_fast import __version__

    return __version__
