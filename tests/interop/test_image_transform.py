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


@pytest.mark.parametrize("name", ["bicubic-0.9-half", "bicubic-1.0-clip", "bilinear-0.875-imagenet", "bit-dinov2"])
def test_fused_kernel_matches_image_transform(name):
    """One launch for three odd source sizes (each its own aspect-keeping resize) against image_transform per image,
    in the interpreter. image_transform clips and rounds to uint8 between PIL's two passes, the kernel filters in
    fp32 once: on smooth images both parity bounds hold; on the edged, noisy photo the mean bound holds everywhere
    and the max bound with bilinear (bicubic overshoot, clipped by PIL mid-way, moves single pixels up to 0.19)."""
    from vit_fast.interop.image_transform import FUSED, apply, preprocess_batch

    pre = _kernel_cases()[name]
    for photo in (_smooth_photo, lambda h, w, seed: torch.from_numpy(_photo(h, w, seed)).permute(2, 0, 1)):
        images = [photo(h, w, i) for i, (h, w) in enumerate(SOURCES[:3])]
        out, how = preprocess_batch(pre, images)
        assert how == FUSED and out.shape == (3, 3, *pre.output_hw)
        diff = (out - torch.stack([apply(pre, x) for x in images])).abs()
        assert float(diff.mean()) <= MEAN_TOL, (name, float(diff.mean()))
        if photo is _smooth_photo or pre.interpolation == "bilinear":
            assert float(diff.max()) <= MAX_TOL, (name, float(diff.max()))


def test_preprocess_batch_falls_back_with_its_reason():
    """What the kernel cannot do runs image_transform per image and says why: 1 channel (the embedded digits
    model), no antialias, no fixed output shape, the torch backend. Each result equals apply's."""
    from vit_fast.interop.image_transform import EAGER, apply, default_model_preprocessing, preprocess_batch

    rgb = Preprocessing((12, 10), (8, 8), "bilinear", IMAGENET_MEAN, IMAGENET_STD)
    cases = [
        (default_model_preprocessing(), True, "3 channels"),
        (Preprocessing(9, None, "bicubic", IMAGENET_MEAN, IMAGENET_STD), True, "cannot share one batch"),
        (Preprocessing((9, 9), None, "bilinear", IMAGENET_MEAN, IMAGENET_STD, antialias=False), True, "antialias"),
        (rgb, False, "torch backend"),
    ]
    for pre, kernel, reason in cases:
        images = [_smooth_photo(11, 14, 0)[: pre.channels], _smooth_photo(8, 8, 1)[: pre.channels]]
        out, how = preprocess_batch(pre, images, kernel=kernel)
        assert how.startswith(f"{EAGER}: ") and reason in how, how
        for got, image in zip(out, images, strict=True):
            assert torch.equal(got, apply(pre, image))
