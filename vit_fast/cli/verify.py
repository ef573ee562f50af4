"""Run an exported artifact (ONNX file or TensorRT engine), or our triton backend, and compare it
with the eager model.

  vit-fast verify MODEL ARTIFACT [--json report.json] [--batches 1 3 64] [--seed 0]
  vit-fast verify MODEL triton   (our Triton kernels; on a CPU-only machine set TRITON_INTERPRET=1)

Inputs are fresh random images at batch 1, an odd batch and the maximum batch (the batch range
comes from ARTIFACT.json when present). The artifact passes when its max |error| against the
float64 model is at most 2x eager PyTorch's error in the artifact's dtype plus a small floor.
For MODEL "default", accuracy on the embedded labelled held-out set is reported too. Exits 1
when verification fails or the artifact cannot be run.
"""

from __future__ import annotations

import argparse
import sys

#: the interpreter runs about one image a second: the whole held-out set would take minutes
INTERPRETER_LIMIT = 32

_ERRORS = (ValueError, TypeError, KeyError, ImportError, FileNotFoundError, RuntimeError, AssertionError, OSError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast verify``'s arguments."""
    parser.add_argument("model", metavar="MODEL", help='"default", a preset name, or a checkpoint path')
    parser.add_argument(
        "artifact", metavar="ARTIFACT", help="an .onnx file, a TensorRT .plan / .engine, or 'triton' for our kernels"
    )
    parser.add_argument("--json", metavar="OUT", default=None, help="write the report as JSON")
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="batch sizes (default: 1, odd, max)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the random inputs (default: fresh)")
    parser.add_argument("--provider", default=None, help="ONNX Runtime provider (default: CUDA if present, else CPU)")
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help=f"labelled images used for accuracy with MODEL 'default' (default: all of them; "
        f"{INTERPRETER_LIMIT} when the triton backend runs in Triton's slow CPU interpreter)",
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _default_eval_set() -> tuple | None:
    """The embedded model's labelled held-out set, or None (with a note) where it cannot be built here."""
    try:
        from vit_fast.assets import load_default_eval_set

        return load_default_eval_set()
    except ImportError as err:  # the assets module, or scikit-learn which rebuilds the data, is missing
        print(f"note: no labelled held-out set available ({err}); reporting numerics only", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast verify``; 0 when the artifact passes, 1 otherwise."""
    from vit_fast.export.verify import verify
    from vit_fast.loading import load_model

    try:
        model = load_model(args.model, backend="torch")
        data = _default_eval_set() if args.model in ("default", "embedded") else None
        limit = args.limit
        if limit is None and args.artifact == "triton" and not _cuda():
            limit = INTERPRETER_LIMIT
        if limit is not None:
            if limit < 1:
                raise ValueError(f"--limit must be >= 1, got {limit}")
            if data is not None and limit < len(data[1]):
                print(f"note: accuracy on the first {limit} of {len(data[1])} labelled images", file=sys.stderr)
                data = (data[0][:limit], data[1][:limit])
        verify(
            model,
            args.artifact,
            batches=args.batches,
            data=data,
            seed=args.seed,
            provider=args.provider,
            json_path=args.json,
        )
    except _ERRORS as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"vit-fast verify: error: {msg}", file=sys.stderr)
        return 1
    return 0
