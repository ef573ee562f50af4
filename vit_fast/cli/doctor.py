"""Prove the stack on this machine: the environment, every kernel at a model's shapes against float64, the whole
model against the torch backend, a CUDA graph and a brief timing; write a report to attach to a bug report.

  vit-fast doctor [--model MODEL] [--out DIR] [--json PATH|-] [--dtype fp16,bf16,fp32] [--device auto|cpu|cuda:N]

Sections, each check reported as ok / warning / failed / skipped (with the reason):

  environment  python; torch and triton, and whether they belong together (torch pins one triton); what
               Triton builds its C launcher with, each with its fix when missing: the C compiler ($CC, else
               gcc, else clang), Python.h (sysconfig's include folder) and libcuda.so.1 (TRITON_LIBCUDA_PATH,
               else ldconfig -p, else LD_LIBRARY_PATH); the driver; each GPU's row of the card table (shared
               memory, tl.dot's unit, TMA, native bf16); every TRITON_* and VIT_FAST_* setting present
  kernels      every kernel of one forward at MODEL's shapes against its float64 reference, by the numerics
               rule (at most 2x eager PyTorch's error in the same dtype, plus a floor); then, whatever MODEL,
               the kernels only timm / Hugging Face models patched in place (apply_vit_fast) launch, at the
               shapes of one model of each family: RmsNorm qk-norm and the GEMMs with RmsNorm folded in
               (timm vit_base_patch16_xp_224), differential attention (vit_dlittle_patch16_reg1_gap_256),
               the attention-pool head (vit_base_patch16_siglip_224, HF SigLIP). On a GPU: compiled,
               fp32, fp16 and bf16 where the card has native bf16, batches 1 and 8. Without one: in Triton's
               interpreter (a child process started with TRITON_INTERPRET=1), fp32 and fp16, batch 1, at
               most two heads
  model        MODEL whole, triton backend against the torch backend and float64 (vit-fast verify MODEL
               triton): on a GPU per dtype; on a CPU in the first dtype at batch 1, and only for a small
               model (the embedded default; a larger one's kernels are still checked at its shapes)
  cuda graph   capture and replay of the triton model (GPU only)
  timing       triton against the torch backend (batch 1 and 8) and attention against torch's SDPA (GPU
               only; a few dozen calls each, not a benchmark)

Prints each check once, as a row when it finishes (what runs next goes to stderr), then the verdict: on
stdout, or on stderr with --json -, which puts the JSON report on stdout; writes report.json and report.md into
--out, rewritten as each check ends ("complete": false until the last), so Ctrl-C or SIGTERM keeps the checks
that ended there, marked "interrupted" (exit 130 or 143). Exits 1 when a check failed (warnings and skipped
checks do not fail), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vit_fast.doctor.settings import DEFAULT_OUT, DoctorSettings
from vit_fast.util.files import check_files_in

from . import _args

EXAMPLE = "vit-fast doctor --json doctor.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast doctor``'s arguments."""
    d = DoctorSettings()
    parser.add_argument("--model", default=d.model, metavar="MODEL", help=_args.MODEL_HELP + f" (default {d.model})")
    _args.add_model_source(parser)
    out_help = f"folder for report.json and report.md (default {DEFAULT_OUT})"
    parser.add_argument("--out", default=DEFAULT_OUT, help=out_help)
    _args.add_json(parser)
    _args.add_dtypes(
        parser, "precisions to check (default: fp32, fp16 and bf16 where the GPU has native bf16; fp32, fp16 on a CPU)"
    )
    _args.add_device(parser, d.device, "where the checks run: auto (the first GPU, else the CPU), cpu, cuda or cuda:N")
    _args.add_child_timeout(parser, "--timeout", d.timeout, "on a CPU")
    _args.add_seed(parser, d.seed, "the random inputs (and a preset's weights)")
    _args.add_overwrite(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast doctor``; prints each check as it finishes and the verdict, returns 0 when no check failed,
    else 1."""
    from vit_fast.doctor import run_doctor

    out = _args.output_folder(args.out)
    # the one output policy, before any check runs
    check_files_in(out, ("report.json", "report.md"), "doctor --out", overwrite=args.overwrite)
    json_target = _args.json_file(args.json, overwrite=args.overwrite)
    settings = DoctorSettings(
        model=args.model,
        config=args.config,
        weights=args.weights,
        out=out,
        device=args.device,
        dtypes=args.dtype,
        seed=args.seed,
        timeout=args.timeout,
    )
    from vit_fast.util.interrupts import INTERRUPTS, held

    try:
        report = run_doctor(settings)
    except INTERRUPTS:  # report.json keeps the checks that ended (run_doctor said so): the --json copy too
        if (out / "report.json").is_file():
            with held():
                _args.copy_json(out / "report.json", json_target)
        raise
    failed, skipped = report["failed"], report["skipped"]  # each check was printed once, as it finished
    verdict = "OK" if not failed else "FAILED: " + ", ".join(failed)
    print(
        f"\n{verdict}; {len(skipped)} skipped, {len(report['warnings'])} warning(s); {report['wall_s']:.1f} s; "
        f"report: {Path(out) / 'report.json'}, {Path(out) / 'report.md'}"
    )
    _args.copy_json(out / "report.json", json_target)
    return report["exit_code"]
