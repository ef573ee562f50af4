"""JPEGs decoded on the GPU with nvJPEG (vit_fast.interop.images): the choice of decoder, EXIF orientation and mode
conversion giving Pillow's pixels, per-image isolation when a batched decode raises, and ``predict_files`` through it,
all on the CPU with a stand-in for torchvision's ``decode_jpeg`` (tests/fake_torchvision.py). The real nvJPEG against
Pillow: benchmarks/gpu_evidence.py."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("PIL", reason="Pillow (the images extra) decodes what nvJPEG does not")
from PIL import Image, ImageOps  # noqa: E402

from vit_fast.interop import images, predicting  # noqa: E402
from vit_fast.interop.image_transform import ImageTransform, from_data_config  # noqa: E402
from vit_fast.interop.images import (  # noqa: E402
    NVJPEG,
    GpuJpegs,
    PendingJpeg,
    exif_orient,
    gpu_jpeg_decoder,
    gpu_jpeg_header,
    load_image,
)

from .. import fake_torchvision  # noqa: E402
from ..fakes import tiny_model  # noqa: E402

CFG = {"input_size": (3, 32, 32), "interpolation": "bicubic", "crop_pct": 0.9, "mean": (0.5,) * 3, "std": (0.5,) * 3}


def _jpeg(h: int, w: int, seed: int, mode: str = "RGB", orientation: int | None = None) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(h, w, 3) if mode != "L" else (h, w), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    buffer = io.BytesIO()
    extra = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[images.EXIF_ORIENTATION] = orientation
        extra["exif"] = exif.tobytes()
    image.save(buffer, "JPEG", quality=90, **extra)
    return buffer.getvalue()


def _png(h: int, w: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _pil_pixels(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.asarray(load_image(data, "RGB")).copy()).permute(2, 0, 1)


def test_the_choice_is_nvjpeg_only_on_cuda_with_a_batched_torchvision(monkeypatch):
    fake = fake_torchvision.install(monkeypatch)
    decode, how = gpu_jpeg_decoder("cuda:0")
    assert decode is not None and how == NVJPEG
    out = decode([torch.frombuffer(bytearray(_jpeg(9, 13, 0)), dtype=torch.uint8)] * 2)
    assert [tuple(x.shape) for x in out] == [(3, 9, 13)] * 2 and fake.calls == [(2, torch.device("cuda:0"))]

    assert gpu_jpeg_decoder("cpu") == (None, "Pillow: the model runs on cpu, not CUDA")
    decode, how = gpu_jpeg_decoder("cuda", channels=1)
    assert decode is None and "1-channel" in how
    fake_torchvision.install(monkeypatch, version="0.18.1")
    decode, how = gpu_jpeg_decoder("cuda")
    assert decode is None and "0.18.1 has no batched GPU decode_jpeg (0.19 or newer)" in how
    fake_torchvision.install(monkeypatch, version="0.0.0+standin")  # vit-fast's own stand-in for timm
    assert gpu_jpeg_decoder("cuda")[0] is None
    monkeypatch.setitem(sys.modules, "torchvision", None)  # not installed
    decode, how = gpu_jpeg_decoder("cuda")
    assert decode is None and how.startswith("Pillow: torchvision cannot be imported (ModuleNotFoundError")


def test_headers_send_only_rgb_and_gray_jpegs_to_the_gpu():
    assert gpu_jpeg_header(_jpeg(7, 11, 1)) == images.JpegHeader(7, 11, 1)
    assert gpu_jpeg_header(_jpeg(7, 11, 1, mode="L", orientation=6)) == images.JpegHeader(7, 11, 6)
    assert gpu_jpeg_header(_jpeg(7, 11, 1, mode="CMYK")) is None  # Pillow's CMYK conversion is its own
    assert gpu_jpeg_header(_png(7, 11, 1)) is None
    assert gpu_jpeg_header(b"\xff\xd8\xff but no JPEG") is None


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_turns_pixels_as_pillow_does(orientation):
    pixels = torch.from_numpy(np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8))
    image = Image.fromarray(pixels.numpy())
    image.getexif()[images.EXIF_ORIENTATION] = orientation
    expected = np.asarray(ImageOps.exif_transpose(image))
    got = exif_orient(pixels.permute(2, 0, 1), orientation).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(got, expected)


def test_gpu_pixels_equal_pillows_for_every_orientation_and_gray(monkeypatch):
    """nvJPEG applies no EXIF orientation and gives gray files as RGB: what reaches the model is Pillow's image."""
    fake_torchvision.install(monkeypatch)
    decode, _ = gpu_jpeg_decoder("cuda")
    blobs = [_jpeg(6, 9, o, orientation=o) for o in range(1, 9)] + [_jpeg(10, 4, 9, mode="L", orientation=8)]
    headers = [gpu_jpeg_header(b) for b in blobs]
    out = GpuJpegs(decode).decode_all(blobs, headers)
    for data, got in zip(blobs, out, strict=True):
        torch.testing.assert_close(got, _pil_pixels(data), rtol=0, atol=0)


