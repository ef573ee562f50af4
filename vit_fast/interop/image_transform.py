"""A model's evaluation preprocessing, read from the model: :func:`image_transform` (an image in, ``[C, H, W]`` float
out) and its plain parameters, :class:`Preprocessing`, for code that does the same elsewhere (a GPU kernel). Sources:
a transformers image processor, timm's ``pretrained_cfg``, the embedded default model's record. The rules:
docs/usage.md, "Images in: image_transform"."""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vit_fast.interop.images import load_image
from vit_fast.kernels.preprocess_weights import pillow_vertical_first
from vit_fast.util.files import read_json

#: timm's defaults (timm.data.constants) where a pretrained_cfg leaves a field out
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875
DEFAULT_INTERPOLATION = "bicubic"
#: PIL's resample codes, as transformers' image processors store them
PIL_RESAMPLE = {2: "bilinear", 3: "bicubic"}
INTERPOLATIONS = ("bilinear", "bicubic")
CROP_ROUNDING = ("round", "floor")
#: the timm data config fields a model's pretrained_cfg may lack (then timm's defaults above fill them)
DATA_FIELDS = ("interpolation", "crop_pct", "mean", "std")
#: what :func:`image_transform` takes as ``overrides``: any preprocessing (the first three), timm's data config (all)
OVERRIDES = ("mean", "std", "interpolation", "crop_pct", "input_size")


class PreprocessingDefaultsWarning(UserWarning):
    """:func:`image_transform` filled a model's preprocessing from timm's defaults (ImageNet mean and std, bicubic,
    crop_pct 0.875): the model carries none of its own."""


