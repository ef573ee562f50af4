"""Image files in: :func:`load_image` decodes one (PNG, JPEG, WebP, BMP; EXIF orientation applied; grayscale, RGBA
and palette images converted as timm and transformers convert them), :class:`GpuJpegs` decodes JPEGs on the GPU with
nvJPEG where it can, and :func:`image_files` lists the images a command line names. Pillow is the ``images`` extra.
Details: docs/usage.md, "Images in: image_transform"; the GPU decode: docs/deploy.md, "Decoding on the GPU: nvJPEG"."""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from vit_fast.backend.env import install_hint
from vit_fast.base.versions import parse_version

#: the suffixes a folder's images are found by (a file named on the command line is decoded whatever its name)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
#: decoded images larger than this many pixels are refused (Pillow's own bomb guard warns at 89 M, errors at 179 M)
MAX_PIXELS = 64 * 1024 * 1024
#: the first bytes of every JPEG file (the SOI marker and the next marker's 0xFF)
JPEG_SIGNATURE = b"\xff\xd8\xff"
#: JPEG modes whose nvJPEG RGB output is what Pillow's ``convert("RGB")`` gives (CMYK and YCCK files stay on Pillow)
GPU_JPEG_MODES = ("RGB", "L")
#: the first torchvision whose ``decode_jpeg`` takes a list and decodes it as one batch on CUDA
MIN_TORCHVISION = (0, 19)
#: the EXIF tag Pillow's ``ImageOps.exif_transpose`` reads
EXIF_ORIENTATION = 0x0112
#: what decodes JPEGs where :func:`gpu_jpeg_decoder` chose the GPU
NVJPEG = "nvJPEG (torchvision.io.decode_jpeg)"


def pil_image_module() -> Any:
    """``PIL.Image``, or an ImportError that names the extra to install."""
    try:
        from PIL import Image, ImageOps  # noqa: F401 (ImageOps: checked here, used by load_image)
    except ImportError as err:
        raise ImportError(f"reading image files needs Pillow: {install_hint('images')}") from err
    return Image


def load_image(source: Any, mode: str = "RGB") -> Any:
    """A PIL image in ``mode`` ("RGB" or "L") from a path, encoded bytes, a PIL image or a uint8 HWC / HW array or
    tensor. A file is decoded whole here (a broken one raises ValueError naming it and why), its EXIF orientation
    applied; other modes convert with PIL's ``convert`` (RGBA drops alpha, as timm's and transformers' loaders do)."""
    Image = pil_image_module()
    from PIL import ImageOps

    if isinstance(source, Image.Image):
        image = source
    elif isinstance(source, (str, os.PathLike, bytes)):
        image = _decode(source, Image)
        image = ImageOps.exif_transpose(image)
    else:
        image = Image.fromarray(_uint8_array(source))
    if image.mode != mode:
        if image.mode == "P" and "transparency" in image.info:  # PIL's own advice: through RGBA, then drop alpha
            image = image.convert("RGBA")
        image = image.convert(mode)
    return image


