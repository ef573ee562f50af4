"""vit_fast::preprocess (uint8 HWC images -> resized, centre-cropped, normalised [B, 3, h, w]) against its float64
reference by eager's own error, in odd sizes, upscaled, downscaled and 1-pixel strips, several sizes in one launch;
with ``uint8_passes`` (PIL's uint8 resize) on checkerboards and thin lines in both of Pillow's pass orders, its
reference equal to Pillow's RGB resize at every pixel;
and the reference itself against two independent implementations: PIL's float ('F') resize and torch's
``interpolate(antialias=True)`` (within 1e-4 and 1e-9 in 0..255 units), and PIL's uint8 resize (within 1 level).
Tiny sizes: the kernel runs in Triton's interpreter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vit_fast.kernels import preprocess as preprocess_module
from vit_fast.kernels import preprocess_tiles
from vit_fast.kernels.preprocess import launch_preprocess, preprocess, preprocess_ref
from vit_fast.kernels.preprocess_weights import crop_start

from ..numerics import assert_within_eager, poisoned

IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
#: (source sizes (H, W) in one launch, resize (H, W), crop (H, W), interpolation)
CASES = {
    "odd-37x53-bicubic": ([(37, 53)], (40, 32), (32, 32), "bicubic"),
    "downscale-bilinear": ([(43, 47)], (17, 20), (15, 16), "bilinear"),
    "downscale-bicubic": ([(29, 31)], (11, 9), (9, 9), "bicubic"),
    "upscale-digits-8x8": ([(8, 8)], (32, 32), (32, 32), "bilinear"),
    "strip-1xN-bicubic": ([(1, 29)], (6, 10), (5, 7), "bicubic"),
    "strip-Nx1-bilinear": ([(23, 1)], (8, 4), (7, 3), "bilinear"),
    "mixed-sizes": ([(13, 17), (9, 14), (20, 11)], (12, 10), (11, 9), "bicubic"),
    # under the interpreter a program covers 32 x 32 output pixels: 2 x 2 programs, both with tails
    "tiles-and-tails": ([(30, 20)], (36, 40), (33, 34), "bicubic"),
    # each image its own resize (an aspect-keeping resize's), one launch; image 1's crop offset 1.5 rounds two ways
    "per-image-resize": ([(13, 17), (9, 14), (20, 11)], [(10, 13), (10, 12), (18, 10)], (9, 9), "bicubic"),
}


def _images(sizes, device="cpu"):
    return [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device=device) for h, w in sizes]


def _args(case):
    sizes, resize, crop, interpolation = CASES[case]
    return _images(sizes), dict(resize=resize, crop=crop, interpolation=interpolation, **IMAGENET)


#: every case in fp32; the 16-bit outputs (the same accumulation, one rounding at the store) on two
DTYPE_CASES = [(case, torch.float32) for case in CASES] + [
    (case, dtype) for case in ("odd-37x53-bicubic", "strip-1xN-bicubic") for dtype in (torch.float16, torch.bfloat16)
]


@pytest.mark.parametrize("case, dtype", DTYPE_CASES, ids=[f"{c}-{str(d)[6:]}" for c, d in DTYPE_CASES])
def test_preprocess_matches_float64(case, dtype):
    images, kw = _args(case)
    crop = kw["crop"]
    out = launch_preprocess(images, out_dtype=dtype, out=poisoned((len(images), 3, *crop), dtype), **kw)
    truth = preprocess_ref(images, out_dtype=torch.float64, compute_dtype=torch.float64, **kw)
    eager = preprocess_ref(images, out_dtype=dtype, **kw)
    assert_within_eager(out, eager, truth, f"preprocess {case} {dtype}")


def test_each_image_alone_equals_its_row_of_a_mixed_batch():
    """One launch for images of three sizes gives each image what a launch of its own gives (the op's public call)."""
    images, kw = _args("mixed-sizes")
    batch = preprocess(images, **kw)
    for i, image in enumerate(images):
        torch.testing.assert_close(preprocess([image], **kw)[0], batch[i], rtol=0, atol=0)


def test_per_image_resize_and_floor_offsets_equal_launches_of_their_own():
    """A list of resizes (one per image) gives each image what a launch with its resize alone gives; floor offsets
    (transformers' centre crop) move the crop where round's banker's rounding does not, and match the reference."""
    images, kw = _args("per-image-resize")
    resizes = kw.pop("resize")
    batches = {}
    for rounding in ("round", "floor"):
        batch = batches[rounding] = preprocess(images, resize=resizes, crop_rounding=rounding, **kw)
        for i, (image, size) in enumerate(zip(images, resizes, strict=True)):
            alone = preprocess([image], resize=size, crop_rounding=rounding, **kw)[0]
            torch.testing.assert_close(alone, batch[i], rtol=0, atol=0)
        ref = dict(resize=resizes, crop_rounding=rounding, **kw)
        truth = preprocess_ref(images, out_dtype=torch.float64, compute_dtype=torch.float64, **ref)
        assert_within_eager(batch, preprocess_ref(images, **ref), truth, f"preprocess per-image resize {rounding}")
    assert torch.equal(batches["round"][0], batches["floor"][0]) and not torch.equal(*batches.values())
    assert crop_start(15, 10, "floor") == 2 and crop_start(15, 10) == 2  # round(2.5) == 2
    assert crop_start(13, 10, "floor") == 1 and crop_start(13, 10) == 2  # round(1.5) == 2


def test_strided_views_are_read_as_their_pixels():
    """A cropped view of a larger decoded image (not contiguous) gives what its contiguous copy gives."""
    big = _images([(12, 15)])[0]
    view = big[2:11, 3:14]
    kw = dict(resize=(8, 9), crop=(7, 9), interpolation="bilinear", **IMAGENET)
    assert not view.is_contiguous()
    torch.testing.assert_close(preprocess([view], **kw), preprocess([view.contiguous()], **kw), rtol=0, atol=0)


# ---------------------------------------------------------------------------------- the reference, independently
def _in_255(images, kw):
    """The reference's resize + crop alone, in 0..255 units (mean 0, std 1/255), float64, [B, 3, h, w]."""
    return preprocess_ref(
        images,
        **{**kw, "mean": (0.0,) * 3, "std": (1 / 255,) * 3},
        out_dtype=torch.float64,
        compute_dtype=torch.float64,
    )


def _pil_resize(image: torch.Tensor, resize, crop, interpolation, float_mode: bool) -> torch.Tensor:
    # the images extra's Pillow: .venv-oldest (the kernels on the oldest triton) installs vit-fast without extras
    Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed (the images extra brings it)")

    method = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}[interpolation]
    top, left = crop_start(resize[0], crop[0]), crop_start(resize[1], crop[1])
    pixels = image.numpy()
    if float_mode:  # PIL's 'F' path: float32 pixels, double accumulators, no rounding
        planes = [
            np.asarray(Image.fromarray(pixels[:, :, c].astype(np.float32), "F").resize(resize[::-1], method))
            for c in range(3)
        ]
        resized = np.stack(planes)
    else:
        resized = np.asarray(Image.fromarray(pixels, "RGB").resize(resize[::-1], method)).transpose(2, 0, 1)
    out = resized[:, top : top + crop[0], left : left + crop[1]]
    return torch.from_numpy(out.astype(np.float64))


