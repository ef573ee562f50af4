"""Build a deployment artifact, verify it against eager PyTorch, and publish it only if it passed.

  vit-fast export onnx MODEL --out model.onnx [--batch 1,64] [--dtype fp16] [--exporter dynamo]
                          [--attention fused] [--dynamic-size] [--opset 18] [--outputs logits,pooled]
                          [--input-name pixel_values] [--preprocess NHWC --mean .. --std ..]
                          [--verify-batch 1,3 | --size-mix 32x48,48x32 ...] [--seed 0] [--json report.json|-]
                          [--overwrite]
  vit-fast export tensorrt model.onnx --out model.plan [--batch 1,8,64] [--dtype fp16] [--verify-batch 1,8]
  vit-fast export tritonserver SOURCE --out repo/ [--batch 1,8,64] [--instances 2]

MODEL is "default" (the embedded model), a preset name (RANDOM weights, seeded: the metadata says
so), a checkpoint file (with --config for a plain timm / Hugging Face state dict), a Hugging Face
save_pretrained folder, timm:NAME (with --weights FILE) or hf:ORG/NAME. The artifact is written
and verified in a staging folder beside --out and published with its metadata (PATH.json, which
records the verification: rule, worst error, batches, seed, versions, weights) and the --json
report only when it passed; a failed or killed run leaves the target as it was. --batch is the
artifact's batch range; --verify-batch picks fewer batches inside it to verify (a quicker check of
the same artifact). A file vit-fast did not write is never replaced unless --overwrite. Exit status
1 on failure. With --json - the report goes to stdout (once the artifact is published) and everything
else to stderr.

A native-resolution tower (timm:naflexvit_* with --weights FILE, or a save_pretrained folder of a SigLIP 2
vision model) exports as it is, with its patches, coordinates or sizes and mask as inputs dynamic in batch
and tokens, and is verified at three image-size mixes (--size-mix HxW,HxW, repeated, to choose them).
"""

from __future__ import annotations

import argparse
from typing import Any

from vit_fast.export.formats import FORMATS
from vit_fast.util.files import make_folders

from . import _args

EXAMPLE = "vit-fast export onnx default --out artifacts/digits.onnx --batch 1,64 --dtype fp16"
ONNX_EXAMPLE = "vit-fast export onnx vit_base_patch16_224 --out vitb16.onnx --batch 1,64 --dtype fp16 --json v.json"
TENSORRT_EXAMPLE = "vit-fast export tensorrt vitb16.onnx --out vitb16.plan --batch 1,8,64 --dtype fp16"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a sub-command per export format (vit_fast.export.formats) and ``tritonserver`` to ``vit-fast export``."""
    from . import add_subcommand, tritonserver

    sub = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, artifact_format in FORMATS.items():
        add, _ = _COMMANDS.get(name, (_add_generic, _run_generic))
        example = _EXAMPLES.get(name, f"vit-fast export {name} SOURCE --out model{artifact_format.suffixes[0]}")
        add(add_subcommand(sub, name, None, artifact_format.summary, example))
    r = add_subcommand(
        sub,
        "tritonserver",
        tritonserver.__doc__,
        "write a Triton Inference Server model repository",
        tritonserver.EXAMPLE,
    )
    tritonserver.add_arguments(r)


def _add_onnx(p: argparse.ArgumentParser) -> None:
    """``vit-fast export onnx``'s flags: the model, the graph's options, verification."""
    p.add_argument("model", metavar="MODEL", help=_args.MODEL_HELP)
    p.add_argument("--out", required=True, help="the .onnx file to write (metadata goes to OUT.json)")
    p.add_argument(
        "--batch", type=_args.batch_list("MIN", "MAX"), default=[1, 64], metavar="MIN,MAX", help="batch range (1,64)"
    )
    p.add_argument("--dtype", type=_args.dtype_name, default=None, help="weights and input: fp32, fp16, bf16 (fp32)")
    p.add_argument("--opset", type=_args.opset, default=None, help="ONNX opset (18; 23 with --attention fused)")
    p.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo", help="torch exporter (dynamo)")
    p.add_argument(
        "--attention",
        choices=("decomposed", "fused"),
        default="decomposed",
        help="fused: one ONNX Attention node per block (opset 23, dynamo)",
    )
    p.add_argument("--dynamic-size", action="store_true", help="symbolic image height and width")
    p.add_argument(
        "--outputs",
        type=_args.name_list,
        default=None,
        metavar="A,B",
        help="outputs, in order, of logits, pooled, last_hidden_state (default: logits; pooled without a head)",
    )
    p.add_argument("--input-name", default="images", help="the graph's input name, e.g. pixel_values (images)")
    p.add_argument(
        "--output-names", type=_args.name_list, default=None, metavar="A,B", help="names of the outputs (their kinds)"
    )
    p.add_argument(
        "--preprocess",
        choices=("NCHW", "NHWC"),
        default=None,
        help="take uint8 images in this layout and normalise inside the graph (needs --mean and --std)",
    )
    p.add_argument("--mean", type=_args.float_list, default=None, metavar="M,M,M", help="per-channel mean (0..1 units)")
    p.add_argument("--std", type=_args.float_list, default=None, metavar="S,S,S", help="per-channel std (0..1 units)")
    p.add_argument("--scale", type=_args.positive_float, default=1 / 255, help="pixel scale before mean/std (1/255)")
    _args.add_model_source(p)
    _add_verification(p, "artifact", size_mix=True)


def _add_tensorrt(p: argparse.ArgumentParser) -> None:
    """``vit-fast export tensorrt``'s flags: the ONNX file, the profile and builder options, verification."""
    p.add_argument("onnx", metavar="ONNX", help="an ONNX file written by vit-fast export onnx")
    p.add_argument("--out", required=True, help="the engine file to write (.plan; metadata goes to OUT.json)")
    p.add_argument(
        "--batch",
        type=_args.batch_list("MIN", "OPT", "MAX"),
        default=[1, 8, 64],
        metavar="MIN,OPT,MAX",
        help="optimization profile (1,8,64)",
    )
    p.add_argument("--dtype", type=_args.dtype_name, default=None, help="engine precision: fp16, bf16, fp32 (fp16)")
    p.add_argument("--timing-cache", default=None, help="timing cache file, reused across builds")
    p.add_argument("--workspace-gib", type=_args.positive_float, default=None, help="builder workspace limit in GiB")
    p.add_argument("--model", default=None, help="model to verify against (default: the ONNX metadata's source)")
    _add_verification(p, "engine")


