"""Image files in: :func:`load_image` decodes one (PNG, JPEG, WebP, BMP; EXIF orientation applied; grayscale, RGBA
and palette images converted as timm and transformers convert them) and :func:`image_files` lists the images a
command line names. Pillow is the ``images`` extra. Details: docs/usage.md, "Images in: image_transform"."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit_fast.backend.env import install_hint

#: the suffixes a folder's images are found by (a file named on the command line is decoded whatever its name)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
#: decoded images larger than this many pixels are refused (Pillow's own bomb guard warns at 89 M, errors at 179 M)
MAX_PIXELS = 64 * 1024 * 1024


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
