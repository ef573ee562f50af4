"""Images per second from files on disk to top-k labels: what users write by hand against ``vit-fast predict``'s path.

Two rows per model, in one run, on the same files, model and threads:

- ``by hand``: one image at a time, as users write it: ``PIL.Image.open(f).convert(...)``, the library's eval
  transform (timm's ``create_transform`` where torchvision imports; elsewhere, and for the embedded model,
  ``vit_fast.image_transform``), ``model(x[None])``, softmax and top-k.
- ``predict``: ``vit_fast.interop.predicting.predict_files``, what ``vit-fast predict`` runs: decoding in a thread
  pool, batches of ``--batch``.
- ``predict, fused preprocessing kernel``: the same with each batch preprocessed in one launch of the fused kernel
  (what ``vit-fast predict`` does on the triton backend); the model still runs on torch. Here, without a GPU, the
  kernel runs only in Triton's interpreter (``TRITON_INTERPRET=1``, about 20 s per 300x400 image): the row says so,
  times ``--interpreter-images`` images and is no GPU speed. Where the kernel cannot run (the grayscale default
  model, no interpreter) the row is skipped with the reason.

The files are written first into a private temporary folder (removed after): PNG digits for ``default``, JPEG
photos-like images of ``--size`` pixels for a preset (random weights, seeded). Each row is timed ``--repeats`` times
after one untimed pass; the median is reported.

    python benchmarks/pipeline.py                                       # default and vit_tiny_patch16_224, CPU
    python benchmarks/pipeline.py --models default --images 256 --json pipeline.json

Not a timed test: it prints a table and writes JSON through ``vit_fast.util.files`` with ``--json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path


def size_type(text: str) -> tuple[int, int]:
    h, sep, w = text.lower().partition("x")
    if not sep or not h.isdigit() or not w.isdigit() or not (8 <= int(h) <= 4096 and 8 <= int(w) <= 4096):
        raise argparse.ArgumentTypeError(f"expected HxW pixels, each 8 to 4096, e.g. 300x400; got {text!r}")
    return int(h), int(w)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    here = str(Path(__file__).resolve().parent)  # script_args beside this script, however it is loaded
    if here not in sys.path:
        sys.path.insert(0, here)
    from script_args import bounded as bounded_number

    bounded = partial(bounded_number, int)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        default="default,vit_tiny_patch16_224",
        help="comma-separated: default and/or presets (random weights) (default: default,vit_tiny_patch16_224)",
    )
    parser.add_argument("--images", type=bounded(1, 10000), default=64, help="image files per model (default 64)")
    parser.add_argument("--size", type=size_type, default=(300, 400), help="HxW of a preset's images (300x400)")
    parser.add_argument("--batch", type=bounded(1, 1024), default=16, help="predict's batch (default 16)")
    parser.add_argument("--decode-threads", type=bounded(1, 64), default=None, help="predict's decode threads")
    parser.add_argument("--repeats", type=bounded(1, 50), default=3, help="timed passes per row (default 3)")
    parser.add_argument("--threads", type=bounded(1, 1024), default=None, help="torch CPU threads (default: free)")
    parser.add_argument("--top-k", type=bounded(1, 1000), default=5, help="labels per image (default 5)")
    parser.add_argument(
        "--interpreter-images",
        type=bounded(1, 10000),
        default=2,
        help="images the fused-kernel row times when the kernel runs in Triton's interpreter (default 2)",
    )
    parser.add_argument("--json", default=None, help="also write the rows to this .json file")
    args = parser.parse_args(argv)
    from vit_fast.model.config import PRESETS

    args.models = [m.strip() for m in args.models.split(",")]
    for name in args.models:
        if name != "default" and name not in PRESETS:
            parser.error(f"--models: {name!r} is neither default nor a preset ({', '.join(sorted(PRESETS))})")
    return args


def write_images(folder: Path, model_name: str, count: int, size: tuple[int, int], seed: int = 0) -> list[Path]:
    """``count`` image files in ``folder``: 8x8 PNG digits for ``default``, else ``size`` JPEGs."""
    import numpy as np
    import torch
    from PIL import Image

    files = []
    g = torch.Generator().manual_seed(seed)
    for i in range(count):
        if model_name == "default":
            pixels = (torch.rand(8, 8, generator=g) * 255).to(torch.uint8).numpy()
            path = folder / f"{i:05d}.png"
            Image.fromarray(pixels, "L").save(path)
        else:
            h, w = size
            smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 6, 8, generator=g), size=(h, w), mode="bicubic")
            pixels = (smooth[0].permute(1, 2, 0).clamp(0, 1) * 255).to(torch.uint8).numpy()
            path = folder / f"{i:05d}.jpg"
            Image.fromarray(np.ascontiguousarray(pixels)).save(path, quality=90)
        files.append(path)
    return files


def library_transform(model, name: str):
    """(transform, what it is): timm's eval transform where torchvision imports, else image_transform."""
    from vit_fast import image_transform
    from vit_fast.interop.timm_import import standin_installed

    if name != "default" and not standin_installed():
        try:
            import timm.data

            data = timm.data.resolve_data_config(model=model)
            return timm.data.create_transform(**data, is_training=False), "timm create_transform"
        except (ImportError, RuntimeError):  # no usable torchvision: timm's transforms cannot run here
            pass
    return image_transform(model), "vit_fast.image_transform"


