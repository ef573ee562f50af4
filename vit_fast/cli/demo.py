"""Run the main job end to end on the embedded default model (a small ViT trained on
scikit-learn's handwritten digits, shipped in vit_fast/assets) and report what it measured.

  vit-fast demo [--out DIR] [--device auto|cpu|cuda] [--subset 16] [--seed 0] [--json PATH|-] [--no-plots]

Steps, each reported as ok / failed / skipped (with the reason):

  1. accuracy   held-out accuracy with the torch backend, against the recorded value
  2. triton     our Triton kernels judged by `vit-fast verify MODEL triton`: max |error| on random
                inputs against the rule, top-1 agreement and accuracy on held-out images. On a GPU:
                compiled, the whole held-out set. Without one: Triton's interpreter on --subset
                images, in a child process started with TRITON_INTERPRET=1
  3. onnx       export with vit_fast.export.to_onnx, verify on ONNX Runtime (accuracy delta,
                max |error|, top-1 agreement)
  4. timing     eager torch vs ONNX Runtime, batch 1 and the whole held-out batch (CPU wall-clock,
                median of --repeats runs)
  5. gpu        on a CUDA machine only: a CUDA-graph replay of the triton model and ViT-B/16
                latency, torch vs triton (CUDA events), in a dtype the card runs natively (bf16;
                fp16 on a card without native bf16, such as the T4)
  6. figures    pictures of what the steps measured, shown in report.md: patches.png (digits cut
                into their patch grid, and the token sequence the model reads), attention.png (the
                class token's attention in the last block, per head; torch backend), confusion.png
                (held-out confusion matrix), timing.png (step 4's medians, p10-p90 whiskers).
                Skipped under --no-plots, or with a one-line note when matplotlib is missing

Prints a summary table (stdout; stderr with --json -, which puts the JSON report on stdout; progress goes to
stderr) and writes report.json and report.md (plus the ONNX artifact, published only once verified, its report
digits_vit.verify.json and the pictures) into --out, creating it if needed. A file there that vit-fast did not
write is kept: the demo refuses to start unless --overwrite. report.json and report.md are rewritten as each step
ends ("complete": false until the last), so Ctrl-C or SIGTERM keeps the steps that ended there, marked
"interrupted" (exit 130 or 143). Exits 0 when no step failed, 1 when one did, 2 for bad arguments. Needs
scikit-learn and matplotlib (the demo extra: pip install -e '.[demo]' in a vit-fast checkout) and, for step 3,
the onnx extra.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from vit_fast.demo.settings import DEFAULT_OUT, ONNX_NAME, DemoSettings

from . import _args

EXAMPLE = "vit-fast demo --out vit-fast-out/demo --subset 8"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast demo``'s arguments."""
    d = DemoSettings()
    out_help = f"folder for report.json, report.md, the pictures and the ONNX file (default {DEFAULT_OUT})"
    parser.add_argument("--out", default=DEFAULT_OUT, help=out_help)
    _args.add_json(parser)
    _args.add_device(
        parser,
        d.device,
        "where the triton and GPU steps run (auto: cuda when a GPU is visible)",
        ("auto", "cpu", "cuda"),
    )
    parser.add_argument(
        "--subset",
        type=_args.positive_int,
        default=d.subset,
        metavar="N",
        help=f"held-out images for the triton step under the CPU interpreter (default {d.subset}; "
        "~1 s each on an idle 2-core CPU); on a GPU the whole set runs",
    )
    _args.add_child_timeout(parser, "--triton-timeout", d.triton_timeout, "before the step fails")
    parser.add_argument("--skip-triton", action="store_true", help="skip step 2")
    parser.add_argument("--skip-onnx", action="store_true", help="skip step 3 (and ONNX Runtime in step 4)")
    parser.add_argument("--skip-timing", action="store_true", help="skip step 4")
    parser.add_argument("--no-plots", action="store_true", help="draw no pictures (step 6)")
    parser.add_argument(
        "--exporter", choices=("dynamo", "torchscript"), default=d.exporter, help="ONNX exporter (default dynamo)"
    )
    parser.add_argument("--opset", type=_args.opset, default=d.opset, help=f"ONNX opset (default {d.opset})")
    parser.add_argument(
        "--repeats",
        type=_args.positive_int,
        default=d.repeats,
        metavar="R",
        help=f"timed runs per case (batch 1 runs 4x as many); default {d.repeats}",
    )
    _args.add_threads(parser, "ONNX Runtime gets the same number")
    _args.add_seed(parser, d.seed, "the random verification inputs and the ViT-B/16 weights")
    _args.add_overwrite(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast demo``; prints the table, returns 0 when no step failed, else 1."""
    from vit_fast.demo import format_table, run_demo

    out = _args.output_folder(args.out)
    # the one output policy, before any step
    json_target = _args.json_file(args.json, overwrite=args.overwrite, artifacts=(out / ONNX_NAME,))
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(DemoSettings) if f.name != "out"}
    from vit_fast.util.interrupts import INTERRUPTS, held

    try:
        report = run_demo(DemoSettings(out=out, **fields))
    except INTERRUPTS:  # report.json keeps the steps that ended (run_demo said so): the --json copy too
        if (out / "report.json").is_file():
            with held():
                _args.copy_json(out / "report.json", json_target)
        raise
    failed = report["failed"]
    print(format_table(report["steps"]))
    print(
        f"\n{'OK' if not failed else 'FAILED: ' + ', '.join(failed)} in {report['wall_s']:.1f} s; "
        f"report: {Path(out) / 'report.json'}, {Path(out) / 'report.md'}"
    )
    _args.copy_json(out / "report.json", json_target)
    return report["exit_code"]