@dataclass(frozen=True)
class Preprocessing:
    """One model's evaluation preprocessing. ``size``: an int resizes the shorter side to it (the longer one to
    ``int(size * long / short)``), a pair resizes to exactly (H, W); then a centre ``crop`` (H, W) (None: none),
    offsets rounded as torchvision (``round``) or transformers (``floor``) round; then ``(x / 255 - mean) / std``.
    ``uint8_passes``: the resize is PIL's on uint8 pixels (every source here), not a float resize (torchvision's on
    float tensors)."""

    size: int | tuple[int, int]
    crop: tuple[int, int] | None
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    antialias: bool = True
    channels: int = 3
    crop_rounding: str = "round"
    uint8_passes: bool = True

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation {self.interpolation!r} is not supported: use {' or '.join(INTERPOLATIONS)}"
            )
        if self.crop_rounding not in CROP_ROUNDING:
            raise ValueError(f"crop_rounding {self.crop_rounding!r}: use {' or '.join(CROP_ROUNDING)}")
        if self.channels not in (1, 3) or len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(f"{self.channels} channels need as many means and stds, got {self.mean} and {self.std}")
        if any(not s > 0 for s in self.std):
            raise ValueError(f"std must be positive, got {self.std}")

    def resize_hw(self, height: int, width: int) -> tuple[int, int]:
        """The (H, W) an image of ``height`` x ``width`` pixels is resized to, before the crop."""
        if not isinstance(self.size, int):
            return self.size
        if height <= width:
            return self.size, int(self.size * width / height)
        return int(self.size * height / width), self.size

    @property
    def output_hw(self) -> tuple[int, int] | None:
        """The (H, W) of every output (None: it follows each image's shape, an int size without a crop)."""
        return self.crop or (None if isinstance(self.size, int) else self.size)

    def crop_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``(top, left, crop_h, crop_w)`` of the centre crop on a resized ``height`` x ``width`` image."""
        ch, cw = self.crop or (height, width)
        if ch > height or cw > width:
            raise ValueError(f"a {ch}x{cw} crop does not fit in the resized {height}x{width} image")
        if self.crop_rounding == "floor":
            return (height - ch) // 2, (width - cw) // 2, ch, cw
        return int(round((height - ch) / 2.0)), int(round((width - cw) / 2.0)), ch, cw

    def describe(self) -> str:
        """One line: resize, crop, filter, mean and std, as ``vit-fast predict`` prints it."""
        size = f"shorter side to {self.size}" if isinstance(self.size, int) else "to {}x{}".format(*self.size)
        crop = ", centre crop {}x{}".format(*self.crop) if self.crop else ""
        stats = ", ".join(f"{name} {tuple(round(v, 4) for v in getattr(self, name))}" for name in ("mean", "std"))
        return f"resize {size} ({self.interpolation}{'' if self.antialias else ', no antialias'}){crop}, {stats}"


def apply(pre: Preprocessing, pixels: torch.Tensor) -> torch.Tensor:
    """``pixels`` (uint8 ``[C, H, W]``) preprocessed: float32 ``[C, crop_h, crop_w]``. The resize runs in float32,
    antialiased as PIL filters, in Pillow's pass order, each pass clamped to 0..255 as PIL's uint8 passes are (the
    first rounded half up too, as Pillow's ``clip8``; the second not)."""
    x = pixels.to(torch.float32)[None]
    height, width = pixels.shape[-2:]
    size = pre.resize_hw(height, width)
    if size != (height, width) and not pre.uint8_passes:  # a float resize: nothing rounded or clipped
        x = F.interpolate(x, size=size, mode=pre.interpolation, antialias=pre.antialias, align_corners=False)
    elif size != (height, width):
        resize = dict(mode=pre.interpolation, antialias=pre.antialias, align_corners=False)
        if pre.antialias and size[0] != height and size[1] != width:
            # PIL resizes in two uint8 passes, so a sharp edge that bicubic overshoots is clipped in between: the
            # same passes here, in the order Pillow takes
            first = (size[0], width) if pillow_vertical_first((height, width), size) else (height, size[1])
            x = F.interpolate(x, size=first, **resize).clamp_(0.0, 255.0).add_(0.5).floor_()
        x = F.interpolate(x, size=size, **resize).clamp_(0.0, 255.0)
    top, left, ch, cw = pre.crop_box(*size)
    x = x[0, :, top : top + ch, left : left + cw]
    mean = torch.tensor(pre.mean, dtype=torch.float32, device=x.device).view(-1, 1, 1)
    std = torch.tensor(pre.std, dtype=torch.float32, device=x.device).view(-1, 1, 1)
    return ((x / 255.0 - mean) / std).contiguous()


#: what :func:`preprocess_batch` ran: the fused Triton kernel, or :func:`apply` (eager PyTorch) per image
FUSED, EAGER = "fused kernel", "image_transform (eager)"


def fused_unsupported(pre: Preprocessing, device: torch.device | str, kernel: bool = True) -> str | None:
    """Why the fused kernel (``vit_fast.kernels.preprocess``) cannot compute ``pre`` on ``device``; None: it can.
    ``kernel=False``: the caller does not run the Triton backend."""
    from vit_fast.base.interpret import interpreter_enabled
    from vit_fast.kernels.preprocess_weights import SUPPORT

    if not kernel:
        return "the torch backend runs no Triton kernel"
    if pre.channels != 3:
        return f"the kernel takes 3 channels, this model {pre.channels} (a grayscale model's input is tiny)"
    if pre.interpolation not in SUPPORT:
        return f"the kernel has no {pre.interpolation} interpolation"
    if not pre.antialias:
        return "the kernel always antialiases; this preprocessing does not"
    if pre.output_hw is None:
        return "no centre crop or fixed size: each image keeps its own shape, so they cannot share one batch"
    if torch.device(device).type != "cuda" and not interpreter_enabled():
        return f"the kernel runs on CUDA (or in Triton's interpreter, TRITON_INTERPRET=1), not on {device}"
    return None


def preprocess_batch(
    pre: Preprocessing,
    images: list[torch.Tensor],
    *,
    device: torch.device | str = "cpu",
    out_dtype: torch.dtype = torch.float32,
    kernel: bool = True,
    pool: Any = None,
) -> tuple[torch.Tensor | list[torch.Tensor], str]:
    """Decoded uint8 ``[C, H, W]`` images (as :meth:`ImageTransform.pixels` gives them) to the model's input and
    what ran: one fused-kernel launch (``[B, C, h, w]`` on ``device``) where :func:`fused_unsupported` allows,
    else :func:`apply` per image (``pool.map`` where given) with the reason. Rules: docs/usage.md."""
    reason = fused_unsupported(pre, device, kernel)
    if reason is not None:
        per_image = (pool.map if pool is not None else map)(lambda x: apply(pre, x), images)
        return list(per_image), f"{EAGER}: {reason}"
    from vit_fast.kernels.preprocess import preprocess

    hwc = [x.permute(1, 2, 0).to(device) for x in images]
    out = preprocess(
        hwc,
        resize=[pre.resize_hw(int(x.shape[0]), int(x.shape[1])) for x in hwc],
        crop=pre.output_hw,
        interpolation=pre.interpolation,
        mean=pre.mean,
        std=pre.std,
        out_dtype=out_dtype,
        crop_rounding=pre.crop_rounding,
        uint8_passes=pre.uint8_passes,
    )
    return out, FUSED


class ImageTransform:
    """The callable :func:`image_transform` returns: an image (path, PIL image, uint8 HWC array / tensor) to float32
    ``[C, H, W]``; ``preprocessing`` holds its parameters and ``source`` says where they were read."""

    def __init__(self, preprocessing: Preprocessing, source: str, defaulted: tuple[str, ...] = ()) -> None:
        self.preprocessing, self.source, self.defaulted = preprocessing, source, defaulted

    def as_dict(self) -> dict[str, Any]:
        """Its parameters and source as JSON-ready values (``vit-fast predict --json`` rows)."""
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.preprocessing).items()}
        return {"source": self.source, **fields, "defaulted": list(self.defaulted)}

    def pixels(self, image: Any) -> torch.Tensor:
        """``image`` decoded and converted to the model's channels: uint8 ``[C, H, W]``."""
        import numpy as np

        pil = load_image(image, "L" if self.preprocessing.channels == 1 else "RGB")
        array = np.asarray(pil, dtype=np.uint8)
        array = array[:, :, None] if array.ndim == 2 else array
        return torch.from_numpy(array.copy()).permute(2, 0, 1)

    def __call__(self, image: Any) -> torch.Tensor:
        return apply(self.preprocessing, self.pixels(image))

    def __repr__(self) -> str:
        return f"ImageTransform({self.preprocessing}, source={self.source!r})"