def by_hand(model, files: list[Path], transform, mode: str, top_k: int) -> None:
    """What users write: one file at a time, decoded, transformed, run, top-k."""
    import torch
    from PIL import Image

    weight = next(model.parameters())
    with torch.inference_mode():
        for path in files:
            with Image.open(path) as image:
                x = transform(image.convert(mode))
            probs = torch.softmax(model(x[None].to(weight.device, weight.dtype)).float(), dim=-1)
            probs.topk(min(top_k, probs.shape[-1])).indices.tolist()  # read, as a user reads the labels


def predict_path(model, files: list[Path], transform, args: argparse.Namespace, kernel: bool | None = False) -> str:
    """``vit-fast predict``'s path over ``files``; what preprocessed the last batch (``kernel=None``: as predict
    decides, the fused kernel where the model runs the triton backend)."""
    from vit_fast.interop.predicting import DEFAULT_THREADS, predict_files

    threads = args.decode_threads or DEFAULT_THREADS
    answers = predict_files(model, files, transform, batch=args.batch, threads=threads, top_k=args.top_k, kernel=kernel)
    how = ""
    for batch in answers:
        how = batch[0].preprocessing if batch else how
        if kernel and batch and batch[0].preprocessing and not batch[0].preprocessing.startswith("fused"):
            raise RuntimeError(f"the fused-kernel row ran {batch[0].preprocessing}")
    return how


def timed(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls, after one untimed call."""
    fn()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vit_fast.util.files import check_report_file, temp_staging, write_json_atomic

    json_path = None if args.json is None else check_report_file(args.json, "--json")  # before any measurement
    import torch

    from vit_fast import image_transform, load_model
    from vit_fast.backend.env import git_commit
    from vit_fast.bench.settings import cpu_threads_for_load
    from vit_fast.interop.image_transform import fused_unsupported
    from vit_fast.interop.images import pil_image_module

    pil_image_module()
    torch.set_num_threads(args.threads or cpu_threads_for_load()[0])
    load = os.getloadavg()[0]
    print(f"CPU, {torch.get_num_threads()} torch threads, load average {load:.1f} on {os.cpu_count()} cores")
    rows, skipped = [], []
    with temp_staging("vit-fast-pipeline") as folder:
        for name in args.models:
            model = load_model(name, backend="torch")
            (folder / name).mkdir()
            files = write_images(folder / name, name, args.images, args.size)
            hand, what = library_transform(model, name)
            ours = image_transform(model)
            mode = "L" if ours.preprocessing.channels == 1 else "RGB"
            cases = {
                f"by hand ({what}, 1 image at a time)": (files, partial(by_hand, model, files, hand, mode, args.top_k)),
                f"predict (batch {args.batch}, decode threads)": (
                    files,
                    partial(predict_path, model, files, ours, args),
                ),
            }
            kernel_row = "predict, fused preprocessing kernel"
            reason = fused_unsupported(ours.preprocessing, "cpu")
            if reason is not None:
                print(f"{name:24s} {kernel_row}: skipped: {reason}", flush=True)
                skipped.append({"model": name, "path": kernel_row, "skipped": reason})
            else:
                few = files[: args.interpreter_images]  # the interpreter: the only way to run it without a GPU
                label = f"{kernel_row} (Triton interpreter on the CPU, not GPU speed; batch {args.batch})"
                cases[label] = (few, partial(predict_path, model, few, ours, args, kernel=True))
            for row, (timed_files, fn) in cases.items():
                seconds = timed(fn, args.repeats)
                rows.append(
                    {
                        "model": name,
                        "path": row,
                        "images": len(timed_files),
                        "seconds": seconds,
                        "images_per_s": len(timed_files) / seconds,
                    }
                )
                rate = len(timed_files) / seconds
                print(f"{name:24s} {row:58s} {rate:9.{1 if rate >= 1 else 3}f} images/s", flush=True)
    result = {
        "rows": rows,
        "skipped": skipped,
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "load_average": load,
        "cores": os.cpu_count(),
        "commit": git_commit(),
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    if json_path is not None:
        write_json_atomic(result, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
