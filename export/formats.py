"""The export formats, one entry each: name, suffixes, extra, the modules it installs, the function that builds one,
the runner that runs one, what verifies it and the bench backend that times it. What picks by format reads this
table: the CLI's subcommands, the missing-module hint and ``vit-fast info``, the artifact opener (and with it verify),
the output checks, the bench and the file policy's suffixes. Importing it imports no runtime (an entry's build and
runner are imported when first used). Adding a format: docs/development.md, "Adding an export format"."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_fast.util.files import register_artifact_format


@dataclass(frozen=True)
class ArtifactFormat:
    """One export format. ``build`` and ``runner`` are ``"module:name"``, a module of ``vit_fast.export`` (or a
    dotted module path), imported on use."""

    name: str  # the command line's ``vit-fast export NAME`` and the metadata's ``format``
    what: str  # what one file is called in messages
    suffixes: tuple[str, ...]  # the file's suffixes, the first the usual one
    kind: str  # the short word for one file (``check_artifact_outputs``'s kind)
    extra: str  # the pyproject extra that installs its runtime
    modules: tuple[str, ...]  # the modules that extra installs (the missing-module hint, vit-fast info's versions)
    build: str  # the function that writes one, verified before it is published
    runner: str  # the Runner class that runs one (its ``open_file``)
    verify: str  # what runs it when it is verified
    bench_backend: str  # the bench backend that times it
    summary: str  # the one-line help of ``vit-fast export NAME``
    utf8_paths: str | None = None  # what opens the file and takes UTF-8 paths only, if anything does
    carries_record: bool = False  # the file holds vit-fast's record itself (else the metadata's sha256 proves it)

    def load(self, attribute: str) -> Any:
        """The object ``self.build`` or ``self.runner`` names, its module imported now."""
        module, _, name = getattr(self, attribute).partition(":")
        return getattr(importlib.import_module(module if "." in module else f"vit_fast.export.{module}"), name)


FORMATS: dict[str, ArtifactFormat] = {
    f.name: f
    for f in (
        ArtifactFormat(
            name="onnx",
            what="ONNX file",
            suffixes=(".onnx",),
            kind="onnx",
            extra="onnx",
            modules=("onnx", "onnxruntime", "onnxscript"),
            build="onnx:to_onnx",
            runner="runners:OrtRunner",
            verify="ONNX Runtime",
            bench_backend="onnxruntime",
            summary="export MODEL to an ONNX file and verify it with ONNX Runtime",
            utf8_paths="onnx.checker or ONNX Runtime",
            carries_record=True,
        ),
        ArtifactFormat(
            name="tensorrt",
            what="TensorRT engine",
            suffixes=(".plan", ".engine", ".trt"),
            kind="engine",
            extra="tensorrt",
            modules=("tensorrt", "polygraphy"),
            build="tensorrt:to_tensorrt",
            runner="runners:EngineRunner",
            verify="TensorRT on the GPU",
            bench_backend="tensorrt",
            summary="build a TensorRT engine from an ONNX file and verify it",
        ),
    )
}
#: every suffix an artifact may have, in the table's order
ARTIFACT_SUFFIXES = tuple(s for f in FORMATS.values() for s in f.suffixes)

for _format in FORMATS.values():  # the file policy knows formats only as registered here
    register_artifact_format(_format.name, _format.suffixes)


def format_named(name: str) -> ArtifactFormat:
    """The format called ``name`` (or whose ``kind`` is ``name``); a ValueError lists the formats otherwise."""
    for f in FORMATS.values():
        if name in (f.name, f.kind):
            return f
    raise ValueError(f"no export format {name!r}; the formats are {', '.join(FORMATS)}")


def format_of(path: str | os.PathLike) -> ArtifactFormat | None:
    """The format a file is by its suffix (case-insensitively), or None."""
    suffix = Path(path).suffix.lower()
    return next((f for f in FORMATS.values() if suffix in f.suffixes), None)


def suffix_choices() -> str:
    """The suffixes of every format, in words for a refusal: ``.onnx for ONNX files or .plan, ... for ...``."""
    return " or ".join(f"{', '.join(f.suffixes)} for {f.what}s" for f in FORMATS.values())


def bench_format(backend: str) -> ArtifactFormat | None:
    """The format the bench backend ``backend`` times, or None for a backend that runs the model itself."""
    return next((f for f in FORMATS.values() if f.bench_backend == backend), None)


__all__ = [
    "ARTIFACT_SUFFIXES",
    "FORMATS",
    "ArtifactFormat",
    "bench_format",
    "format_named",
    "format_of",
    "suffix_choices",
]
