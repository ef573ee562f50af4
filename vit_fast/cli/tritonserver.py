"""Write a Triton Inference Server model repository for a model, an ONNX file or a TensorRT engine.

  vit-fast export tritonserver SOURCE --out REPO [--config PRESET] [--weights FILE] [--name NAME] [--batch 1,8,64]
                                      [--instances 1] [--kind gpu|cpu] [--dtype fp32] [--entries onnx,python] [--force]
                                      [--verify-batch 1,3]

SOURCE is "default" (the embedded model), a preset name or a checkpoint path (exported to ONNX here
and verified against eager PyTorch), an .onnx file, or a TensorRT engine (.plan / .engine) built by
vit-fast export tensorrt. REPO/NAME/config.pbtxt and REPO/NAME/1/model.onnx|model.plan are written,
with the verification record in REPO/NAME/verification.json; --entries python adds NAME_python, a
python-backend entry serving the vit-fast module itself (Triton's Python needs vit-fast installed).
--batch sets what is served (max_batch_size and the preferred sizes); --verify-batch only what is
verified. Without --kind the instances are KIND_GPU where torch sees a GPU (or SOURCE is an engine)
and KIND_CPU elsewhere; the command says which it wrote and why. Tables and progress lines name the
published files, never the staging folder they are built in.
Start Triton on it with: tritonserver --model-repository REPO
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import _args

#: vit_fast.export.tritonserver.DEFAULT_QUEUE_DELAY_US as --help shows it (tests/cli/test_cli_startup.py holds them
#: equal)
QUEUE_DELAY_HELP_US = 100

EXAMPLE = "vit-fast export tritonserver default --out repo/ --batch 1,8,64 --instances 2"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast export tritonserver``'s arguments."""
    parser.add_argument(
        "source",
        metavar="SOURCE",
        help='"default", a preset name or a checkpoint path; or an .onnx file; or a TensorRT .plan/.engine',
    )
    parser.add_argument("--out", required=True, metavar="PATH", help="the model repository folder (created if missing)")
    _args.add_model_source(parser)
    add_serving_arguments(parser, "SOURCE", "8 and 64, or within the artifact's range; a TensorRT profile bounds it")
    parser.add_argument(
        "--dtype",
        choices=("fp32", "fp16", "bf16"),
        default=None,
        help="weights and I/O dtype when SOURCE is a model (default fp32); an artifact keeps its own",
    )
    parser.add_argument(
        "--kind",
        choices=("gpu", "cpu"),
        default=None,
        help="instance kind: gpu -> KIND_GPU (TensorRT engines need it), cpu -> KIND_CPU (default: gpu where torch "
        "sees a CUDA GPU or SOURCE is an engine, else cpu; the command says which it wrote)",
    )
    parser.add_argument(
        "--entries",
        default="onnx",
        metavar="onnx,python",
        help="for a model SOURCE: onnx (the verified ONNX file, default) and/or python (NAME_python: the "
        "vit-fast module on Triton's python backend, fp32/fp16 only)",
    )
    parser.add_argument("--model", default=None, help="model to verify an ONNX file against (default: its metadata's)")
    parser.add_argument("--no-verify", action="store_true", help="skip verifying the ONNX file against eager PyTorch")
    _args.add_verify_batch(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the files vit-fast wrote in existing model folders of the same names; it keeps, and lists, "
        "everything else there, and refuses where such a file is in the way",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a --json file vit-fast did not write (that file only)"
    )
    _args.add_json(parser, "write a machine-readable summary here")
    parser.add_argument("--seed", type=_args.seed, default=None, help="seed of the random verification inputs")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def add_serving_arguments(
    parser: argparse.ArgumentParser, what: str, default_batch: str, default_delay: str = str(QUEUE_DELAY_HELP_US)
) -> None:
    """The flags ``export tritonserver`` and ``serve`` share: --name, --batch, --instances, --queue-delay-us."""
    parser.add_argument("--name", default=None, help=f"Triton model name (default: {what}'s name or file stem)")
    parser.add_argument(
        "--batch",
        type=_args.batch_list(),
        default=None,
        metavar="1,8,64",
        help="batch sizes, comma-separated: the largest is max_batch_size, the others above 1 the dynamic "
        f"batcher's preferred sizes (default: {default_batch})",
    )
    parser.add_argument(
        "--instances",
        type=_args.positive_int,
        default=1,
        metavar="N",
        help="model instances at once, on each GPU for KIND_GPU (1)",
    )
    parser.add_argument(
        "--queue-delay-us",
        type=_args.nonnegative_int,
        default=None,  # DEFAULT_QUEUE_DELAY_US, read when the command runs (its module imports torch)
        help=f"dynamic batcher's max_queue_delay_microseconds ({default_delay})",
    )