REFERENCE_CASES = [c for c in CASES if c not in ("mixed-sizes", "per-image-resize")]


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_reference_matches_pil_float_resize(case):
    images, kw = _args(case)
    ours = _in_255(images, kw)[0]
    pil = _pil_resize(images[0], kw["resize"], kw["crop"], kw["interpolation"], float_mode=True)
    assert (ours - pil).abs().max().item() <= 1e-4


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_reference_matches_torch_interpolate_antialias(case):
    images, kw = _args(case)
    (h, w), (ch, cw) = kw["resize"], kw["crop"]
    top, left = crop_start(h, ch), crop_start(w, cw)
    x = images[0].permute(2, 0, 1)[None].double()
    resized = torch.nn.functional.interpolate(
        x, size=(h, w), mode=kw["interpolation"], antialias=True, align_corners=False
    )
    theirs = resized[0, :, top : top + ch, left : left + cw]
    # both in float64, the same taps: they agree to rounding (3e-13 seen)
    assert (_in_255(images, kw)[0] - theirs).abs().max().item() <= 1e-9


def _smooth(h: int, w: int) -> torch.Tensor:
    """A photo-like image: low frequencies within 28..228, so no bicubic overshoot leaves 0..255."""
    y, x = torch.meshgrid(torch.linspace(0, 3, h), torch.linspace(0, 4, w), indexing="ij")
    planes = [128 + 100 * torch.sin(x * (c + 1) + y * (2 - c) + c) for c in range(3)]
    return torch.stack(planes, -1).round().to(torch.uint8)


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_reference_within_one_level_of_pil_uint8_resize(case):
    """PIL's RGB path rounds (fixed-point taps, uint8 between its two passes): within 1 level of ours, rounded at
    the end, on a smooth image. (On uniform noise PIL also clips its bicubic overshoot between the passes, which
    moves it up to 7 levels from any unclipped float resize.)"""
    _, kw = _args(case)
    images = [_smooth(*CASES[case][0][0])]
    ours = _in_255(images, kw)[0].round().clamp(0, 255)
    pil = _pil_resize(images[0], kw["resize"], kw["crop"], kw["interpolation"], float_mode=False)
    assert (ours - pil).abs().max().item() <= 1


