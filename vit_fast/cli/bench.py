"""Time backends side by side on the same inputs; write JSON, Markdown and a PNG plot.

Every backend runs in this process on the same input tensors and its output is checked against
the eager "torch" backend's (max abs error in each row). On a GPU: CUDA events after warm-up,
inputs already on the device, optional L2 flush and host-to-device timing, CUDA-graph variants.
On CPU: time.perf_counter. Each case runs at least --min-samples calls and --min-time seconds
(the sample count n is in every row). Each result is set next to the best backend at
the same dtype and batch, and next to the physical floor measured on this device:
max(weight bytes / copy bandwidth, FLOPs / matmul rate).

  vit-fast bench MODEL --out DIR [--batch 1,8,64] [--dtype bf16,fp16] [--backends torch,triton]
                                 [--device cuda] [--graph] [--h2d] [--flush-l2] [--json PATH|-] [--seed 0]
                                 [--min-samples 100] [--min-time 1] [--threads T] [--tune] [--overwrite]
  vit-fast bench model.onnx|model.plan --out DIR     (time an artifact you already have)
  vit-fast bench MODEL --json -|PATH                 (the JSON report alone, no --out folder)

backends:
  torch                     eager PyTorch (vit_fast's torch backend): the reference
  triton                    vit_fast's Triton kernels (CUDA only), with the heuristic configs a user
                            gets by default; --tune times them tuned (model.warmup(tune=True), as
                            compile-max-autotune tunes inductor's). A case whose ops fell back to eager
                            PyTorch at their first-use check is marked "fallback", never timed as triton
  triton-graph              the triton backend captured with vit_fast.CUDAGraphRunner
  compile                   torch.compile, default mode
  compile-max-autotune      torch.compile(mode="max-autotune") (inductor CUDA graphs on a GPU)
  compile-reduce-overhead   torch.compile(mode="reduce-overhead"), batch 1 only (CUDA only)
  timm                      timm's VisionTransformer (fused SDPA) with the same weights
  hf                        transformers' ViT (attn_implementation="sdpa") with the same weights
  onnxruntime               ONNX export run by ONNX Runtime (CUDA EP + I/O binding on a GPU)
  tensorrt                  TensorRT engine built from the ONNX export (needs tensorrt + GPU)
A backend that cannot run here is listed with the reason; one that fails is reported with its
error and the others go on.

With --json - the JSON report goes to stdout and the Markdown table and progress to stderr.
Each case's result is printed as it finishes, and the JSON, Markdown and CSV are rewritten after each
one (the JSON says "complete": false until the end). Ctrl-C or SIGTERM (``timeout``) stops the run and
keeps the cases that finished in those files (and the PNG), marked "interrupted by SIGTERM after 5 of 18
cases"; it exits 130 (Ctrl-C) or 143 (SIGTERM).

Exits 0 when at least one backend ran (with --strict: and none failed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from . import _args

EXAMPLE = "vit-fast bench vit_base_patch16_224 --batch 1,8,64,256 --dtype bf16,fp16 --backends all --out results/"


def _backend_list(text: str) -> list[str]:
    """The ``--backends`` type: comma-separated names from BACKENDS, or 'all'."""
    from vit_fast.bench import parse_backends

    try:
        return parse_backends(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: how many calls and how long each case is timed: (flag, type, metavar, help); the settings give the defaults
TIMING_FLAGS = (
    ("--warmup", _args.nonnegative_int, None, "warm-up calls per case (default: 20 on a GPU, 2 on CPU)"),
    (
        "--min-samples",
        _args.positive_int,
        None,
        "at least this many timed calls per case (default: 200 on a GPU, 100 on CPU) ...",
    ),
    (
        "--min-time",
        _args.positive_float,
        "SECONDS",
        "... and at least this many seconds of them (default 1), as trtexec does",
    ),
    ("--max-samples", _args.positive_int, None, "at most this many timed calls per case (default 10000)"),
    (
        "--max-seconds",
        _args.positive_float,
        None,
        "and at most about this long per case (default: 10 on a GPU, 30 on CPU)",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast bench``'s arguments."""
    parser.add_argument(
        "model",
        metavar="MODEL",
        help=_args.MODEL_HELP + "; or an .onnx / .plan / .engine artifact, timed with its own runtime",
    )
    _args.add_batches(parser, "default: 1,8,64,256 on a GPU, 1,8 on CPU")
    _args.add_dtypes(
        parser,
        "bf16, fp16, fp32, comma-separated (default: one the card runs natively: bf16 on sm_80 and up, fp16 "
        "on a GPU without native bf16 such as the T4, where bf16 is refused; fp32 on CPU)",
    )
    parser.add_argument(
        "--backends",
        type=_backend_list,
        default=None,
        metavar="NAME[,NAME...]",
        help="backends to time, comma-separated, or 'all' (default: all)",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for bench_<model>.{json,md,csv,png} (an earlier run's files are kept); may be left out with "
        "--json, which then gets the JSON report alone",
    )
    _args.add_json(parser, "also write the JSON report (bench_<model>.json) to this file")
    _args.add_device(parser, "auto", "auto (CUDA when available), cpu, cuda or cuda:N")
    _args.add_optional(parser, TIMING_FLAGS)
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
        type=_args.positive_int,
        default=None,
        metavar="T",
        help="CPU threads for every CPU backend alike (torch and ONNX Runtime), recorded in each row "
        "(default: the cores the load average leaves free)",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="time the triton backends tuned (every candidate config compiled and timed first: minutes per batch "
        "size on a fresh cache) instead of with the heuristic configs a user gets by default",
    )
    _args.add_overwrite(parser)
    _args.add_seed(parser, 0, "preset weights and inputs")
    _args.add_model_source(parser)
    parser.add_argument(
        "--quiet", action="store_true", help="no progress, no table on stdout; the files written are still named"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when any backend fails with an error")


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast bench``; 0 when a backend ran, 1 when none did (or, with --strict, one failed)."""

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr)

    out_dir = None if args.out is None else _args.output_folder(args.out)
    json_target = _args.json_file(args.json, overwrite=args.overwrite)  # the one output policy, before any work
    if out_dir is None and json_target is None:
        raise _args.CommandError(
            "bench writes its reports into a folder: give --out DIR, or --json - (or --json FILE) for the JSON report "
            "alone"
        )
    if out_dir is None:  # the reports are built in a private folder that goes when the run ends; --json gets its copy
        from vit_fast.util.files import temp_staging

        with temp_staging("vit-fast-bench-reports") as folder:
            return _run(args, folder, json_target, log, kept=False)
    return _run(args, out_dir, json_target, log, kept=True)


def _run(args: argparse.Namespace, out_dir: Path, json_target: Path | str | None, log: Callable, kept: bool) -> int:
    """The benchmark itself, its reports in ``out_dir``; ``kept``: whether that folder is the user's (its files
    are then named), not a private one."""
    from vit_fast.bench import BenchSettings, markdown_report, resolve_device, run_benchmark

    device = resolve_device(args.device)
    model = args.model
    if args.config is not None or args.weights is not None:
        from vit_fast.interop.loading import load_model

        model = load_model(args.model, backend="torch", seed=args.seed, config=args.config, weights=args.weights)
    settings = BenchSettings(
        model=model,
        batches=args.batch,  # None: the device's defaults (an artifact: its own range)
        dtypes=args.dtype,
        backends=args.backends,
        out_dir=out_dir,
        device=str(device),
        warmup=args.warmup,
        iters=args.max_samples,
        max_seconds=args.max_seconds,
        min_samples=args.min_samples,
        min_time_s=args.min_time,
        overwrite=args.overwrite,
        flush_l2=args.flush_l2,
        h2d=args.h2d,
        graph=args.graph,
        onnx_exporter=args.onnx_exporter,
        seed=args.seed,
        progress=False if args.quiet else None,
        measure_ceilings=not args.no_ceilings,
        threads=args.threads,
        tune=args.tune,
    )
    from vit_fast.util.interrupts import INTERRUPTS, held

    try:  # the files are named after MODEL as typed, also when --config/--weights made it a loaded module
        report, paths = run_benchmark(settings, log=log, name=args.model)
    except INTERRUPTS as err:  # the cases that finished are on disk: say where (main says it was interrupted)
        paths = dict(getattr(err, "bench_paths", None) or {})
        partial = "" if (getattr(err, "bench_report", None) or {}).get("complete") else " (partial)"
        with held():
            if "json" in paths:
                copied = _args.copy_json(paths["json"], json_target)
                if copied is not None:
                    paths["json copy"] = copied
            for kind, path in paths.items():
                if kept or kind == "json copy":
                    print(f"wrote {kind}{partial}: {path}", file=sys.stderr)
        raise
    if not args.quiet:
        print(markdown_report(report))
    copied = _args.copy_json(paths["json"], json_target)
    if copied is not None:
        paths["json copy"] = copied
    for kind, path in paths.items():  # even under --quiet: a rerun's files carry a run id, so say which
        if kept or kind == "json copy":
            print(f"wrote {kind}: {path}", file=sys.stderr)
    statuses = [r["status"] for r in report["rows"]]
    if "ok" not in statuses:
        raise _args.CommandError("no backend ran (see the reasons above)")
    return 1 if args.strict and "error" in statuses else 0
