"""vit_fast.image_transform against the libraries' own evaluation preprocessing, and the image loader.

Parity rule (the libraries resize uint8 pixels with PIL; ours resizes in float32): at most 0.01 mean and 0.05 max
absolute difference in normalized units. timm's eval transform is built from torchvision's transforms, which do not
import on the CPU machines (timm runs through vit-fast's stand-in there): where torchvision is missing, timm's pipeline
is computed from PIL exactly as torchvision's PIL path computes it (Resize(int): the shorter side to the size, the
longer to int(size * long / short), PIL's filter; CenterCrop: offsets int(round((size - crop) / 2)); ToTensor,
Normalize), from the data config timm's own resolve_data_config returns for the model.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

PIL = pytest.importorskip("PIL", reason="Pillow (the images extra) is needed to decode images")
from PIL import Image  # noqa: E402

import vit_fast  # noqa: E402
from vit_fast import VisionTransformer, ViTConfig  # noqa: E402
from vit_fast.interop.image_transform import Preprocessing, from_data_config, from_image_processor  # noqa: E402
from vit_fast.interop.images import image_files, load_image  # noqa: E402

MEAN_TOL, MAX_TOL = 0.01, 0.05
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TIMM_CONFIGS = {  # the three data configs the issue names, at a test-sized input
    "bicubic-0.9-half": dict(interpolation="bicubic", crop_pct=0.9, mean=(0.5,) * 3, std=(0.5,) * 3),
    "bicubic-1.0-clip": dict(interpolation="bicubic", crop_pct=1.0, mean=CLIP_MEAN, std=CLIP_STD),
    "bilinear-0.875-imagenet": dict(interpolation="bilinear", crop_pct=0.875, mean=IMAGENET_MEAN, std=IMAGENET_STD),
}
#: source sizes (h, w): downscaled and upscaled, portrait and landscape, odd on purpose
SOURCES = [(37, 53), (61, 29), (19, 23), (97, 131)]
PIL_FILTER = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """uint8 HxWx3: a smooth random field with hard edges and noise (resizing's worst cases together)."""
    g = torch.Generator().manual_seed(seed)
    smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 5, 7, generator=g), size=(h, w), mode="bicubic")
    noise = torch.rand(1, 3, h, w, generator=g) * 0.25
    edges = (torch.arange(w).view(1, 1, 1, w) % 9 < 3).float() * 0.3
    image = ((smooth + noise + edges).clamp(0, 1) * 255).round().to(torch.uint8)
    return image[0].permute(1, 2, 0).contiguous().numpy()


