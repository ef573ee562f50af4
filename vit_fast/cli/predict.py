"""Run a model on image files and print each image's top-k labels with their probabilities.

  vit-fast predict MODEL PATH... [--top-k 5] [--batch 16] [--backend auto] [--json PATH|-] [--features FILE]
                   [--mean M,M,M] [--std S,S,S] [--interpolation I] [--crop-pct P] [--input-size HxW]

MODEL is named as for every command: "default" (the embedded digits model: light digits on a dark
ground), a preset (random weights), a checkpoint file, a Hugging Face folder, timm:NAME or hf:ORG/NAME.
PATH is an image file (PNG, JPEG, WebP, BMP; any mode, EXIF orientation applied) or a folder: its
images by suffix, through subfolders, sorted, hidden names left out. Each image is preprocessed as
the model's own library does (vit_fast.image_transform: timm's pretrained_cfg, a Hugging Face
folder's preprocessor_config.json or --processor, the default model's record), decoded in a small
thread pool and run in batches. With the model on CUDA and torchvision (0.19+) installed, JPEGs are decoded
on the GPU with nvJPEG, one call per batch (EXIF orientation applied as Pillow applies it; other formats, and
any JPEG nvJPEG refuses, stay on Pillow). On the triton backend each batch of decoded images (each at its
own size) is preprocessed in one launch of the fused preprocessing kernel; where the kernel cannot
(a grayscale model, the torch backend) image_transform runs in the decode threads (on the GPU after a GPU
decode). A line on stderr says which ran (and why not the kernel) and with what parameters; --json rows
carry the same as "preprocessing". A model that carries no preprocessing (a preset, a plain checkpoint) gets timm's
defaults (ImageNet mean and std, bicubic, crop_pct 0.875) and a warning line: --mean, --std,
--interpolation, --crop-pct and --input-size set them. Labels come from the model (id2label, timm's
label_names, the digits), else class indices. --json writes one JSON line per image as each batch
finishes (staged beside the file, published when the run ends, Ctrl-C included); --features writes
each image's pooled feature with the file names (.safetensors or .npy) instead of labels. A file
that cannot be decoded is named with the reason and the rest go on; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from . import _args

EXAMPLE = "vit-fast predict default digits/ --top-k 3 --json predictions.json"
FEATURE_SUFFIXES = (".safetensors", ".npy")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast predict``'s arguments."""
    parser.add_argument("model", metavar="MODEL", help=_args.MODEL_HELP)
    parser.add_argument("paths", metavar="PATH", nargs="+", help="image files, or folders of them (recursive)")
    parser.add_argument("--top-k", type=_args.positive_int, default=5, metavar="K", help="labels per image (5)")
    parser.add_argument("--batch", type=_args.positive_int, default=16, metavar="N", help="images per forward (16)")
    parser.add_argument(
        "--backend",
        choices=("auto", "torch", "triton"),
        default="auto",
        help="auto: our Triton kernels on a GPU, torch on a CPU (default auto)",
    )
    parser.add_argument(
        "--decode-threads", type=_args.positive_int, default=None, metavar="T", help="decoding threads (up to 4)"
    )
    _args.add_json(parser, "also write one JSON line per image (file, labels, probabilities) to this .json file")
    parser.add_argument(
        "--features",
        default=None,
        metavar="FILE",
        help="write each image's pooled feature and file name to FILE (.safetensors or .npy) instead of labels",
    )
    parser.add_argument(
        "--mean", type=_args.float_list, default=None, metavar="M,M,M", help="per-channel mean (0..1 units)"
    )
    parser.add_argument(
        "--std", type=_args.float_list, default=None, metavar="S,S,S", help="per-channel std (0..1 units)"
    )
    parser.add_argument("--interpolation", choices=("bilinear", "bicubic"), default=None, help="the resize filter")
    parser.add_argument(
        "--crop-pct",
        type=_args.Number(float, 0, 1, above=True),
        default=None,
        metavar="P",
        help="timm's crop_pct: the shorter side resized to input size / P, then the centre crop (0 < P <= 1)",
    )
    parser.add_argument(
        "--input-size", type=_input_size, default=None, metavar="HxW", help="timm's input size (the crop): S or HxW"
    )
    parser.add_argument(
        "--processor",
        default=None,
        metavar="PATH",
        help="a transformers preprocessor_config.json (or its folder) when MODEL does not carry one",
    )
    _args.add_overwrite(parser)
    _args.add_model_source(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast predict``; 0 when every image was answered, 1 when one could not be decoded."""
    from vit_fast.util.files import check_output_file

    json_target = _args.json_file(args.json, overwrite=args.overwrite)
    features = None
    if args.features is not None:
        try:
            features = check_output_file(
                args.features, FEATURE_SUFFIXES, "--features", overwrite=args.overwrite, make_parents=True
            )
        except ValueError as err:
            raise _args.CommandError(str(err)) from None
    overrides = _overrides(args)  # refused before anything is read
    from vit_fast.interop.images import image_files, pil_image_module

    pil_image_module()  # a missing Pillow is the first thing to hear about
    files = image_files(args.paths)  # a path that is not there: refused before the model loads

    from vit_fast.interop.image_transform import model_labels
    from vit_fast.interop.loading import load_model
    from vit_fast.interop.predicting import DEFAULT_THREADS, predict_files
    from vit_fast.util.interrupts import held
    from vit_fast.util.progress import bar, plural

    model = load_model(args.model, backend=args.backend, config=args.config, weights=args.weights)
    if features is None and model.num_classes == 0:
        raise _args.CommandError(
            f"model {args.model!r} has no classifier head (num_classes 0): ask for its features with --features FILE"
        )
    transform = _transform(model, args, overrides)
    labels = model_labels(model, args.model)
    folders = any(Path(p).is_dir() for p in args.paths)
    progress = bar(len(files), "predict", enabled=folders and len(files) > args.batch, unit="image")
    failed, done, feature_rows, shown = 0, 0, [], ""
    with _json_lines(json_target) as out:
        try:
            batches = predict_files(
                model,
                files,
                transform,
                batch=args.batch,
                threads=args.decode_threads or DEFAULT_THREADS,
                top_k=args.top_k,
                labels=labels,
                features=features is not None,
            )
            for answers in batches:
                how = next((a.preprocessing for a in answers if a.preprocessing), shown)
                if how != shown:  # said once (the first batch), and again were it ever to change
                    said = f"{how}; {transform.source}: {transform.preprocessing.describe()}"
                    print(f"vit-fast predict: preprocessing: {said}", file=sys.stderr)
                    shown = how
                for answer in answers:
                    if answer.error is not None:
                        failed += 1
                        print(f"vit-fast predict: {answer.file}: {answer.error}", file=sys.stderr)
                    elif answer.feature is not None:
                        feature_rows.append((answer.file, answer.feature))
                    else:
                        tops = "  ".join(
                            f"{n} {p:.3f}" for n, p in zip(answer.labels, answer.probabilities, strict=True)
                        )
                        print(f"{answer.file}: {tops}")
                    if out is not None:
                        out.write(json.dumps(answer.to_dict(transform)) + "\n")
                if out is not None:
                    out.flush()
                sys.stdout.flush()
                done += len(answers)
                progress.update(len(answers))
                progress.set_postfix_str(f"{done} answered" + (f", {failed} unreadable" if failed else ""))
        finally:
            progress.close()
            if features is not None and feature_rows:
                with held():  # a second Ctrl-C waits until the file is whole
                    _write_features(features, feature_rows)
    if features is not None:
        print(f"wrote {plural(len(feature_rows), 'feature')} to {features}", file=sys.stderr)
    if failed:
        print(f"vit-fast predict: {failed} of {len(files)} images could not be read", file=sys.stderr)
    return 1 if failed else 0


def _input_size(text: str) -> tuple[int, int]:
    """``224`` or ``224x192`` (height x width, pixels)."""
    h, sep, w = str(text).strip().lower().partition("x")
    w = w if sep else h
    if not (h.isdigit() and w.isdigit() and int(h) > 0 and int(w) > 0):
        raise argparse.ArgumentTypeError(f"expected S or HxW in pixels, e.g. 224 or 224x192; got {text!r}")
    return int(h), int(w)


def _overrides(args: argparse.Namespace) -> dict:
    """The preprocessing flags, checked: 1 or 3 numbers in 0..1 units for --mean and --std, std > 0, 0 < crop_pct
    <= 1 (a mean over 1 is in 0..255 units: refused with the division that fixes it)."""
    for flag, values in (("--mean", args.mean), ("--std", args.std)):
        if values is None:
            continue
        if len(values) not in (1, 3):
            raise _args.CommandError(f"{flag} takes 1 or 3 numbers (one per channel), got {len(values)}")
        if any(abs(v) > 1 for v in values):
            fixed = ",".join(f"{v / 255:.4g}" for v in values)
            raise _args.CommandError(f"{flag} is in 0..1 pixel units; {_numbers(values)} looks like 0..255: {fixed}")
    if args.std is not None and not all(v > 0 for v in args.std):
        raise _args.CommandError(f"--std must be positive, got {_numbers(args.std)}")
    names = ("mean", "std", "interpolation", "crop_pct", "input_size")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _numbers(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def _transform(model, args: argparse.Namespace, overrides: dict):
    """image_transform with the flags over it; timm's defaults said on stderr (once), a flag that cannot apply
    refused in vit-fast's words, and an --input-size the model cannot take refused before any image is read."""
    import warnings

    from vit_fast.interop.image_transform import PreprocessingDefaultsWarning, image_transform

    size = overrides.get("input_size")
    if size is not None and tuple(size) != tuple(model.cfg.img_hw) and not model.cfg.dynamic_img_size:
        raise _args.CommandError(
            "--input-size {}x{}: model {!r} takes {}x{} images (it has no dynamic_img_size)".format(
                *size, args.model, *model.cfg.img_hw
            )
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PreprocessingDefaultsWarning)
        try:
            transform = image_transform(model, _processor(args), overrides)
        except ValueError as err:
            raise _args.CommandError(str(err)) from None
    for w in caught:
        if issubclass(w.category, PreprocessingDefaultsWarning):
            print(f"vit-fast predict: warning: {args.model!r}: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return transform


def _processor(args: argparse.Namespace) -> str | None:
    """--processor, else MODEL where it names a Hugging Face folder or hub model with a preprocessor_config.json."""
    if args.processor is not None:
        return args.processor
    model = str(args.model)
    if model.startswith("hf:") or (Path(model).is_dir() and (Path(model) / "preprocessor_config.json").is_file()):
        from vit_fast.interop.image_transform import find_processor

        return model if find_processor(model) is not None else None
    return None


@contextlib.contextmanager
def _json_lines(target: Path | str | None) -> Iterator[IO[str] | None]:
    """Where the JSON lines go: standard output for ``-``; a file staged beside ``target`` and published when the
    block ends, however it ends (Ctrl-C keeps every finished line); nowhere without ``--json``."""
    if target is None:
        yield None
        return
    if target == _args.STDOUT:
        yield _args.json_stream()
        return
    from vit_fast.util.files import make_folders, open_new, publish_to, staging_dir
    from vit_fast.util.interrupts import held

    target = Path(target)
    make_folders(target.parent)
    with staging_dir(target) as tmp:
        staged = tmp / target.name
        try:
            with open_new(staged) as raw, io.TextIOWrapper(raw, encoding="utf-8") as text:
                yield text
        finally:
            with held():
                publish_to([(staged, target)])


def _write_features(path: Path, rows: list) -> None:
    """The features ``[N, D]`` float32 with their file names: safetensors (tensor ``features``, the names as JSON in
    the metadata's ``files``) or .npy (a structured array, fields ``file`` and ``feature``: no pickle to load it)."""
    import numpy as np
    import torch

    from vit_fast.util.files import npy_bytes, write_atomic

    names = [name for name, _ in rows]
    stacked = torch.stack([feature for _, feature in rows]).to(torch.float32).contiguous()
    if path.suffix.lower() == ".safetensors":
        from safetensors.torch import save

        data = save({"features": stacked}, metadata={"files": json.dumps(names)})
    else:
        width = max(len(n) for n in names)
        table = np.zeros(len(names), dtype=[("file", f"<U{width}"), ("feature", "<f4", (stacked.shape[1],))])
        table["file"], table["feature"] = names, stacked.numpy()
        data = npy_bytes(table)
    write_atomic(path, data)
