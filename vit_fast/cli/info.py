"""Print the versions of torch, triton, each export format's runtime (onnx, onnxruntime, tensorrt, ...), timm and
transformers; for each visible GPU its name, compute capability and card row (shared memory per block, tensor cores,
TMA, native bf16), the backend that backend="auto" picks there and why, and the dtype bench and demo default to there;
and which backends can run on this machine. Without a GPU it says so: auto runs the torch backend. Then where the C
compiler, Python.h and libcuda.so.1 Triton's launcher needs are, or how to provide a missing one. Last, every
``VIT_FAST_*`` setting vit-fast reads with its value here, and any other ``VIT_FAST_*`` variable set (a typo,
with the closest known name).

  vit-fast info [--json PATH|-] [--overwrite]

``--json -``, or ``--json`` alone, writes the report as JSON to stdout (and the text above to stderr).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from . import _args

if TYPE_CHECKING:
    from vit_fast.backend.env import Runtime

EXAMPLE = "vit-fast info --json info.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``vit-fast info [--json PATH|-] [--overwrite]``."""
    _args.add_json(
        parser, "also write the report as JSON to this file (a file vit-fast did not write is kept)", bare=True
    )
    _args.add_overwrite(parser)


def format_runtimes() -> list[Runtime]:
    """Each export format's runtime, read from the formats' table: its modules, its bench backend's row, the
    status its runner gives (``Runner.status``)."""
    from vit_fast.backend.env import Runtime
    from vit_fast.export.formats import FORMATS

    return [Runtime(f.bench_backend, f.modules, f.load("runner").status) for f in FORMATS.values()]


def run(args: argparse.Namespace) -> int:
    from vit_fast.backend.env import collect_info, format_info
    from vit_fast.base.switches import format_settings, settings
    from vit_fast.util.files import MARKER_KEY

    # checked before anything is collected, as every command's output is
    json_target = _args.json_file(args.json, overwrite=args.overwrite)
    runtimes = format_runtimes()
    info = collect_info(runtimes)
    info["settings"] = settings()  # main() refused a switch that is neither on nor off before this
    print(format_info(info, runtimes))
    print(f"\n{format_settings(info['settings'])}")
    written = _args.write_json({MARKER_KEY: info["vit_fast"], **info}, json_target)
    if written is not None:
        print(f"\nwrote {written}")
    return 0
