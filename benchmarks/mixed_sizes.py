"""Images of different sizes in one call: packed (each image at its own size) against padded to the largest.

Times ``model.forward_packed(images)`` against one ordinary forward of every image zero-padded to the largest height
and width (``vit_fast.bench.mixed_sizes``), on the same model, images and timing rule, and reports the median time
per batch, images/s, tokens and attention pairs computed, and the ratios. The model is a preset with random weights
(seeded) built with ``dynamic_img_size=True``.

    python benchmarks/mixed_sizes.py                                      # ViT-B/16, 8 mixed sizes, torch, CPU
    python benchmarks/mixed_sizes.py --sizes 224x224,112x224,64x64 --json out.json
    python benchmarks/mixed_sizes.py --model vit_small_patch16_224 --random 16 --seed 1
    python benchmarks/mixed_sizes.py --device cuda --dtype bf16 --backend triton   # a GPU

Not a timed test: it prints a table (and optionally writes JSON through ``vit_fast.util.files``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # script_args beside this script, however it is loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))


#: the largest image side the script accepts, in pixels (a 4096x4096 image at patch 16 is 65,536 tokens)
MAX_SIDE = 4096


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, every value checked and bounded before any work (benchmarks/script_args.py)."""
    from script_args import ScriptParser, bounded, device, dtype

    parser = ScriptParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_base_patch16_224", help="preset name (default: vit_base_patch16_224)")
    parser.add_argument("--sizes", help="HxW,HxW,... pixels, multiples of the patch size (default: 8 mixed sizes)")
    parser.add_argument(
        "--random", type=bounded(int, 1, 4096), metavar="N", help="N random sizes (sides 64..224 px) instead of --sizes"
    )
    parser.add_argument("--seed", type=bounded(int, 0), default=0, help="weights, images and --random sizes (0)")
    parser.add_argument("--backend", default="torch", choices=("torch", "triton"), help="the model's backend")
    parser.add_argument("--device", type=device, default="cpu", help="cpu or cuda[:N] (default cpu)")
    parser.add_argument("--dtype", type=dtype, default="fp32", help="fp32, fp16 or bf16 (default fp32)")
    parser.add_argument("--warmup", type=bounded(int, 0, 1000), default=2, help="untimed calls per mode first (2)")
    parser.add_argument("--min-samples", type=bounded(int, 1, 100000), default=10, help="timed calls per mode (10)")
    parser.add_argument("--min-time", type=bounded(float, 0, 3600), default=1.0, help="seconds timed per mode (1)")
    parser.add_argument(
        "--max-seconds", type=bounded(float, 0.001, 86400), default=60.0, help="wall-clock cap per mode (60)"
    )
    parser.add_argument(
        "--threads", type=bounded(int, 1, 4096), help="CPU threads (default: the cores the load average leaves free)"
    )
    parser.add_argument("--json", help="also write the result to this JSON file")
    args = parser.parse_args(argv)

    from vit_fast import ViTConfig
    from vit_fast.bench import BenchError
    from vit_fast.bench.mixed_sizes import DEFAULT_SIZES, parse_sizes, random_sizes
    from vit_fast.util.dtypes import DTYPES
    from vit_fast.util.files import check_report_file
    from vit_fast.util.limits import check_batch_fits

    try:
        args.cfg = ViTConfig.from_name(args.model, dynamic_img_size=True)
    except (ValueError, KeyError) as err:
        parser.error(f"argument --model: {err}")
    patch = args.cfg.patch_size
    try:
        if args.random is not None:
            args.size_list = random_sizes(args.random, patch, 64, 224, args.seed)
        else:
            args.size_list = parse_sizes(args.sizes) if args.sizes else list(DEFAULT_SIZES)
    except BenchError as err:
        parser.error(f"argument --sizes: {err}")
    for h, w in args.size_list:
        if not (patch <= h <= MAX_SIDE and patch <= w <= MAX_SIDE) or h % patch or w % patch:
            parser.error(
                f"argument --sizes: {h}x{w}: each side must be a multiple of the patch size {patch} from {patch} "
                f"to {MAX_SIDE} pixels"
            )
    height, width = max(h for h, _ in args.size_list), max(w for _, w in args.size_list)
    size = DTYPES[args.dtype].itemsize
    try:  # the padded mode's batch is the largest: every image padded to the largest height and width
        if args.device == "cpu":
            check_batch_fits(args.cfg, len(args.size_list), height, width, size, "--sizes", "give smaller sizes")
        args.json_path = None if args.json is None else check_report_file(args.json, "--json")
    except (ValueError, OSError) as err:
        parser.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from vit_fast import VisionTransformer
    from vit_fast.backend.env import collect_environment, git_commit
    from vit_fast.bench.mixed_sizes import format_result, run_mixed_sizes
    from vit_fast.bench.settings import cpu_threads_for_load
    from vit_fast.bench.timing import Sampling
    from vit_fast.util.dtypes import dtype_name, parse_dtype
    from vit_fast.util.files import write_json_atomic

    cfg, sizes, json_path = args.cfg, args.size_list, args.json_path
    dtype = parse_dtype(args.dtype)
    device = torch.device(args.device)
    if device.type == "cpu":
        threads = args.threads or cpu_threads_for_load()[0]
        torch.set_num_threads(threads)
    model = VisionTransformer(cfg, backend=args.backend).eval()
    model.init_weights(seed=args.seed)
    model = model.to(device, dtype)
    sampling = Sampling(
        warmup=args.warmup, min_samples=args.min_samples, min_time_s=args.min_time, max_seconds=args.max_seconds
    )
    result = run_mixed_sizes(model, sizes, sampling=sampling, seed=args.seed)
    result.update(
        model=args.model,
        backend=model.resolved_backend(device),
        dtype=dtype_name(dtype),
        threads=torch.get_num_threads() if device.type == "cpu" else None,
        weights=model.describe_weights(),
        commit=git_commit(),
        environment=collect_environment(device),
    )
    print(f"{args.model}, {result['backend']} backend, {result['dtype']}, {device} ({result['threads']} threads)")
    print(format_result(result))
    if json_path is not None:
        write_json_atomic(result, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