def _normalize(array: np.ndarray, mean, std) -> torch.Tensor:
    x = torch.from_numpy(np.asarray(array, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return (x - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)


def _timm_eval_from_pil(image: Image.Image, data: dict) -> torch.Tensor:
    """timm's transforms_imagenet_eval (crop_mode center, square input) as torchvision's PIL path runs it."""
    _, height, width = data["input_size"]
    scale = math.floor(height / data["crop_pct"])
    w, h = image.size
    nh, nw = (int(scale * h / w), scale) if w <= h else (scale, int(scale * w / h))
    resized = image.resize((nw, nh), PIL_FILTER[data["interpolation"]])
    top, left = int(round((nh - height) / 2.0)), int(round((nw - width) / 2.0))
    cropped = resized.crop((left, top, left + width, top + height))
    return _normalize(np.asarray(cropped), data["mean"], data["std"])


def _timm_library_transform(data: dict):
    """timm's own eval transform where torchvision imports, else None (then computed from PIL)."""
    from vit_fast.interop.timm_import import standin_installed

    if standin_installed():
        return None
    import timm.data

    return timm.data.create_transform(**data, is_training=False)


def _close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    diff = (ours - ref).abs()
    assert float(diff.mean()) <= MEAN_TOL and float(diff.max()) <= MAX_TOL, (
        what,
        float(diff.mean()),
        float(diff.max()),
    )


@pytest.mark.parametrize("name", sorted(TIMM_CONFIGS))
def test_timm_eval_transform_parity(name):
    import timm.data

    model = VisionTransformer(ViTConfig(img_size=24, patch_size=8, embed_dim=16, depth=1, num_heads=2), "torch")
    model.pretrained_cfg = {"input_size": (3, 24, 24), **TIMM_CONFIGS[name]}
    data = timm.data.resolve_data_config(model=model)  # timm's own reading of the model's config
    transform = vit_fast.image_transform(model)
    library = _timm_library_transform(data)
    for i, (h, w) in enumerate(SOURCES):
        image = Image.fromarray(_photo(h, w, seed=i))
        ref = library(image) if library is not None else _timm_eval_from_pil(image, data)
        _close(transform(image), ref, f"{name} {h}x{w}")
    assert transform.source == "timm pretrained_cfg"


def _hf_processors():
    """The PIL image processors (transformers 5 names them ``...Pil``; before 5 the plain classes were PIL's): the
    ones that run here, where torchvision is a stand-in."""
    transformers = pytest.importorskip("transformers")

    def pil(name: str):
        return getattr(transformers, name + "Pil", None) or getattr(transformers, name)

    return {
        "vit": pil("ViTImageProcessor")(size={"height": 40, "width": 40}),  # bilinear, mean/std 0.5, no crop
        "siglip": pil("SiglipImageProcessor")(size={"height": 32, "width": 32}),  # bicubic, squash
        "bit-dinov2": pil("BitImageProcessor")(  # DINOv2's: shortest edge, bicubic, centre crop, ImageNet
            size={"shortest_edge": 36},
            crop_size={"height": 32, "width": 32},
            resample=3,
            image_mean=list(IMAGENET_MEAN),
            image_std=list(IMAGENET_STD),
            do_convert_rgb=True,
        ),
    }


@pytest.mark.parametrize("name", ["vit", "siglip", "bit-dinov2"])
def test_transformers_image_processor_parity(name, tmp_path):
    processor = _hf_processors()[name]
    model = VisionTransformer(ViTConfig(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2), "torch")
    from_object = vit_fast.image_transform(model, processor)
    processor.save_pretrained(tmp_path)  # preprocessor_config.json, as a save_pretrained folder holds it
    from_folder = vit_fast.image_transform(model, tmp_path)
    assert from_folder.preprocessing == from_object.preprocessing
    for i, (h, w) in enumerate(SOURCES):
        array = _photo(h, w, seed=10 + i)
        ref = processor(images=array, return_tensors="pt")["pixel_values"][0]
        _close(from_object(array), ref, f"{name} {h}x{w}")


def test_default_model_reads_its_record_and_matches_training(tmp_path):
    pytest.importorskip("sklearn", reason="the digits data comes from scikit-learn (the demo extra)")
    from sklearn.datasets import load_digits

    from vit_fast.assets import preprocess

    model = vit_fast.load_model("default", backend="torch")
    transform = vit_fast.image_transform(model)
    assert transform.preprocessing.channels == 1 and transform.source == "vit-fast digits_vit.json"
    digits = load_digits()
    for i in (0, 7, 1001):
        path = tmp_path / f"{i}.png"
        Image.fromarray(np.round(digits.images[i] * 255 / 16).astype(np.uint8), "L").save(path)
        ours, trained = transform(path), preprocess(digits.images[i])[0]
        # the PNG holds 0..16 scaled to 0..255 and rounded: half a level over the recorded std
        assert torch.allclose(ours, trained, atol=0.5 / 255 / 0.3237 + 1e-6), float((ours - trained).abs().max())
    assert vit_fast.interop.image_transform.model_labels(model) == [str(d) for d in range(10)]


def test_model_labels_from_hf_config_and_timm():
    from vit_fast.interop.image_transform import model_labels

    model = VisionTransformer(ViTConfig(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2), "torch")
    assert model_labels(model) is None
    model.pretrained_cfg = {"input_size": (3, 16, 16), "label_names": ["cat", "dog"]}
    assert model_labels(model) == ["cat", "dog"]
    model.config = type("Config", (), {"id2label": {0: "tench", 1: "goldfish"}})()
    assert model_labels(model) == ["tench", "goldfish"]


def test_preprocessing_parameters_for_a_kernel():
    pre = from_data_config({"input_size": (3, 224, 224), "crop_pct": 0.875, "interpolation": "bicubic"})
    assert pre.size == 256 and pre.crop == (224, 224) and pre.mean == IMAGENET_MEAN  # timm's defaults fill the rest
    assert pre.resize_hw(480, 640) == (256, 341) and pre.resize_hw(641, 480) == (341, 256)
    assert pre.crop_box(256, 341) == (16, 58, 224, 224)  # round((341 - 224) / 2) = round(58.5) = 58, as torchvision
    floor = Preprocessing(256, (224, 224), "bicubic", IMAGENET_MEAN, IMAGENET_STD, crop_rounding="floor")
    assert floor.crop_box(256, 343) == (16, 59, 224, 224)
    with pytest.raises(ValueError, match=r"interpolation 'lanczos' is not supported: use bilinear or bicubic"):
        Preprocessing(224, None, "lanczos", IMAGENET_MEAN, IMAGENET_STD)
    with pytest.raises(ValueError, match=r"crop_mode 'border'.*center or squash"):
        from_data_config({"input_size": (3, 32, 32), "crop_mode": "border"})


def test_a_model_without_preprocessing_gets_timms_defaults_with_a_warning():
    """A model whose pretrained_cfg has only its input size (a preset, a plain checkpoint): timm's defaults, said
    in a PreprocessingDefaultsWarning naming each value and how to set it; overrides set them, and a processor's
    preprocessing takes mean / std / interpolation but refuses timm's crop_pct."""
    import warnings

    from vit_fast.interop.image_transform import DATA_FIELDS, PreprocessingDefaultsWarning

    model = VisionTransformer(ViTConfig(img_size=24, patch_size=8, embed_dim=16, depth=1, num_heads=2), "torch")
    said = r"timm's defaults are used: interpolation bicubic; crop_pct 0.875; mean \(0.485.*ImageNet's.*--mean, --std"
    with pytest.warns(PreprocessingDefaultsWarning, match=said):
        transform = vit_fast.image_transform(model)
    assert transform.defaulted == DATA_FIELDS and transform.preprocessing.mean == IMAGENET_MEAN
    assert transform.as_dict()["defaulted"] == list(DATA_FIELDS) and transform.as_dict()["crop"] == [24, 24]
    overrides = dict(mean=(0.5,), std=(0.25, 0.25, 0.25), interpolation="bilinear", crop_pct=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every field set: nothing to say
        given = vit_fast.image_transform(model, overrides=overrides)
    pre = given.preprocessing
    assert (pre.mean, pre.std, pre.interpolation, pre.size, pre.crop) == (
        (0.5,) * 3,
        (0.25,) * 3,
        "bilinear",
        24,
        (24, 24),
    )
    assert given.defaulted == () and given.source == "timm pretrained_cfg (flags over it)"
    processor = {"image_processor_type": "ViTImageProcessor", "size": {"height": 24, "width": 24}}
    processor.update(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    pre = vit_fast.image_transform(model, processor, {"mean": (0.1, 0.2, 0.3)}).preprocessing
    assert pre.mean == (0.1, 0.2, 0.3) and pre.std == (0.5,) * 3 and pre.size == (24, 24)
    with pytest.raises(ValueError, match=r"crop_pct set timm's data config, but .* ViTImageProcessor.*--processor"):
        vit_fast.image_transform(model, processor, {"crop_pct": 0.9})
    with pytest.raises(ValueError, match=r"unknown preprocessing override\(s\) \['size'\]: choose from mean"):
        vit_fast.image_transform(model, overrides={"size": 3})


# --------------------------------------------------------------------------- the loader
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP"])
def test_formats_decode(fmt, tmp_path):
    array = _photo(21, 34, seed=3)
    path = tmp_path / f"x.{fmt.lower()}"
    Image.fromarray(array).save(path, fmt, **({"quality": 100} if fmt in ("JPEG", "WEBP") else {}))
    decoded = np.asarray(load_image(path))
    assert decoded.shape == (21, 34, 3)
    lossy = fmt in ("JPEG", "WEBP")
    assert np.abs(decoded.astype(int) - array).mean() < (12 if lossy else 1e-9)


def test_modes_convert_as_the_libraries_do(tmp_path):
    array = _photo(16, 20, seed=4)
    rgba = Image.fromarray(np.dstack([array, np.full((16, 20), 100, np.uint8)]), "RGBA")
    gray, palette = Image.fromarray(array).convert("L"), Image.fromarray(array).convert("P")
    for image in (rgba, gray, palette):
        image.save(tmp_path / "m.png")
        assert np.array_equal(np.asarray(load_image(tmp_path / "m.png")), np.asarray(image.convert("RGB")))
    assert load_image(tmp_path / "m.png", "L").mode == "L"


def test_exif_orientation_is_applied(tmp_path):
    array = _photo(10, 30, seed=5)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 clockwise to display
    Image.fromarray(array).save(tmp_path / "r.jpg", exif=exif.tobytes(), quality=100)
    assert load_image(tmp_path / "r.jpg").size == (10, 30)  # (w, h) once turned upright


def test_broken_files_name_the_file_and_the_reason(tmp_path):
    (tmp_path / "noise.png").write_bytes(b"not an image at all")
    buffer = io.BytesIO()
    Image.fromarray(_photo(40, 40, seed=6)).save(buffer, "PNG")
    (tmp_path / "cut.png").write_bytes(buffer.getvalue()[:200])
    with pytest.raises(ValueError, match=r"'.*noise.png' is not an image Pillow can read"):
        load_image(tmp_path / "noise.png")
    with pytest.raises(ValueError, match=r"'.*cut.png' cannot be decoded: "):
        load_image(tmp_path / "cut.png")
    with pytest.raises(TypeError, match=r"must be uint8 pixels"):
        load_image(np.zeros((4, 4, 3), np.float32))


def test_image_files_walks_folders_sorted_and_recursive(tmp_path):
    for name in ("b.png", "a.JPG", "sub/c.webp", ".hidden/d.png", "notes.txt", ".e.png"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    found = [p.relative_to(tmp_path).as_posix() for p in image_files([tmp_path])]
    assert found == ["a.JPG", "b.png", "sub/c.webp"]
    assert [p.name for p in image_files([tmp_path], recursive=False)] == ["a.JPG", "b.png"]
    assert image_files([tmp_path / "notes.txt"]) == [tmp_path / "notes.txt"]  # named: decoded whatever its suffix


def test_a_timm_model_and_its_conversion_carry_timms_data_config():
    import timm
    import timm.data

    tiny = dict(depth=1, embed_dim=32, num_heads=2)  # the data config is the tag's; the size does not matter
    source = timm.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k", pretrained=False, **tiny)
    data = timm.data.resolve_data_config(model=source)
    for model in (source, vit_fast.from_timm(source, backend="torch")):
        pre = vit_fast.image_transform(model).preprocessing
        assert pre.size == math.floor(224 / data["crop_pct"]) and pre.crop == tuple(data["input_size"][1:])
        assert (pre.interpolation, pre.mean, pre.std) == (data["interpolation"], data["mean"], data["std"])
    squash = from_data_config({**data, "crop_mode": "squash"})
    assert squash.size == (248, 248) and squash.resize_hw(100, 300) == (248, 248)


def test_without_pillow_the_error_names_the_extra(monkeypatch):
    from vit_fast.interop.images import pil_image_module

    monkeypatch.setitem(__import__("sys").modules, "PIL", None)  # as if Pillow were not installed
    with pytest.raises(ImportError, match=r"reading image files needs Pillow: pip install -e '\.\[images\]'"):
        pil_image_module()


# --------------------------------------------------------------------------- the fused kernel against image_transform
def _smooth_photo(h: int, w: int, seed: int) -> torch.Tensor:
    """uint8 [3, h, w]: low frequencies within 40..215, so no bicubic overshoot leaves 0..255."""
    g = torch.Generator().manual_seed(seed)
    smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 4, 5, generator=g), size=(h, w), mode="bilinear")
    return (40 + smooth[0] * 175).round().to(torch.uint8)


def _kernel_cases() -> dict[str, Preprocessing]:
    cases = {name: from_data_config({"input_size": (3, 24, 24), **cfg}) for name, cfg in TIMM_CONFIGS.items()}
    # DINOv2's BitImageProcessor, read as image_transform reads it: shortest edge 36, centre crop 32 (floor offsets)
    cases["bit-dinov2"] = from_image_processor(_hf_processors()["bit-dinov2"].to_dict())
    assert cases["bit-dinov2"].crop_rounding == "floor" and cases["bit-dinov2"].size == 36
    return cases


def _hard_edges(h: int, w: int, seed: int) -> torch.Tensor:
    """uint8 [3, h, w]: 0 / 255 blocks of odd sizes and 1-pixel lines, where bicubic overshoots most."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.rand(3, (h + 2) // 3, (w + 4) // 5, generator=g) > 0.5
    image = blocks.repeat_interleave(3, 1)[:, :h].repeat_interleave(5, 2)[:, :, :w].to(torch.uint8) * 255
    image[:, ::7] = 255 - image[:, ::7]
    image[1, :, 2::6] = 0
    return image


#: three source sizes in one launch: landscape, portrait, small (each Pillow order among the four preprocessings)
KERNEL_SOURCES = [(37, 53), (61, 29), (19, 23)]


@pytest.mark.parametrize("name", ["bicubic-0.9-half", "bicubic-1.0-clip", "bilinear-0.875-imagenet", "bit-dinov2"])
def test_fused_kernel_matches_image_transform(name):
    """One launch for three odd source sizes (each its own aspect-keeping resize) against image_transform per image,
    in the interpreter, within the parity bounds (0.01 mean, 0.05 max) on noisy edged photos and on hard-edged
    blocks and lines: the kernel resizes as PIL's uint8 passes do, as image_transform does."""
    from vit_fast.interop.image_transform import FUSED, apply, preprocess_batch

    pre = _kernel_cases()[name]
    for photo in (lambda h, w, seed: torch.from_numpy(_photo(h, w, seed)).permute(2, 0, 1), _hard_edges):
        images = [photo(h, w, i) for i, (h, w) in enumerate(KERNEL_SOURCES)]
        out, how = preprocess_batch(pre, images)
        assert how == FUSED and out.shape == (3, 3, *pre.output_hw)
        diff = (out - torch.stack([apply(pre, x) for x in images])).abs()
        assert float(diff.mean()) <= MEAN_TOL and float(diff.max()) <= MAX_TOL, (name, diff.mean(), diff.max())


def test_fused_kernel_float_resize_matches_image_transform():
    """A float resize (``uint8_passes=False``: torchvision on float tensors) runs the kernel's float path and
    image_transform's single float resize: the same function, to fp32 rounding, hard edges included."""
    from vit_fast.interop.image_transform import FUSED, apply, preprocess_batch

    pre = Preprocessing((20, 26), (18, 24), "bicubic", IMAGENET_MEAN, IMAGENET_STD, uint8_passes=False)
    images = [_hard_edges(h, w, 7 + i) for i, (h, w) in enumerate(KERNEL_SOURCES)]
    out, how = preprocess_batch(pre, images)
    assert how == FUSED
    torch.testing.assert_close(out, torch.stack([apply(pre, x) for x in images]), rtol=0, atol=2e-5)


def _pass_order_cases() -> list[tuple[int, int, int, int, str]]:
    """Both sides resized, near Pillow 13's turn from width-first to height-first (height shrinking by about twice
    the width's pixels) and where a ratio rule and a width-first rule guess wrong: (h, w, out_h, out_w, filter)."""
    cases = []
    for h, w in ((25, 25), (40, 20), (20, 40), (33, 29)):
        for out_h in (3, h // 3, h - 2):
            for step in (-2, -1, 0, 1, 6):
                out_w = w - (h - out_h) // 2 + step
                if 1 < out_w != w:  # (an output 1 pixel wide: torch's antialiased resize is not Pillow's there)
                    cases += [(h, w, out_h, out_w, f) for f in ("bicubic", "bilinear")]
    return cases


def test_pass_order_is_pillows(monkeypatch):
    """image_transform resizes in Pillow's pass order: against Pillow itself on random 0 / 255 pixels (each pass
    clips bicubic overshoot, so the order shows), within 2 levels (its last pass is unrounded, and a float first
    pass can round a near-tie the other way). The other order is off by more on a third of them (up to 25 levels)."""
    from vit_fast.interop import image_transform as module

    g = torch.Generator().manual_seed(0)
    cases = _pass_order_cases()
    images = [(torch.rand(3, h, w, generator=g) > 0.5).to(torch.uint8) * 255 for h, w, *_ in cases]
    pils = []
    for pixels, (*_, out_h, out_w, interpolation) in zip(images, cases, strict=True):
        pil = Image.fromarray(pixels.permute(1, 2, 0).numpy()).resize((out_w, out_h), PIL_FILTER[interpolation])
        pils.append(torch.from_numpy(np.asarray(pil).astype(np.float32)).permute(2, 0, 1))

    def worst(case, pixels, theirs) -> float:
        pre = Preprocessing(case[2:4], None, case[4], (0.0,) * 3, (1 / 255,) * 3)
        return float((module.apply(pre, pixels) - theirs).abs().max())

    assert len(cases) >= 91 and {module.pillow_vertical_first(c[:2], c[2:4]) for c in cases} == {True, False}
    for case, pixels, theirs in zip(cases, images, pils, strict=True):
        assert worst(case, pixels, theirs) <= 2.0, case
    real = module.pillow_vertical_first
    monkeypatch.setattr(module, "pillow_vertical_first", lambda source, size: not real(source, size))
    flipped = [worst(*row) for row in zip(cases, images, pils, strict=True)]
    assert sum(w > 2.0 for w in flipped) >= len(cases) // 3 and max(flipped) > 10