def _decode(source: str | os.PathLike | bytes, Image: Any) -> Any:
    import io
    import warnings

    from PIL import UnidentifiedImageError

    name = "image bytes" if isinstance(source, bytes) else repr(os.fspath(source))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
            if image.width * image.height > MAX_PIXELS:
                raise ValueError(f"{image.width}x{image.height} pixels, over the {MAX_PIXELS:,} vit-fast decodes")
            image.load()  # decode now: a truncated file fails here, not in the middle of a transform
    except UnidentifiedImageError:
        raise ValueError(f"{name} is not an image Pillow can read (PNG, JPEG, WebP, BMP ...)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
        if isinstance(err, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise ValueError(f"{name} cannot be read: {err.strerror or err}") from None
        raise ValueError(f"{name} cannot be decoded: {' '.join(str(err).split()) or type(err).__name__}") from None
    return image


def _uint8_array(source: Any) -> Any:
    import numpy as np

    array = source.detach().cpu().numpy() if hasattr(source, "detach") else np.asarray(source)
    if array.dtype != np.uint8:
        raise TypeError(f"an image array must be uint8 pixels (HxWxC or HxW), got dtype {array.dtype}")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
        raise ValueError(f"an image array must be HxW, HxWx1, HxWx3 or HxWx4 uint8 pixels, got shape {array.shape}")
    return array


def gpu_jpeg_decoder(device: torch.device | str, channels: int = 3) -> tuple[Callable[[list], Any] | None, str]:
    """The one choice of the JPEG decoder for a model on ``device`` making ``channels``-channel inputs: torchvision's
    ``decode_jpeg`` (nvJPEG; a list of 1-D uint8 CPU tensors in, RGB ``[3, H, W]`` uint8 on ``device`` out) where the
    model runs on CUDA with 3 channels and torchvision >= 0.19 imports; else None and why Pillow decodes."""
    if torch.device(device).type != "cuda":
        return None, f"Pillow: the model runs on {torch.device(device).type}, not CUDA"
    if channels != 3:
        return None, f"Pillow: a {channels}-channel model's grayscale is Pillow's conversion, not nvJPEG's luma"
    try:
        import torchvision
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as err:  # not installed, or a build for another torch (its RuntimeError)
        said = (str(err).strip().splitlines() or [""])[0]
        return None, f"Pillow: torchvision cannot be imported ({type(err).__name__}: {said})"
    version = parse_version(getattr(torchvision, "__version__", None)) or (0,)
    if version < MIN_TORCHVISION or "standin" in str(torchvision.__version__):
        return None, f"Pillow: torchvision {torchvision.__version__} has no batched GPU decode_jpeg (0.19 or newer)"
    cuda = torch.device(device)

    def decode(tensors: list) -> Any:
        return decode_jpeg(tensors, mode=ImageReadMode.RGB, device=cuda)

    return decode, NVJPEG


class JpegHeader(NamedTuple):
    """What a JPEG's header says: its size before the EXIF ``orientation`` (1-8) is applied."""

    height: int
    width: int
    orientation: int


def gpu_jpeg_header(data: bytes) -> JpegHeader | None:
    """``data``'s header where nvJPEG may decode it to the pixels Pillow gives (a JPEG in :data:`GPU_JPEG_MODES`
    within :data:`MAX_PIXELS`); None: Pillow decodes it (another format, CMYK, unreadable: Pillow names why)."""
    if not data.startswith(JPEG_SIGNATURE):
        return None
    Image = pil_image_module()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as probe:  # the header only
                if probe.format != "JPEG" or probe.mode not in GPU_JPEG_MODES:
                    return None
                if probe.width * probe.height > MAX_PIXELS:
                    return None
                orientation = probe.getexif().get(EXIF_ORIENTATION, 1)
                return JpegHeader(probe.height, probe.width, orientation if orientation in range(1, 9) else 1)
    except Exception:  # noqa: BLE001 (Pillow's own decode names what is wrong)
        return None


def exif_orient(pixels: torch.Tensor, orientation: int) -> torch.Tensor:
    """``pixels`` ``[C, H, W]`` turned as Pillow's ``ImageOps.exif_transpose`` turns an image of that EXIF
    ``orientation`` (nvJPEG applies none)."""
    h, w = -2, -1
    turns = {
        2: lambda x: x.flip(w),
        3: lambda x: x.flip(h, w),
        4: lambda x: x.flip(h),
        5: lambda x: x.transpose(h, w),
        6: lambda x: torch.rot90(x, -1, (h, w)),
        7: lambda x: x.transpose(h, w).flip(h, w),
        8: lambda x: torch.rot90(x, 1, (h, w)),
    }
    turn = turns.get(orientation)
    return pixels if turn is None else turn(pixels).contiguous()


class PendingJpeg(NamedTuple):
    """A JPEG left encoded for the GPU: its bytes, :func:`gpu_jpeg_header`'s reading of them, and the file they were
    read from (None: bytes received), which Pillow is given instead so that its reason names the file."""

    data: bytes
    header: JpegHeader
    source: str | os.PathLike | None = None


class GpuJpegs:
    """JPEGs decoded on the GPU in batches with ``decode`` (:func:`gpu_jpeg_decoder`'s): :meth:`decode_all` gives each
    uint8 ``[3, H, W]`` on the GPU, EXIF orientation applied, or None where nvJPEG refused it (the caller then asks
    Pillow, whose pixels or reason decide). Rules: docs/deploy.md, "Decoding on the GPU: nvJPEG"."""

    def __init__(self, decode: Callable[[list], Any]) -> None:
        self.decode = decode

    def decode_all(self, blobs: Sequence[bytes], headers: Sequence[JpegHeader]) -> list[torch.Tensor | None]:
        """``blobs`` (with their :func:`gpu_jpeg_header`) in one batch; decode_jpeg returns nothing when one image of
        a batch fails, so a batch that raises is decoded again one image at a time to find which."""
        if not blobs:
            return []
        tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        try:
            batch = list(self.decode(tensors))
        except Exception:  # noqa: BLE001 (nvJPEG's errors are RuntimeErrors naming no image: find it)
            batch = None
        if batch is None or len(batch) != len(tensors):
            return [self._one(t, header) for t, header in zip(tensors, headers, strict=True)]
        return [_checked(x, header) for x, header in zip(batch, headers, strict=True)]

    def complete(self, items: Sequence[Any], pil: Callable[[bytes], Any]) -> list[Any]:
        """``items`` with every :class:`PendingJpeg` replaced by its pixels from one :meth:`decode_all`, or by
        ``pil(its source or bytes)`` where nvJPEG refused it; the other items as they are."""
        at = [i for i, x in enumerate(items) if isinstance(x, PendingJpeg)]
        decoded = self.decode_all([items[i].data for i in at], [items[i].header for i in at])
        out = list(items)
        for i, pixels in zip(at, decoded, strict=True):
            item = items[i]
            out[i] = pil(item.data if item.source is None else item.source) if pixels is None else pixels
        return out

    def _one(self, tensor: torch.Tensor, header: JpegHeader) -> torch.Tensor | None:
        try:
            return _checked(self.decode([tensor])[0], header)
        except Exception:  # noqa: BLE001 (Pillow decides: its pixels, or its reason)
            return None


def _checked(pixels: Any, header: JpegHeader) -> torch.Tensor | None:
    """nvJPEG's ``pixels`` turned by the EXIF orientation, or None unless they are uint8 ``[3, H, W]`` of the header's
    size (anything else: Pillow decodes that file)."""
    if not isinstance(pixels, torch.Tensor) or pixels.dtype != torch.uint8:
        return None
    if tuple(pixels.shape) != (3, header.height, header.width):
        return None
    return exif_orient(pixels, header.orientation)


def image_files(paths: Sequence[str | os.PathLike], recursive: bool = True) -> list[Path]:
    """The images ``paths`` name, in order: a file as it is; a folder's files with an :data:`IMAGE_SUFFIXES` suffix
    (any case), sorted by their path inside it, through subfolders with ``recursive``, hidden names (``.x``) left
    out. A path that does not exist, or a folder without an image, is a ValueError naming it."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            pattern = path.rglob("*") if recursive else path.glob("*")
            inside = sorted(
                p
                for p in pattern
                if p.suffix.lower() in IMAGE_SUFFIXES
                and p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not inside:
                where = "in it or its subfolders" if recursive else "in it"
                raise ValueError(f"folder {str(path)!r} holds no image ({', '.join(IMAGE_SUFFIXES)}) {where}")
            found.extend(inside)
        elif path.exists():
            found.append(path)
        else:
            raise ValueError(f"image path {str(path)!r} does not exist: give image files or folders of them")
    return found