# ---------------------------------------------------------------------------------- PIL's uint8 passes
def _checkerboard(h: int, w: int, cell: int = 3) -> torch.Tensor:
    """0 / 255 cells, each channel shifted: bicubic overshoots at every edge, in both directions."""
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    planes = [((y // cell + (x + c) // cell) % 2) * 255 for c in range(3)]
    return torch.stack(planes, -1).to(torch.uint8)


def _thin_lines(h: int, w: int) -> torch.Tensor:
    """1-pixel lines (rows, columns, a diagonal) on a dark ground with noise: the hardest edges there are."""
    image = torch.randint(0, 40, (h, w, 3), dtype=torch.uint8)
    image[::4] = 255
    image[:, 2::5, 1] = 255
    idx = torch.arange(min(h, w))
    image[idx, idx] = torch.tensor([255, 0, 200], dtype=torch.uint8)
    return image


#: (image maker, source sizes, resize, crop, interpolation): each Pillow order, down- and upscales, odd sizes
UINT8_CASES = {
    "checker-bicubic-height-first": (_checkerboard, [(41, 17)], (12, 20), (11, 19), "bicubic"),
    "lines-bicubic-width-first": (_thin_lines, [(29, 37)], (20, 15), (19, 15), "bicubic"),
    "checker-bilinear-height-first": (_checkerboard, [(30, 40)], (10, 36), (9, 33), "bilinear"),
    "lines-bilinear-upscale": (_thin_lines, [(13, 11)], (31, 27), (29, 27), "bilinear"),
    "lines-bicubic-tiles": (_thin_lines, [(45, 31)], (36, 40), (33, 34), "bicubic"),
    "mixed-orders": (_checkerboard, [(41, 17), (29, 37), (30, 40)], [(12, 20), (20, 15), (10, 36)], (9, 9), "bicubic"),
}


def _uint8_args(case):
    make, sizes, resize, crop, interpolation = UINT8_CASES[case]
    images = [make(h, w) for h, w in sizes]
    return images, dict(resize=resize, crop=crop, interpolation=interpolation, uint8_passes=True, **IMAGENET)


@pytest.mark.parametrize("case", UINT8_CASES)
def test_uint8_passes_match_float64(case):
    """PIL's uint8 resize in the kernel (first pass in exact integers, clip8-ed, each image in Pillow's order) against
    its reference in float64 by the numerics rule: the first pass is exact in both, the second carries the error."""
    images, kw = _uint8_args(case)
    out = launch_preprocess(images, out=poisoned((len(images), 3, *kw["crop"]), torch.float32), **kw)
    truth = preprocess_ref(images, out_dtype=torch.float64, compute_dtype=torch.float64, **kw)
    assert_within_eager(out, preprocess_ref(images, **kw), truth, f"preprocess uint8 passes {case}")
    # a kernel ignoring the flag would fail: the float resize is a different function (by 1e-2 to 1e-1 here)
    float64 = dict(out_dtype=torch.float64, compute_dtype=torch.float64)
    assert float((preprocess_ref(images, **float64, **{**kw, "uint8_passes": False}) - truth).abs().max()) > 1e-3


@pytest.mark.parametrize("case", [c for c in UINT8_CASES if len(UINT8_CASES[c][1]) == 1])
def test_uint8_reference_is_pillows_resize_to_the_level(case):
    """The uint8 reference, rounded half up at the end as Pillow stores it, equals Pillow's RGB resize (then the
    crop) at every pixel: the same fixed-point weights, the same clip8 between the passes, the same pass order."""
    images, kw = _uint8_args(case)
    ours = _in_255(images, kw)[0].add(0.5).floor()
    pil = _pil_resize(images[0], kw["resize"], kw["crop"], kw["interpolation"], float_mode=False)
    assert torch.equal(ours, pil), float((ours - pil).abs().max())


# ---------------------------------------------------------------------------------- errors before any launch
BAD = [
    ("not a list", lambda im: im, {}, TypeError, "list of uint8"),
    ("empty", lambda im: [], {}, ValueError, "empty"),
    ("float image", lambda im: [im.float()], {}, TypeError, "uint8"),
    ("CHW", lambda im: [im.permute(2, 0, 1)], {}, ValueError, "HWC"),
    ("RGBA", lambda im: [torch.cat([im, im[:, :, :1]], 2)], {}, ValueError, "3 channels"),
    ("crop > resize", lambda im: [im], {"crop": (9, 8)}, ValueError, "larger than resize"),
    ("crop > one resize", lambda im: [im, im], {"resize": [(8, 8), (8, 7)]}, ValueError, r"\(image 1\)"),
    ("resize count", lambda im: [im, im], {"resize": [(8, 8)] * 3}, ValueError, "a list of 2 .one per image"),
    ("crop rounding", lambda im: [im], {"crop_rounding": "ceil"}, ValueError, "crop_rounding 'ceil'"),
    ("interpolation", lambda im: [im], {"interpolation": "nearest"}, ValueError, "unknown interpolation"),
    ("resize", lambda im: [im], {"resize": (0, 8)}, ValueError, "resize must be"),
    ("mean", lambda im: [im], {"mean": (0.5, 0.5)}, ValueError, "mean must be 3"),
    ("std", lambda im: [im], {"std": (0.5, 0.0, 0.5)}, ValueError, "std must be positive"),
    ("dtype", lambda im: [im], {"out_dtype": torch.float64}, TypeError, "out_dtype"),
]


@pytest.mark.parametrize("what, images, change, error, text", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_before_launch(monkeypatch, what, images, change, error, text):
    def no_launch(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(preprocess_module, "_preprocess_launches", no_launch)
    kw = {"resize": (8, 8), "crop": (8, 8), "interpolation": "bilinear", **IMAGENET, **change}
    image = torch.randint(0, 256, (6, 5, 3), dtype=torch.uint8)
    with pytest.raises(error, match=text):
        preprocess(images(image), **kw)


def test_op_compiles_fullgraph():
    """torch.compile(fullgraph=True) traces the custom op (its fake) and runs the kernel (opcheck: in
    test_kernel_opcheck.py)."""
    images, kw = _images([(6, 5), (4, 7)]), dict(resize=(5, 6), crop=(4, 5), interpolation="bicubic", **IMAGENET)
    batch = preprocess_module._pack_for_kernel(images, kw["resize"], kw["crop"], kw["interpolation"])
    args = (*batch, 4, 5, list(kw["mean"]), list(kw["std"]), torch.float32, False)
    compiled = torch.compile(lambda *a: torch.ops.vit_fast.preprocess(*a), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(*args), preprocess(images, **kw), rtol=0, atol=0)


def test_output_feeds_the_patch_embedding_as_it_is():
    """preprocess's ``[B, 3, h, w]`` output is a float image the fused patch embedding takes without a copy: the
    two kernels in a row against the two references in float64, by the numerics rule (eager: both in fp32)."""
    from vit_fast.kernels.patch_embed import patch_embed, patch_embed_ref

    images, kw = _images([(13, 10), (7, 9)]), dict(resize=(10, 9), crop=(8, 8), interpolation="bicubic", **IMAGENET)
    weight, bias = torch.randn(6, 3, 4, 4), torch.randn(6)
    pos, cls = torch.randn(1, 5, 6), torch.randn(1, 1, 6)
    tokens = patch_embed(preprocess(images, **kw), weight, bias, pos, cls)
    truth64 = preprocess_ref(images, out_dtype=torch.float64, compute_dtype=torch.float64, **kw)
    truth = patch_embed_ref(truth64, weight.double(), bias.double(), pos.double(), cls.double())
    eager = patch_embed_ref(preprocess_ref(images, **kw), weight, bias, pos, cls)
    assert_within_eager(tokens, eager, truth, "preprocess -> patch_embed")


def test_compiled_mode_candidates_and_the_no_autotune_pick(monkeypatch):
    """Compiled (not interpreted): five tiles of at most 1024 outputs on 4 warps; tuning keeps every one, the
    no-autotune pick is 8 x 64. The interpreter gets one config (it cannot time any)."""
    monkeypatch.setattr(preprocess_tiles, "interpreter_enabled", lambda: False)
    configs = preprocess_module.preprocess_configs()
    tiles = {(c.kwargs["BLOCK_Y"], c.kwargs["BLOCK_X"]) for c in configs}
    assert tiles == {(4, 64), (4, 128), (8, 64), (8, 128), (16, 64)} and {c.num_warps for c in configs} == {4}
    assert preprocess_module.prune_preprocess_configs(configs, {"TUNE": 1}) == configs
    (pick,) = preprocess_module.prune_preprocess_configs(configs, {"TUNE": 0})
    assert (pick.kwargs, pick.num_warps) == ({"BLOCK_Y": 8, "BLOCK_X": 64}, 4)
    monkeypatch.undo()
    assert len(preprocess_module.preprocess_configs()) == 1