def test_a_batch_that_raises_is_decoded_per_image_and_pillow_names_the_broken_one(monkeypatch):
    fake = fake_torchvision.install(monkeypatch)
    decode, _ = gpu_jpeg_decoder("cuda")
    good = [_jpeg(8, 8, 1), _jpeg(12, 5, 2)]
    truncated = _jpeg(30, 30, 3)[:-600]  # its header reads: only the decode fails
    items = [PendingJpeg(b, gpu_jpeg_header(b)) for b in (good[0], truncated, good[1])]
    assert all(item.header is not None for item in items)

    def pil(data: bytes):
        try:
            return _pil_pixels(data)
        except ValueError as err:
            return str(err)

    out = GpuJpegs(decode).complete([*items, "an earlier reason"], pil)
    assert [n for n, _ in fake.calls] == [3, 1, 1, 1]  # the batch raised: each image again, alone
    torch.testing.assert_close(out[0], _pil_pixels(good[0]), rtol=0, atol=0)
    torch.testing.assert_close(out[2], _pil_pixels(good[1]), rtol=0, atol=0)
    assert isinstance(out[1], str) and "cannot be decoded" in out[1]
    assert out[3] == "an earlier reason"


def test_pixels_of_another_shape_go_to_pillow():
    header = images.JpegHeader(4, 6, 1)
    jpeg = _jpeg(4, 6, 0)
    wrong = GpuJpegs(lambda ts: [torch.zeros(3, 6, 4, dtype=torch.uint8) for _ in ts])
    assert wrong.decode_all([jpeg], [header]) == [None]
    got = wrong.complete([PendingJpeg(jpeg, header)], _pil_pixels)
    torch.testing.assert_close(got[0], _pil_pixels(jpeg), rtol=0, atol=0)


def test_predict_files_decodes_jpegs_in_one_gpu_batch_with_the_pillow_path_answers(monkeypatch, tmp_path):
    model = tiny_model()
    transform = ImageTransform(from_data_config(CFG), "timm pretrained_cfg")
    files = []
    for i, (name, data) in enumerate(
        [("a.jpg", _jpeg(17, 40, 1)), ("b.png", _png(33, 21, 2)), ("c.jpg", _jpeg(25, 25, 3, orientation=6))]
        + [("d.jpg", _jpeg(40, 40, 4)[:-600]), ("e.jpeg", _jpeg(19, 23, 5, mode="L"))]
    ):
        files.append(tmp_path / f"{i}{name}")
        files[-1].write_bytes(data)
    pillow = [p for batch in predicting.predict_files(model, files, transform, batch=8, top_k=3) for p in batch]
    fake = fake_torchvision.install(monkeypatch)
    monkeypatch.setattr(predicting, "gpu_jpeg_decoder", lambda device, channels: gpu_jpeg_decoder("cuda", channels))
    gpu = [p for batch in predicting.predict_files(model, files, transform, batch=8, top_k=3) for p in batch]
    assert [n for n, _ in fake.calls] == [4, 1, 1, 1, 1]  # 4 JPEGs in one batch; it raised on d.jpg
    assert [p.file for p in gpu] == [str(f) for f in files]
    for ours, theirs in zip(gpu, pillow, strict=True):
        assert ours.error == theirs.error and ours.indices == theirs.indices
        np.testing.assert_allclose(ours.probabilities, theirs.probabilities, rtol=1e-6)
    assert gpu[3].error is not None and "cannot be decoded" in gpu[3].error
    assert gpu[0].preprocessing.endswith(f"; JPEGs decoded by {NVJPEG}")