def from_data_config(cfg: dict[str, Any]) -> Preprocessing:
    """timm's eval transform for a data config or ``pretrained_cfg`` (``input_size``, ``interpolation``,
    ``crop_pct``, ``crop_mode``, ``mean``, ``std``; timm's defaults for those missing): the shorter side to
    size / crop_pct, then a centre crop (crop_mode ``squash``: both sides, then the crop)."""
    channels, height, width = tuple(cfg.get("input_size") or (3, 224, 224))
    crop_pct = cfg.get("crop_pct") or DEFAULT_CROP_PCT
    mode = cfg.get("crop_mode") or "center"
    mean = tuple(float(m) for m in (cfg.get("mean") or IMAGENET_MEAN))
    std = tuple(float(s) for s in (cfg.get("std") or IMAGENET_STD))
    mean, std = (mean * channels if len(mean) == 1 else mean), (std * channels if len(std) == 1 else std)
    scale = (math.floor(height / crop_pct), math.floor(width / crop_pct))
    if mode == "squash":
        size: int | tuple[int, int] = scale
    elif mode == "center" and scale[0] == scale[1]:
        size = scale[0]
    else:  # timm's ResizeKeepRatio and CenterCropOrPad: none of the supported models uses them
        raise ValueError(f"timm crop_mode {mode!r} with input size {height}x{width} is not supported: center or squash")
    interpolation = cfg.get("interpolation") or DEFAULT_INTERPOLATION
    return Preprocessing(size, (height, width), interpolation, mean, std, channels=channels)


