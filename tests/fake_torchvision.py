"""A stand-in for torchvision's ``decode_jpeg`` as its documentation and source (0.19 to 0.26) describe it, for tests of
the GPU JPEG path on a machine without a GPU: a (list of) 1-D uint8 CPU tensor(s) in, ``[C, H, W]`` uint8 out; a list
decoded on CUDA as one batch that raises when any image fails (no partial results); EXIF orientation applied only on
the CPU and only when asked. Pillow decodes here, and "CUDA" results stay on the host."""

from __future__ import annotations

import enum
import io
import sys
import types

import numpy as np
import torch


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


class FakeDecoder:
    """``decode_jpeg`` with a record of its calls: ``calls`` holds (images in the call, device) per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, torch.device]] = []

    def __call__(self, input, mode=ImageReadMode.UNCHANGED, device="cpu", apply_exif_orientation=False):
        device = torch.device(device)
        mode = ImageReadMode[mode.upper()] if isinstance(mode, str) else mode
        if isinstance(input, list):
            if not input:
                raise ValueError("Input list must contain at least one element")
            if not all(isinstance(t, torch.Tensor) for t in input):
                raise ValueError("All elements of the input list must be tensors.")
            if not all(t.device.type == "cpu" for t in input):
                raise ValueError("Input list must contain tensors on CPU.")
            self.calls.append((len(input), device))
            exif = apply_exif_orientation and device.type == "cpu"
            return [_decode(t, mode, exif) for t in input]
        if input.device.type != "cpu":
            raise ValueError("Input tensor must be a CPU tensor")
        self.calls.append((1, device))
        return _decode(input, mode, apply_exif_orientation and device.type == "cpu")


def _decode(data: torch.Tensor, mode: ImageReadMode, exif: bool) -> torch.Tensor:
    from PIL import Image, ImageOps

    if data.dtype != torch.uint8 or data.ndim != 1:
        raise RuntimeError("Expected a 1 dimensional uint8 tensor")
    try:
        image = Image.open(io.BytesIO(data.numpy().tobytes()))
        if image.format != "JPEG":
            raise RuntimeError("Not a JPEG file")
        image.load()
    except RuntimeError:
        raise
    except Exception as err:
        raise RuntimeError(f"Error while decoding JPEG images: {err}") from None
    if exif:
        image = ImageOps.exif_transpose(image)
    if mode == ImageReadMode.RGB:
        image = image.convert("RGB")
    elif mode == ImageReadMode.GRAY:
        image = image.convert("L")
    array = np.asarray(image, dtype=np.uint8)
    array = array[:, :, None] if array.ndim == 2 else array
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def install(monkeypatch, version: str = "0.26.0") -> FakeDecoder:
    """``torchvision`` and ``torchvision.io`` in ``sys.modules`` for the test, its ``decode_jpeg`` the returned fake."""
    decoder = FakeDecoder()
    package = types.ModuleType("torchvision")
    package.__version__ = version
    package.__path__ = []
    io_module = types.ModuleType("torchvision.io")
    io_module.decode_jpeg = decoder
    io_module.ImageReadMode = ImageReadMode
    package.io = io_module
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.io", io_module)
    return decoder