def _entries(text: str) -> list[str]:
    from vit_fast.export.tritonserver import ENTRIES

    wanted = [e.strip() for e in text.split(",") if e.strip()]
    unknown = [e for e in wanted if e not in ENTRIES]
    if not wanted or unknown:
        raise ValueError(f"--entries takes a comma-separated list of {', '.join(ENTRIES)}, got {text!r}")
    return list(dict.fromkeys(wanted))


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast export tritonserver``; returns 0, raises ValueError & co. with a clear message on bad input."""
    import vit_fast
    from vit_fast.export.tritonserver import (
        DEFAULT_QUEUE_DELAY_US,
        ENGINE_SUFFIXES,
        KINDS,
        ONNX_SUFFIXES,
        check_repository,
        entries_for,
        entry_names,
        machine_kind,
        model_name_for,
        parse_batch_sizes,
        repository_summary,
        write_repository,
    )
    from vit_fast.util.files import MARKER_KEY

    batch = parse_batch_sizes(args.batch) if args.batch is not None else None
    entries = _entries(args.entries)
    suffix = Path(args.source).suffix.lower()
    artifact = suffix in ONNX_SUFFIXES or suffix in ENGINE_SUFFIXES
    if artifact and entries != ["onnx"]:
        raise ValueError(
            "--entries python serves a model, not an artifact: give MODEL (a name or checkpoint) as SOURCE, "
            f"or drop --entries for {args.source!r}"
        )
    if artifact and args.dtype is not None:
        raise ValueError(f"--dtype applies to a model SOURCE; {args.source!r} keeps the dtype it was exported in")
    if artifact and (args.config is not None or args.weights is not None):
        flag = "--config" if args.config is not None else "--weights"
        raise ValueError(f"{flag} describes a model SOURCE; {args.source!r} is an artifact that carries its own")
    if args.model is not None and suffix not in ONNX_SUFFIXES:
        raise ValueError("--model names the model an ONNX file is verified against; SOURCE is not an ONNX file")
    if args.no_verify and args.verify_batch is not None:
        raise ValueError("--verify-batch names batches to verify: drop it or --no-verify")
    if args.verify_batch is not None and suffix in ENGINE_SUFFIXES:
        raise ValueError("--verify-batch applies to an ONNX entry; an engine keeps the verification it was built with")
    kind, kind_why = (args.kind, f"--kind {args.kind}") if args.kind else machine_kind(engine=suffix in ENGINE_SUFFIXES)
    dtype = args.dtype or "fp32"
    name = args.name or model_name_for(args.source)
    names = entry_names(name, entries)
    common = dict(
        batch=batch,
        instances=args.instances,
        kind=kind,
        queue_delay_us=DEFAULT_QUEUE_DELAY_US if args.queue_delay_us is None else args.queue_delay_us,
    )
    check_repository(args.out, names, args.force)  # before any work: a refused folder costs nothing
    _args.output_folder(args.out, "--out")  # says so when it makes the repository's folders, as every command does
    json_target = _args.json_file(args.json, overwrite=args.overwrite)
    source, described = args.source, None
    if not artifact:
        from vit_fast.interop.loading import load_model, source_name

        described = source_name(args.source)
        source = load_model(args.source, backend="torch", config=args.config, weights=args.weights)
    checked = dict(verify=not args.no_verify, model=args.model, seed=args.seed, verify_batches=args.verify_batch)
    checked |= dict(dtype=dtype, source_name=described, progress=not args.quiet)
    todo = entries_for(source, name, entries, **checked, **common)
    folders = write_repository(args.out, todo, force=args.force, progress=not args.quiet)
    summary = repository_summary(Path(args.out), folders) | {"kind": KINDS[kind], "kind_reason": kind_why}
    for m in summary["models"]:
        state = {True: "verified", False: "FAILED verification"}.get(m["verified"], m["verification_note"])
        print(f"wrote {m['config']} ({state})")
    print(f"instances: {args.instances} x {KINDS[kind]} ({kind_why})")
    print(f"start Triton on it: tritonserver --model-repository {Path(args.out).resolve()}")
    _args.write_json({MARKER_KEY: vit_fast.__version__, **summary}, json_target)
    return 0


__all__ = ["add_arguments", "run"]
