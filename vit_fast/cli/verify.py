"""Run an exported artifact (ONNX file or TensorRT engine), or our triton backend, and compare it
with the eager model.

  vit-fast verify MODEL ARTIFACT [--batch 1,3,64] [--seed 0] [--json report.json|-] [--provider P]
  vit-fast verify MODEL triton   (our Triton kernels; on a CPU-only machine set TRITON_INTERPRET=1)

MODEL is named as for every command (see vit-fast export --help): "default", a preset (random
weights, seeded), a checkpoint file, a Hugging Face folder, timm:NAME or hf:ORG/NAME. An artifact's
own verification record (from its export) is shown first. Inputs are random images at batch 1,
an odd batch and the maximum batch (the batch range comes from ARTIFACT.json when present). The
artifact passes when its max |error| against the float64 model is at most 2x eager PyTorch's
error in the artifact's dtype plus a small floor. For MODEL "default", accuracy on the embedded
labelled held-out set is reported too (--limit caps it; an artifact exported with --preprocess is fed
the set as uint8 pixels in its layout). Exits 1 when verification fails or the artifact cannot be run.
With --json - the report goes to stdout (a failed one too) and the table to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import _args

EXAMPLE = "vit-fast verify default model.onnx --batch 1,3,64 --seed 0 --json verify.json"
#: the interpreter runs about one image a second: the whole held-out set would take minutes
INTERPRETER_LIMIT = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast verify``'s arguments."""
    parser.add_argument("model", metavar="MODEL", help=_args.MODEL_HELP)
    parser.add_argument(
        "artifact", metavar="ARTIFACT", help="an .onnx file, a TensorRT .plan / .engine, or 'triton' for our kernels"
    )
    _args.add_batches(parser, "default: 1, an odd batch and the maximum")
    _args.add_seed(parser, None, "the random inputs (drawn, used and recorded when not given)")
    _args.add_json(parser)
    _args.add_overwrite(parser)
    _args.add_model_source(parser)
    parser.add_argument("--provider", default=None, help="ONNX Runtime provider (default: CUDA if present, else CPU)")
    parser.add_argument(
        "--limit",
        type=_args.positive_int,
        default=None,
        metavar="N",
        help=f"labelled images used for accuracy with MODEL 'default' (default: all of them; "
        f"{INTERPRETER_LIMIT} when the triton backend runs in Triton's slow CPU interpreter)",
    )


def _labelled_data(
    spec: str, artifact: str, limit: int | None, preprocess: dict | None = None
) -> tuple[tuple | None, str | None]:
    """The embedded model's labelled held-out set (its first ``limit`` images), or None where there is none; and the
    note that says it is a part of the set, printed once the table shows the accuracy. For an artifact with a
    preprocessing front (``preprocess``, from its metadata) the images are uint8 pixels in its layout: it
    normalises them itself."""
    if spec not in ("default", "embedded"):
        return None, None
    try:
        if preprocess:
            from vit_fast.assets import load_default_eval_pixels

            images, labels = load_default_eval_pixels()
            if preprocess.get("layout") == "NHWC":
                images = images.permute(0, 2, 3, 1).contiguous()
        else:
            from vit_fast.assets import load_default_eval_set

            images, labels = load_default_eval_set()
    except ImportError as err:  # the assets module, or scikit-learn which rebuilds the data, is missing
        print(f"note: no labelled held-out set available ({err}); reporting numerics only", file=sys.stderr)
        return None, None
    if limit is None and artifact == "triton":
        import torch

        limit = None if torch.cuda.is_available() else INTERPRETER_LIMIT
    if limit is not None and limit < len(labels):
        note = f"note: accuracy on the first {limit} of {len(labels)} labelled images (--limit)"
        return (images[:limit], labels[:limit]), note
    return (images, labels), None


def _front(meta: dict | None) -> dict | None:
    """The preprocessing front an artifact's metadata records (a dict), or None."""
    front = (meta or {}).get("preprocess")
    return front if isinstance(front, dict) else None


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast verify``; 0 when the artifact passes (a failure raises)."""
    from vit_fast.export.verify import VerificationError, verify
    from vit_fast.interop.loading import load_model

    # the one output policy, before the model loads; never the artifact's metadata
    own = () if args.artifact == "triton" else (args.artifact,)
    json_target = _args.json_file(args.json, overwrite=args.overwrite, artifacts=own)
    meta = None
    if args.artifact == "triton":  # before the model loads and any note on the labelled set is printed
        from vit_fast.backend.runtime import require_triton

        require_triton()
    else:
        from vit_fast.export import format_verification, read_metadata
        from vit_fast.export.runners import check_artifact_name

        check_artifact_name(args.artifact)  # a name its runtime cannot open: refused before anything is printed

        meta = read_metadata(args.artifact) if Path(args.artifact).is_file() else None
        if meta is not None:  # what the artifact says of itself, before we check it again
            print(f"{args.artifact}: recorded at export; " + format_verification(meta.get("verification")))
    model = load_model(args.model, backend="torch", config=args.config, weights=args.weights)
    data, note = _labelled_data(args.model, args.artifact, args.limit, _front(meta))
    try:
        report = verify(
            model,
            args.artifact,
            batches=args.batch,
            data=data,
            seed=args.seed,
            provider=args.provider,
            json_path=_args.file_only(json_target),
            overwrite=args.overwrite,
        )
    except VerificationError as err:  # the table, accuracy included, was printed: the note belongs under it
        _say(note)
        if json_target == _args.STDOUT:  # a file report is written before the raise; stdout's the same
            _args.write_json(err.report.to_dict(), json_target)
        raise
    _say(note)  # only after a run: an artifact that cannot run gets its error, not a note on the data
    if json_target == _args.STDOUT:
        _args.write_json(report.to_dict(), json_target)
    return 0


def _say(note: str | None) -> None:
    if note:
        print(note, file=sys.stderr)
