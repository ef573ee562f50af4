"""The ``vit-fast`` command line: info, demo, export, verify, bench."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module that defines add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("vit_fast.demo", "the main job on the embedded default model: accuracy, backends, export, timing"),
    "export": ("vit_fast.cli.export", "build an ONNX or TensorRT artifact, verify it, write a report"),
    "verify": ("vit_fast.cli.verify", "compare an ONNX file, TensorRT engine or the triton backend with eager"),
    "bench": ("vit_fast.cli.bench", "time backends side by side; write JSON, Markdown and a PNG plot"),
}


def _info(args: argparse.Namespace) -> int:
    from vit_fast.env import collect_info, format_info

    print(format_info(collect_info()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from vit_fast import __version__

    parser = argparse.ArgumentParser(
        prog="vit-fast",
        description="Fast Vision Transformers on NVIDIA GPUs: Triton kernels, verified ONNX/TensorRT export, "
        "honest benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"vit-fast {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser(
        "info",
        help="versions, GPU, and which backends can run here",
        description="Print versions of torch, triton, onnx, onnxruntime and tensorrt, the GPU's "
        "name and compute capability, and which backends can run on this machine.",
    )
    info.set_defaults(func=_info)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(
            name,
            help=help_text,
            description=(module.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
