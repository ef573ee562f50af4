"""Build a deployment artifact, verify it against eager PyTorch, and write a report.

  vit-fast export onnx MODEL --out model.onnx [--batch 1,64] [--dtype fp16] [--exporter dynamo]
                                               [--attention fused] [--dynamic-size] [--opset 18]
                                               [--seed 0] [--json report.json]
  vit-fast export tensorrt model.onnx --out model.plan [--batch 1,8,64] [--dtype fp16]

MODEL is "default" (the embedded model), a preset name (random weights, fixed seed) or a
checkpoint path. Missing folders of --out and --json are created. Metadata is written beside
each artifact (PATH.json). An artifact that fails verification is removed; the exit status is
then 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit_fast.config import PRESETS
from vit_fast.export._common import metadata_path
from vit_fast.export.onnx import check_onnx_args, to_onnx
from vit_fast.export.tensorrt import to_tensorrt
from vit_fast.export.verify import verify
from vit_fast.loading import load_model

from . import _args

EXAMPLE = "vit-fast export onnx default --out artifacts/digits.onnx --batch 1,64 --dtype fp16"
ONNX_EXAMPLE = "vit-fast export onnx vit_base_patch16_224 --out vitb16.onnx --batch 1,64 --dtype fp16 --json v.json"
TENSORRT_EXAMPLE = "vit-fast export tensorrt vitb16.onnx --out vitb16.plan --batch 1,8,64 --dtype fp16"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``onnx``, ``tensorrt`` and ``tritonserver`` sub-commands to ``vit-fast export``."""
    from . import add_subcommand

    sub = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    p = add_subcommand(sub, "onnx", None, "export MODEL to an ONNX file and verify it with ONNX Runtime", ONNX_EXAMPLE)
    p.add_argument("model", metavar="MODEL", help='"default", a preset name, or a checkpoint path')
    p.add_argument("--out", required=True, help="the .onnx file to write (metadata goes to OUT.json)")
    p.add_argument(
        "--batch", type=_args.batch_list("MIN", "MAX"), default=[1, 64], metavar="MIN,MAX", help="batch range (1,64)"
    )
    p.add_argument("--dtype", type=_args.dtype_name, default="fp32", help="weights and input: fp32, fp16, bf16 (fp32)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (18; 23 with --attention fused)")
    p.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo", help="torch exporter (dynamo)")
    p.add_argument(
        "--attention",
        choices=("decomposed", "fused"),
        default="decomposed",
        help="fused: one ONNX Attention node per block (opset 23, dynamo)",
    )
    p.add_argument("--dynamic-size", action="store_true", help="symbolic image height and width")
    p.add_argument("--no-verify", action="store_true", help="skip verification with ONNX Runtime")
    _args.add_json(p, "write the verification report as JSON to this file")
    _args.add_seed(p, None, "the random verification inputs")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    t = add_subcommand(
        sub, "tensorrt", None, "build a TensorRT engine from an ONNX file and verify it", TENSORRT_EXAMPLE
    )
    t.add_argument("onnx", metavar="ONNX", help="an ONNX file written by vit-fast export onnx")
    t.add_argument("--out", required=True, help="the engine file to write (.plan; metadata goes to OUT.json)")
    t.add_argument(
        "--batch",
        type=_args.batch_list("MIN", "OPT", "MAX"),
        default=[1, 8, 64],
        metavar="MIN,OPT,MAX",
        help="optimization profile (1,8,64)",
    )
    t.add_argument("--dtype", type=_args.dtype_name, default="fp16", help="engine precision: fp16, bf16, fp32 (fp16)")
    t.add_argument("--timing-cache", default=None, help="timing cache file, reused across builds")
    t.add_argument("--workspace-gib", type=_args.positive_float, default=None, help="builder workspace limit in GiB")
    t.add_argument("--model", default=None, help="model to verify against (default: the ONNX metadata's source)")
    t.add_argument("--no-verify", action="store_true", help="skip verification")
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    from . import tritonserver

    r = add_subcommand(
        sub,
        "tritonserver",
        tritonserver.__doc__,
        "write a Triton Inference Server model repository",
        tritonserver.EXAMPLE,
    )
    tritonserver.add_arguments(r)


def _source_name(spec: str) -> str:
    """How the metadata names the model: presets and "default" as they are, files by absolute path."""
    if spec in PRESETS or spec in ("default", "embedded") or not Path(spec).exists():
        return spec
    return str(Path(spec).resolve())


def _run_onnx(args: argparse.Namespace) -> int:
    if not args.no_verify and args.dtype == "bf16":
        raise _args.CommandError(
            "bf16 ONNX files cannot be verified on ONNX Runtime (its CPU provider has no bf16 Conv, and its Python "
            "API no bf16 arrays): export with --dtype fp16 or fp32, or pass --no-verify and verify the TensorRT "
            "engine built from it"
        )
    model = load_model(args.model, backend="torch")
    batch = tuple(args.batch)
    check_onnx_args(model, batch, args.dtype, args.opset, args.exporter, args.dynamic_size, args.attention)
    out = _args.output_file(args.out, "--out")
    json_path = _args.output_file(args.json, "--json")
    out.parent.mkdir(parents=True, exist_ok=True)  # checked above; made only now that the work starts
    to_onnx(
        model,
        out,
        batch=batch,
        dtype=args.dtype,
        opset=args.opset,
        exporter=args.exporter,
        dynamic_size=args.dynamic_size,
        attention=args.attention,
        source=_source_name(args.model),
        progress=not args.quiet,
    )
    if args.no_verify:
        print(f"wrote {out} (not verified)")
        return 0
    try:
        verify(model, out, seed=args.seed, json_path=json_path)
    except Exception:  # a numeric failure or an artifact that cannot run: either way it is not verified
        for f in (out, metadata_path(out), Path(str(out) + ".data")):
            f.unlink(missing_ok=True)
        print(f"removed {out}: it did not pass verification", file=sys.stderr)
        raise
    print(f"wrote {out}: verified")
    return 0


def _run_tensorrt(args: argparse.Namespace) -> int:
    out = _args.output_file(args.out, "--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    to_tensorrt(
        args.onnx,
        out,
        batch=tuple(args.batch),
        precision=args.dtype,
        timing_cache=args.timing_cache,
        workspace_gib=args.workspace_gib,
        model=args.model,
        verify=not args.no_verify,
        progress=not args.quiet,
    )
    print(f"wrote {args.out}" + (" (not verified)" if args.no_verify else ": verified"))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast export onnx|tensorrt|tritonserver``; 0 on success (a failure raises)."""
    if args.target == "tritonserver":
        from . import tritonserver

        return tritonserver.run(args)
    return _run_onnx(args) if args.target == "onnx" else _run_tensorrt(args)