def from_image_processor(processor: Any) -> Preprocessing:
    """A transformers image processor's settings (the object, its ``to_dict()`` or ``preprocessor_config.json``
    read): resize (``height``/``width`` or ``shortest_edge``) with its resample filter, centre crop, rescale,
    normalize, in that order, as ViTImageProcessor, SiglipImageProcessor and BitImageProcessor (DINOv2) do."""
    data = processor if isinstance(processor, dict) else processor.to_dict()
    kind = data.get("image_processor_type", "image processor")
    resample = data.get("resample", 2)
    if resample not in PIL_RESAMPLE:
        raise ValueError(f"{kind}: resample {resample} is not supported: 2 (bilinear) or 3 (bicubic)")
    size_field = data.get("size") or {}
    if not data.get("do_resize", True):
        raise ValueError(f"{kind}: do_resize false is not supported (images of any size would reach the model)")
    if isinstance(size_field, int):
        size_field = {"shortest_edge": size_field}
    if "height" in size_field and "width" in size_field:
        size: int | tuple[int, int] = (int(size_field["height"]), int(size_field["width"]))
    elif "shortest_edge" in size_field and "longest_edge" not in size_field:
        size = int(size_field["shortest_edge"])
    else:
        raise ValueError(f"{kind}: size {size_field} is not supported: height and width, or shortest_edge")
    crop = None
    if data.get("do_center_crop"):
        crop_field = data.get("crop_size") or {}
        crop_field = {"height": crop_field, "width": crop_field} if isinstance(crop_field, int) else crop_field
        crop = (int(crop_field["height"]), int(crop_field["width"]))
    # (x * factor - m) / s == (x / 255 - m / (255 factor)) / (s / (255 factor))
    unit = 255.0 * float(data.get("rescale_factor", 1 / 255)) if data.get("do_rescale", True) else 255.0
    mean = data.get("image_mean") if data.get("do_normalize", True) else (0.0, 0.0, 0.0)
    std = data.get("image_std") if data.get("do_normalize", True) else (1.0, 1.0, 1.0)
    mean = tuple(float(m) / unit for m in (mean if isinstance(mean, (list, tuple)) else [mean] * 3))
    std = tuple(float(s) / unit for s in (std if isinstance(std, (list, tuple)) else [std] * 3))
    return Preprocessing(size, crop, PIL_RESAMPLE[resample], mean, std, crop_rounding="floor")


def find_processor(source: str | os.PathLike) -> dict[str, Any] | None:
    """A ``preprocessor_config.json`` (the file, or a save_pretrained folder holding it; ``hf:ORG/NAME`` from the
    local Hugging Face cache), or None where there is none."""
    text = os.fspath(source)
    if text.startswith("hf:"):
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        found = try_to_load_from_cache(text[3:], "preprocessor_config.json")
        path = Path(found) if isinstance(found, str) else None
    else:
        path = Path(text) / "preprocessor_config.json" if Path(text).is_dir() else Path(text)
    if path is None or not path.is_file():
        return None
    data = read_json(path, "image processor config")
    if not isinstance(data, dict):
        raise ValueError(f"image processor config {str(path)!r} holds a {type(data).__name__}, not an object")
    return data


def _is_default_model(model: Any) -> bool:
    from vit_fast.assets import WEIGHTS_FILE

    source = getattr(model, "weights_source", None) or {}
    if source.get("file") != WEIGHTS_FILE.name:
        return False
    from vit_fast.interop.checkpoints import file_sha256

    return source.get("sha256") == file_sha256(WEIGHTS_FILE)


def default_model_preprocessing() -> Preprocessing:
    """The embedded digits model's preprocessing from its record (``digits_vit.json``): grayscale, bilinear to its
    input size (no antialias: training upsampled 8x8 digits), mean and std as recorded. Ink is light on dark."""
    from vit_fast.assets import default_model_info

    info = default_model_info()
    pre, side = info["preprocessing"], int(info["config"]["img_size"])
    return Preprocessing((side, side), None, "bilinear", (pre["mean"],), (pre["std"],), antialias=False, channels=1)


