"""Time backends side by side on the same inputs; write JSON, Markdown and a PNG plot.

Every backend runs in this process on the same input tensors and its output is checked against
the eager "torch" backend's (max abs error in each row). On a GPU: CUDA events after warm-up,
inputs already on the device, optional L2 flush and host-to-device timing, CUDA-graph variants.
On CPU: time.perf_counter, with short defaults. Each result is set next to the best backend at
the same dtype and batch, and next to the physical floor measured on this device:
max(weight bytes / copy bandwidth, FLOPs / matmul rate).

backends:
  torch                     eager PyTorch (vit_fast's torch backend): the reference
  triton                    vit_fast's Triton kernels (CUDA only)
  triton-graph              the triton backend captured with vit_fast.CUDAGraphRunner
  compile                   torch.compile, default mode
  compile-max-autotune      torch.compile(mode="max-autotune") (inductor CUDA graphs on a GPU)
  compile-reduce-overhead   torch.compile(mode="reduce-overhead"), batch 1 only (CUDA only)
  timm                      timm's VisionTransformer (fused SDPA) with the same weights
  onnxruntime               ONNX export run by ONNX Runtime (CUDA EP + I/O binding on a GPU)
  tensorrt                  TensorRT engine built from the ONNX export (needs tensorrt + GPU)
A backend that cannot run here is listed with the reason; one that fails is reported with its
error and the others go on.

examples:
  vit-fast bench vit_base_patch16_224 --batch 1,8,64,256 --dtype bf16,fp16 --backends all --out results/
  vit-fast bench vit_tiny_patch16_224 --batch 1,2 --backends torch --out /tmp/bench   # CPU, seconds
"""

from __future__ import annotations

import argparse
import sys


def _arg_type(parse):  # argparse type= wrapper: BenchError -> a clean "argument --x: ..." error
    def convert(text: str):
        from vit_fast.bench import BenchError

        try:
            return parse(text)
        except BenchError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = parse.__name__
    return convert


def _parse_batches(text: str):
    from vit_fast.bench import parse_batches

    return parse_batches(text)


def _parse_dtypes(text: str):
    from vit_fast.bench import parse_dtypes

    return parse_dtypes(text)


def _parse_backends(text: str):
    from vit_fast.bench import parse_backends

    return parse_backends(text)


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _pos_int(text: str) -> int:
    value = _nonneg_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _pos_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="MODEL", help="a preset name (e.g. vit_base_patch16_224), 'default', or a checkpoint path"
    )
    parser.add_argument(
        "--batch",
        type=_arg_type(_parse_batches),
        default=None,
        metavar="B[,B...]",
        help="batch sizes (default: 1,8,64,256 on a GPU, 1,8 on CPU)",
    )
    parser.add_argument(
        "--dtype",
        type=_arg_type(_parse_dtypes),
        default=None,
        metavar="D[,D...]",
        help="bf16, fp16, fp32, comma-separated (default: bf16 on a GPU, fp32 on CPU)",
    )
    parser.add_argument(
        "--backends",
        type=_arg_type(_parse_backends),
        default=None,
        metavar="NAME[,NAME...]",
        help="backends to time, comma-separated, or 'all' (default: all)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for bench_<model>.{json,md,png}")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument(
        "--warmup", type=_nonneg_int, default=None, help="warm-up calls per case (default: 20 on a GPU, 2 on CPU)"
    )
    parser.add_argument(
        "--iters", type=_pos_int, default=None, help="timed calls per case, at most (default: 200 on a GPU, 10 on CPU)"
    )
    parser.add_argument(
        "--max-seconds",
        type=_pos_float,
        default=None,
        help="cut the timed calls of one case to about this long (default: 10 on a GPU, 3 on CPU)",
    )
    parser.add_argument(
        "--flush-l2",
        action="store_true",
        help="write a buffer larger than the L2 / last-level cache before every timed call",
    )
    parser.add_argument("--h2d", action="store_true", help="also time the host-to-device copy of each input")
    parser.add_argument(
        "--graph", action="store_true", help="also run every PyTorch-based backend captured in a CUDA graph (GPU only)"
    )
    parser.add_argument(
        "--onnx-exporter",
        choices=("dynamo", "torchscript"),
        default="dynamo",
        help="torch.onnx exporter for the onnxruntime/tensorrt backends (default: dynamo)",
    )
    parser.add_argument(
        "--no-ceilings", action="store_true", help="skip measuring bandwidth and matrix rate (no floor column)"
    )
    parser.add_argument(
        "--threads",
        type=_pos_int,
        default=None,
        help="torch CPU threads (default: torch's own; 1 is steadiest on a shared machine)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for preset weights and inputs (default: 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table on stdout")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any backend fails with an error")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vit_fast.bench import BACKENDS, BenchError, BenchSettings, markdown_report, resolve_device, run_benchmark

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr)

    try:
        device = resolve_device(args.device)
    except BenchError as err:
        print(f"vit-fast bench: error: {err}", file=sys.stderr)
        return 2
    cuda = device.type == "cuda"
    settings = BenchSettings(
        model=args.model,
        batches=args.batch or ([1, 8, 64, 256] if cuda else [1, 8]),
        dtypes=args.dtype or (["bf16"] if cuda else ["fp32"]),
        backends=args.backends or list(BACKENDS),
        out_dir=Path(args.out),
        device=str(device),
        warmup=args.warmup,
        iters=args.iters,
        max_seconds=args.max_seconds,
        flush_l2=args.flush_l2,
        h2d=args.h2d,
        graph=args.graph,
        onnx_exporter=args.onnx_exporter,
        seed=args.seed,
        progress=False if args.quiet else None,
        measure_ceilings=not args.no_ceilings,
        threads=args.threads,
    )
    try:
        report, paths = run_benchmark(settings, log=log)
    except BenchError as err:
        print(f"vit-fast bench: error: {err}", file=sys.stderr)
        return 2
    except (KeyError, ValueError, FileNotFoundError) as err:  # model spec that does not resolve
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"vit-fast bench: error: {msg}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(markdown_report(report))
    for kind, path in paths.items():
        log(f"wrote {kind}: {path}")
    statuses = [r["status"] for r in report["rows"]]
    if "ok" not in statuses:
        print("vit-fast bench: error: no backend ran (see the reasons above)", file=sys.stderr)
        return 1
    if args.strict and "error" in statuses:
        return 1
    return 0