def _add_generic(p: argparse.ArgumentParser) -> None:
    """A format with no flags of its own: SOURCE, --out, --batch and the flags every export has."""
    p.add_argument("source", metavar="SOURCE", help="what the format is built from (its build's first argument)")
    p.add_argument("--out", required=True, help="the file to write (metadata goes to OUT.json)")
    p.add_argument(
        "--batch", type=_args.batch_list("MIN", "MAX"), default=[1, 64], metavar="MIN,MAX", help="batch range (1,64)"
    )
    _add_verification(p, "artifact")


def _add_verification(p: argparse.ArgumentParser, artifact: str, size_mix: bool = False) -> None:
    """The flags every format's command ends with: verification, the report, replacing, progress."""
    p.add_argument("--no-verify", action="store_true", help="publish without verification (recorded as not verified)")
    _args.add_verify_batch(p)
    if size_mix:
        p.add_argument(
            "--size-mix",
            type=_args.size_mix,
            action="append",
            default=None,
            metavar="HxW,HxW",
            help="a native-resolution model (timm naflexvit_*, a SigLIP 2 vision folder): one batch of images of "
            "these sizes to verify at; repeat for each mix (default: three mixes)",
        )
    _args.add_json(p, f"write the verification report as JSON here (published only with a passing {artifact})")
    _args.add_seed(p, None, "the random verification inputs (drawn and recorded when not given)")
    _args.add_overwrite(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _verify_options(args: argparse.Namespace, json_target: Any) -> Any:
    """``VerifyOptions`` for the command line's flags, or False for --no-verify; --verify-batch is checked against
    --batch's range here, before any work; with ``--json -`` the report is printed to stdout once the artifact is
    published."""
    from vit_fast.export.verify import VerifyOptions, check_verify_batches

    if args.no_verify:
        if args.verify_batch is not None:
            raise _args.CommandError("--verify-batch names batches to verify: drop it or --no-verify")
        if json_target is not None:  # as the library refuses report= without verify=
            raise _args.CommandError("--json is the verification report: drop --no-verify, or drop --json")
        return False
    check_verify_batches(args.verify_batch, (args.batch[0], args.batch[-1]))
    if args.target == "onnx" and args.size_mix is not None and args.verify_batch is not None:
        raise _args.CommandError("--size-mix verifies a native-resolution model, --verify-batch any other: give one")

    def to_stdout(report: Any) -> None:
        _args.write_json(report.to_dict(), _args.STDOUT)

    on_published = to_stdout if json_target == _args.STDOUT else None
    return VerifyOptions(
        batches=args.verify_batch,
        seed=args.seed,
        print_table=not args.quiet,
        on_published=on_published,
        size_mixes=getattr(args, "size_mix", None),
    )


def _run_onnx(args: argparse.Namespace) -> int:
    from vit_fast.export.onnx import check_onnx_args, to_onnx
    from vit_fast.interop.loading import load_model, load_native_model, source_name

    preprocess = None
    if args.preprocess:
        if args.mean is None or args.std is None:
            raise _args.CommandError("--preprocess needs --mean and --std (per channel, 0..1 units)")
        preprocess = dict(layout=args.preprocess, mean=tuple(args.mean), std=tuple(args.std), scale=args.scale)
    elif args.mean is not None or args.std is not None:
        raise _args.CommandError("--mean/--std normalise uint8 input inside the graph: give --preprocess NCHW|NHWC too")
    out = _args.output_file(args.out, "--out", FORMATS["onnx"].suffixes)
    # the one output policy, before any work; never the artifact's own metadata
    json_target = _args.json_file(args.json, overwrite=args.overwrite, artifacts=(out,))
    verify = _verify_options(args, json_target)  # before the model loads: a refused --verify-batch costs nothing
    batch = tuple(args.batch)
    dtype = args.dtype or "fp32"  # a default given as text would be parsed, importing torch, on every parse
    model = load_native_model(args.model, weights=args.weights)  # a NaFlexVit or SigLIP 2 tower, exported as it is
    if model is None:
        if args.size_mix is not None:
            raise _args.CommandError("--size-mix verifies a native-resolution model (timm naflexvit_*, SigLIP 2)")
        model = load_model(args.model, backend="torch", config=args.config, weights=args.weights)
        check_onnx_args(model, batch, dtype, args.opset, args.exporter, args.dynamic_size, args.attention)
    make_folders(out.parent, "--out")  # checked above; made only now that the work starts
    to_onnx(
        model,
        out,
        batch=batch,
        dtype=dtype,
        opset=args.opset,
        exporter=args.exporter,
        dynamic_size=args.dynamic_size,
        attention=args.attention,
        source=source_name(args.model),
        progress=not args.quiet,
        outputs=args.outputs,
        input_name=args.input_name,
        output_names=args.output_names,
        preprocess=preprocess,
        verify=verify,
        report=_args.file_only(json_target),
        overwrite=args.overwrite,
    )
    print(f"wrote {out}" + (" (not verified)" if args.no_verify else ": verified"))
    return 0


def _run_tensorrt(args: argparse.Namespace) -> int:
    from vit_fast.export.tensorrt import to_tensorrt

    out = _args.output_file(args.out, "--out", FORMATS["tensorrt"].suffixes)
    # the one output policy, before any work; never the artifact's own metadata
    json_target = _args.json_file(args.json, overwrite=args.overwrite, artifacts=(out,))
    verify = _verify_options(args, json_target)
    make_folders(out.parent, "--out")
    to_tensorrt(
        args.onnx,
        out,
        batch=tuple(args.batch),
        precision=args.dtype or "fp16",
        timing_cache=args.timing_cache,
        workspace_gib=args.workspace_gib,
        model=args.model,
        verify=verify,
        progress=not args.quiet,
        report=_args.file_only(json_target),
        overwrite=args.overwrite,
    )
    print(f"wrote {args.out}" + (" (not verified)" if args.no_verify else ": verified"))
    return 0


def _run_generic(args: argparse.Namespace) -> int:
    """A format with no command of its own: its build called as ``build(SOURCE, OUT, batch=..., verify=...,
    report=..., overwrite=..., progress=...)``."""
    artifact_format = FORMATS[args.target]
    out = _args.output_file(args.out, "--out", artifact_format.suffixes)
    json_target = _args.json_file(args.json, overwrite=args.overwrite, artifacts=(out,))
    verify = _verify_options(args, json_target)
    make_folders(out.parent, "--out")
    artifact_format.load("build")(
        args.source,
        out,
        batch=tuple(args.batch),
        verify=verify,
        report=_args.file_only(json_target),
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    print(f"wrote {out}" + (" (not verified)" if args.no_verify else ": verified"))
    return 0


#: the formats whose command has flags of its own: name -> (add its arguments, run it)
_COMMANDS = {"onnx": (_add_onnx, _run_onnx), "tensorrt": (_add_tensorrt, _run_tensorrt)}
_EXAMPLES = {"onnx": ONNX_EXAMPLE, "tensorrt": TENSORRT_EXAMPLE}


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast export FORMAT|tritonserver``; 0 on success (a failure raises)."""
    if args.target == "tritonserver":
        from . import tritonserver

        return tritonserver.run(args)
    return _COMMANDS.get(args.target, (_add_generic, _run_generic))[1](args)