def image_transform(model: Any, processor: Any = None, overrides: dict[str, Any] | None = None) -> ImageTransform:
    """``model``'s evaluation preprocessing as a callable. ``processor``: a transformers image processor, its
    settings, a ``preprocessor_config.json`` or its folder (``hf:ORG/NAME``: the local cache); else a transformers
    model's ``image_processor``, the embedded default model's record, timm's ``pretrained_cfg`` (its defaults for
    what it lacks, with a :class:`PreprocessingDefaultsWarning`). ``overrides``: :data:`OVERRIDES`, set over it."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if unknown := sorted(set(overrides) - set(OVERRIDES)):
        raise ValueError(f"unknown preprocessing override(s) {unknown}: choose from {', '.join(OVERRIDES)}")
    attached = processor if processor is not None else getattr(model, "image_processor", None)
    if attached is not None:
        data = find_processor(attached) if isinstance(attached, (str, os.PathLike)) else attached
        if data is None:
            raise ValueError(f"no preprocessor_config.json found at {os.fspath(attached)!r}")
        data = data if isinstance(data, dict) else data.to_dict()
        found = ImageTransform(from_image_processor(data), data.get("image_processor_type", "image processor"))
        return _overridden(found, overrides)
    if _is_default_model(model):
        return _overridden(ImageTransform(default_model_preprocessing(), "vit-fast digits_vit.json"), overrides)
    cfg = getattr(model, "pretrained_cfg", None)
    if not (isinstance(cfg, dict) and cfg.get("input_size")):
        raise ValueError(
            f"{type(model).__name__} carries no preprocessing (no pretrained_cfg, no image processor): pass "
            "processor=... (a transformers image processor or its preprocessor_config.json)"
        )
    data = {**cfg, **overrides}
    if "input_size" in overrides:
        data["input_size"] = (cfg["input_size"][0], *overrides["input_size"])
    defaulted = tuple(f for f in DATA_FIELDS if not data.get(f))
    if defaulted:
        warnings.warn(defaults_text(defaulted), PreprocessingDefaultsWarning, stacklevel=2)
    source = "timm pretrained_cfg" + (" (flags over it)" if overrides else "")
    return ImageTransform(from_data_config(data), source, defaulted)


def defaults_text(defaulted: tuple[str, ...]) -> str:
    """What :class:`PreprocessingDefaultsWarning` says: the fields timm's defaults filled, and how to set them."""
    values = {"interpolation": DEFAULT_INTERPOLATION, "crop_pct": DEFAULT_CROP_PCT}
    values.update(mean=f"{IMAGENET_MEAN} (ImageNet's)", std=f"{IMAGENET_STD} (ImageNet's)")
    said = "; ".join(f"{f} {values[f]}" for f in defaulted)
    return (
        f"the model carries no preprocessing of its own, so timm's defaults are used: {said}. If it was trained "
        "otherwise, set them (vit-fast predict: --mean, --std, --interpolation, --crop-pct; image_transform: "
        "overrides=...) or give a transformers preprocessor_config.json (--processor)"
    )


def _overridden(found: ImageTransform, overrides: dict[str, Any]) -> ImageTransform:
    """``found`` (a processor's or the embedded model's) with ``mean`` / ``std`` / ``interpolation`` set over it;
    ``crop_pct`` and ``input_size`` are timm's data config, which it is not read from."""
    if not overrides:
        return found
    if timm_only := sorted(set(overrides) & {"crop_pct", "input_size"}):
        raise ValueError(
            f"{' and '.join(timm_only)} set timm's data config, but this model's preprocessing is read from "
            f"{found.source}: change it there (a preprocessor_config.json: --processor)"
        )
    pre, fields = found.preprocessing, dict(overrides)
    for name in ("mean", "std"):
        if name in fields and len(fields[name]) == 1:
            fields[name] = tuple(fields[name]) * pre.channels
        elif name in fields:
            fields[name] = tuple(fields[name])
    return ImageTransform(replace(pre, **fields), f"{found.source} (flags over it)")


def model_labels(model: Any, source: str | os.PathLike | None = None) -> list[str] | None:
    """The class names a model carries: transformers' ``id2label`` (the model's config, or ``source``'s config.json
    for a save_pretrained folder), timm's ``label_names`` in its pretrained_cfg, the digits for the embedded default
    model; None when it carries none."""
    id2label = getattr(getattr(model, "config", None), "id2label", None)
    if not id2label and source is not None and (Path(source) / "config.json").is_file():
        data = read_json(Path(source) / "config.json", "Hugging Face config")
        id2label = data.get("id2label") if isinstance(data, dict) else None
    if id2label:
        return [str(id2label.get(i, id2label.get(str(i), i))) for i in range(len(id2label))]
    cfg = getattr(model, "pretrained_cfg", None)
    names = cfg.get("label_names") if isinstance(cfg, dict) else None
    if names:
        return [str(n) for n in names]
    if _is_default_model(model):
        return [str(d) for d in range(10)]
    return None
