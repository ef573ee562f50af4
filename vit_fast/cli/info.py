"""Print the versions of torch, triton, onnx, onnxruntime and tensorrt; for each visible GPU its name,
compute capability and card row (shared memory per block, tensor cores, TMA, native bf16), the backend
that backend="auto" picks there and why, and the dtype bench and demo default to there; and which
backends can run on this machine. Without a GPU it says so: auto runs the torch backend. Then where the C
compiler, Python.h and libcuda.so.1 Triton's launcher needs are, or how to provide a missing one. Last, every
``VIT_FAST_*`` setting vit-fast reads with its value here, and any other ``VIT_FAST_*`` variable set (a typo,
with the closest known name).

  vit-fast info [--json PATH] [--overwrite]
"""

from __future__ import annotations

import argparse

from . import _args

EXAMPLE = "vit-fast info --json info.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``vit-fast info [--json PATH] [--overwrite]``."""
    _args.add_json(parser, "also write the report as JSON to this file (a file vit-fast did not write is kept)")
    _args.add_overwrite(parser)


def run(args: argparse.Namespace) -> int:
    from vit_fast.env import collect_info, format_info
    from vit_fast.files import MARKER_KEY, check_output_file, write_json_atomic
    from vit_fast.kernels._switches import format_settings, settings

    json_path = None
    if args.json is not None:  # checked before anything is collected, as every command's output is
        json_path = _args.output_file(args.json, "--json")
        json_path = check_output_file(json_path, (".json",), "--json", overwrite=args.overwrite, make_parents=True)
    info = collect_info()
    info["settings"] = settings()  # main() refused a switch that is neither on nor off before this
    print(format_info(info))
    print(f"\n{format_settings(info['settings'])}")
    if json_path is not None:
        write_json_atomic({MARKER_KEY: info["vit_fast"], **info}, json_path)
        print(f"\nwrote {json_path}")
    return 0
