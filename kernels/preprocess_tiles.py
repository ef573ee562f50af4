"""The fused preprocessing kernel's tiles (:mod:`.preprocess`): its autotune candidates and the one pick, and what
``tools/compile_check.py`` compiles of it."""

from __future__ import annotations

import itertools

import triton

from vit_fast.base.interpret import interpreter_enabled

from .autotune import tuning_requested

#: the no-autotune pick: 8 output rows share each source row's horizontal pass; 64 columns per program
_PICK = {"BLOCK_Y": 8, "BLOCK_X": 64}


def preprocess_configs() -> list[triton.Config]:
    """Autotune candidates (output rows x columns per program), from the environment only; one under the
    interpreter, which cannot time configs."""
    if interpreter_enabled():
        return [triton.Config({"BLOCK_Y": 32, "BLOCK_X": 32}, num_warps=1)]
    # 4 warps each: at most 1024 outputs x 3 channels of accumulators per program (24 fp32 registers a thread)
    return [
        triton.Config({"BLOCK_Y": by, "BLOCK_X": bx}, num_warps=4)
        for by in (4, 8, 16)
        for bx in (64, 128)
        if by * bx <= 1024
    ]


def prune_preprocess_configs(configs, named_args, **kwargs):
    """Every candidate while tuning (``TUNE``), else the one heuristic pick :data:`_PICK` on 4 warps."""
    if tuning_requested(named_args) or len(configs) == 1:
        return configs
    return [next(c for c in configs if c.kwargs == _PICK and c.num_warps == 4)]


# ---------------------------------------------------------------------------------- compile-check variants
# what tools/compile_check.py compiles of this kernel (KERNELS[name].compile_variants / .compile_launch): its
# cases (kernel, label, params, which configs) per variant set, and one launch per case recorded through v.record;
# ``v`` is the tool's vocabulary (DTYPES, PICK_MODELS, PICK_BATCHES, EVERY_CONFIG_DTYPES, which, empty, torch_dtype)
#: preprocessing cases: (label, decoded image sizes in one launch, resize, crop, interpolation). vit-b16: photos
#: of two sizes to timm's eval input at 224 (short side to 248, centre 224); sweep: a 1080p frame downscaled 8x
#: (the most taps), the digits model's 8x8 upscaled to 32x32
_PREPROCESS_VARIANTS = {
    "vit-b16": (("photos 500x375+640x480 -> 248x330 / 224", ((375, 500), (480, 640)), (248, 330), (224, 224)),),
    "sweep": (
        ("1080p -> 224", ((1080, 1920),), (224, 398), (224, 224)),
        ("digits 8x8 -> 32", ((8, 8),), (32, 32), (32, 32)),
    ),
}


def compile_variants(v, variant_set: str, full: bool) -> list[tuple]:
    """Not in a ViT forward, so not in the picks set; every config it keeps for fp32 / fp16 (--every-config-dtypes),
    the pick for bf16, per interpolation."""
    cases = []
    for (name, sizes, resize, crop), dtype, interpolation, uint8 in itertools.product(
        _PREPROCESS_VARIANTS.get(variant_set, ()), v.DTYPES, ("bicubic", "bilinear"), (False, True)
    ):
        params = {"dtype": dtype, "sizes": sizes, "resize": resize, "crop": crop, "interpolation": interpolation}
        params["uint8_passes"] = uint8  # PIL's uint8 resize (image_transform's), or a float resize
        which = "all" if full else v.which(dtype)
        cases.append(("preprocess", f"{dtype} {interpolation}{' uint8' if uint8 else ''} {name}", params, which))
    return cases


def compile_launch(v, params: dict) -> tuple:
    import torch

    from .preprocess import launch_preprocess  # the kernel's file imports this one

    # the launcher packs the images' pixels (a copy of up to a MB) with torch on the CPU: on one thread, or the
    # forked compile workers hang in an OpenMP pool the parent started (seen: every worker asleep on a futex)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return v.record(
            launch_preprocess,
            [v.empty((h, w, 3), "u8") for h, w in params["sizes"]],
            resize=tuple(params["resize"]),
            crop=tuple(params["crop"]),
            interpolation=params["interpolation"],
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            out_dtype=v.torch_dtype(params["dtype"]),
            uint8_passes=params.get("uint8_passes", False),
        )
    finally:
        torch.set_num_threads(threads)
