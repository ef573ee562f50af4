"""`vit-fast serve --encoded` without a server: the decode and preprocess step (vit_fast.serve.encoded) answers each
request of a batch on its own, bounds bytes and declared pixels before decoding, and the command line checks its
flags before any work. The same through a real Triton server: tests/serve/test_serve_encoded.py."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch

pytest.importorskip("PIL", reason="--encoded decodes with Pillow: pip install -e '.[images]'")
from PIL import Image  # noqa: E402

from vit_fast.cli import main  # noqa: E402
from vit_fast.interop import images  # noqa: E402
from vit_fast.serve import encoded  # noqa: E402
from vit_fast.serve.answers import RefusalLog  # noqa: E402
from vit_fast.serve.encoded import ENCODED_INPUT, LABELS_OUTPUT, PROBABILITIES_OUTPUT, EncodedImages  # noqa: E402
from vit_fast.serve.server import Server  # noqa: E402
from vit_fast.serve.settings import REFUSED_KEY  # noqa: E402

from .. import fake_torchvision  # noqa: E402
from ..fakes import tiny_model  # noqa: E402

#: timm's eval transform for a 32 px model: bicubic, crop_pct 0.9, mean/std 0.5 (odd source sizes are all resized)
CFG = {"input_size": (3, 32, 32), "interpolation": "bicubic", "crop_pct": 0.9, "mean": (0.5,) * 3, "std": (0.5,) * 3}


def _model(**overrides):
    model = tiny_model(**overrides)
    model.pretrained_cfg = dict(CFG)
    return model


def _png(h: int, w: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def _declaring(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header (IHDR, its CRC fixed) declares ``width`` x ``height`` pixels."""
    data = bytearray(_png(1, 1, 0))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _request(*blobs: bytes) -> dict:
    return {ENCODED_INPUT: np.array([[b] for b in blobs], dtype=np.object_)}


def _infer(model):
    def infer(x):
        with torch.inference_mode():
            return {"logits": model(torch.from_numpy(x)).numpy()}

    return infer


def test_a_broken_request_fails_alone_and_the_others_get_the_models_answer():
    """Three requests in one batch, the middle one with an image that does not decode: it gets its own message (which
    image, why; no traceback), the others the model's logits on its own transform's images, and top k that follow."""
    model = _model()
    served = EncodedImages(model, "logits", top_k=3)
    good = [_png(17, 45, 1), _png(40, 23, 2), _png(32, 32, 3)]
    requests = [_request(good[0], good[1]), _request(good[2], b"\x89PNG\r\n\x1a\n not a png"), _request(good[2])]
    log = RefusalLog(stream=io.StringIO())
    answers = served.answer(requests, _infer(model), log)
    assert len(answers) == 3 and log.total == 1
    message = answers[1][REFUSED_KEY].tobytes().decode()
    assert message.startswith("image 1 of the request: image bytes") and "Traceback" not in message
    with torch.inference_mode():
        expected = model(torch.stack([served.transform(b) for b in good]))
    torch.testing.assert_close(torch.from_numpy(answers[0]["logits"]), expected[:2], rtol=0, atol=0)
    torch.testing.assert_close(torch.from_numpy(answers[2]["logits"]), expected[2:], rtol=0, atol=0)
    probs = torch.softmax(expected.double(), dim=-1)
    for answer, rows in ((answers[0], probs[:2]), (answers[2], probs[2:])):
        values, indices = rows.topk(3, dim=-1)
        assert answer[LABELS_OUTPUT].tolist() == [[str(i).encode() for i in row] for row in indices.tolist()]
        np.testing.assert_allclose(answer[PROBABILITIES_OUTPUT], values.numpy(), rtol=1e-6)


def _jpeg(h: int, w: int, seed: int, mode: str = "RGB", orientation: int | None = None) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.fromarray(pixels).convert(mode).save(buffer, "JPEG", quality=90, exif=exif.tobytes())
    return buffer.getvalue()


def test_jpegs_decoded_on_the_gpu_answer_as_pillow_and_a_broken_one_fails_alone(monkeypatch):
    """With nvJPEG chosen (torchvision's decode_jpeg faked on the host), a batch's JPEGs go to it in one call, other
    formats to Pillow; a truncated JPEG makes that call raise, so each JPEG is decoded again alone and only its
    request is refused. Every answer equals the Pillow path's."""
    model = _model()
    pillow = EncodedImages(model, "logits", top_k=3)
    assert pillow.gpu is None and pillow.decoder == "Pillow: the model runs on cpu, not CUDA"
    fake = fake_torchvision.install(monkeypatch)
    seen: list = []

    def choose(device, channels):  # the model is on the CPU: the choice is asked as for CUDA
        seen.append((device, channels))
        return images.gpu_jpeg_decoder("cuda", channels)

    monkeypatch.setattr(encoded, "gpu_jpeg_decoder", choose)
    served = EncodedImages(model, "logits", top_k=3)
    assert seen == [(torch.device("cpu"), 3)] and served.gpu is not None and "nvJPEG" in served.describe()
    good = [_jpeg(17, 45, 1), _png(40, 23, 2), _jpeg(30, 26, 3, orientation=6), _jpeg(21, 21, 4, mode="L")]
    broken = _jpeg(40, 40, 5)[:-600]
    requests = [_request(good[0], good[1]), _request(good[2], broken), _request(good[3], good[2])]
    ours = served.answer(requests, _infer(model), RefusalLog(stream=io.StringIO()))
    assert [n for n, _ in fake.calls] == [5, 1, 1, 1, 1, 1]
    assert ours[1][REFUSED_KEY].tobytes().decode().startswith("image 1 of the request: image bytes cannot be decoded")
    theirs = pillow.answer([requests[0], requests[2]], _infer(model), RefusalLog())
    for got, want in zip([ours[0], ours[2]], theirs, strict=True):
        torch.testing.assert_close(torch.from_numpy(got["logits"]), torch.from_numpy(want["logits"]), rtol=0, atol=0)
        assert got[LABELS_OUTPUT].tolist() == want[LABELS_OUTPUT].tolist()


def test_every_request_refused_runs_no_forward():
    served = EncodedImages(_model(), "logits")
    answers = served.answer([_request(b""), _request(b"GIF89a")], lambda x: pytest.fail("no forward"), RefusalLog())
    assert [REFUSED_KEY in a for a in answers] == [True, True]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "an empty image"),
        (_declaring(5000, 5000), "5000x5000 pixels, over the 16,777,216"),  # under Pillow's own bound, over ours
        (_declaring(60000, 60000), "more pixels than Pillow decodes"),  # Pillow's bound, at its header
    ],
)
def test_bounds_are_checked_before_decoding(data, says, monkeypatch):
    """Empty bytes and a header that declares too many pixels (a decompression bomb) are refused from the header:
    the decoder never runs."""
    served = EncodedImages(_model(), "logits")
    monkeypatch.setattr(served, "transform", lambda _: pytest.fail("decoded a refused image"))
    assert says in served.decode(data)


def test_bytes_over_the_bound_are_refused_unread(monkeypatch):
    monkeypatch.setattr(encoded, "ENCODED_MAX_BYTES", 100)
    monkeypatch.setattr(encoded.EncodedImages, "transform", property(lambda _: pytest.fail("decoded")), raising=False)
    assert (
        encoded.encoded_problem(b"x" * 101, max_bytes=100)
        == "an encoded image of 101 bytes, over the 100 this server decodes"
    )


def test_grayscale_default_style_model_and_labels():
    """A one-channel model with labels (timm's label_names): images are converted to its channels, labels named."""
    model = _model(in_chans=1)
    model.pretrained_cfg.update(input_size=(1, 32, 32), mean=(0.3,), std=(0.3,), label_names=list("abcdefg"))
    served = EncodedImages(model, "logits", top_k=99)
    answer = served.answer([_request(_png(20, 30, 4))], _infer(model), RefusalLog())[0]
    assert served.top_k == 7 and sorted(answer[LABELS_OUTPUT][0].tolist()) == [c.encode() for c in "abcdefg"]


def test_server_refuses_what_encoded_cannot_serve():
    with pytest.raises(ValueError, match="leave out --variable-size"):
        Server(_model(dynamic_img_size=True), encoded=True, variable_size=True)
    model = _model()
    model.pretrained_cfg["input_size"] = (3, 24, 24)
    with pytest.raises(ValueError, match="not the 3x\\(32, 32\\) the model takes"):
        Server(model, encoded=True)
    with pytest.raises(ValueError, match="no classifier head"):
        Server(_model(num_classes=0), encoded=True)
    described = Server(_model(), encoded=True, top_k=2).description
    assert "served from encoded images (image_bytes [1], BYTES) decoded and preprocessed as timm pretrained_cfg" in (
        described
    ) and described.endswith("the top 2 labels and probabilities")


def test_load_test_images_from_files(tmp_path, monkeypatch):
    (tmp_path / "a.png").write_bytes(_png(9, 9, 5))
    (tmp_path / "b.jpg").write_bytes(b"y" * 50)
    assert encoded.encoded_files([tmp_path]) == [(tmp_path / "a.png").read_bytes(), b"y" * 50]
    monkeypatch.setattr(encoded, "ENCODED_MAX_BYTES", 60)
    with pytest.raises(ValueError, match="a.png' is over the 60 bytes"):
        encoded.encoded_files([tmp_path])
    pngs = encoded.random_pngs(0, count=3)
    assert len(pngs) == 3 and all(Image.open(io.BytesIO(b)).size[0] in range(17, 64) for b in pngs)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--top-k", "3"], "--top-k goes with --encoded"),
        (["--images", "x.png"], "--images goes with --encoded"),
        (["--encoded", "--broken", "2"], "--broken is for the load test"),
    ],
)
def test_cli_refuses_encoded_flags_out_of_place(flags, says, capsys):
    assert main(["serve", "default", *flags]) == 1
    assert says in capsys.readouterr().err


def test_a_load_test_passes_only_when_every_broken_request_was_refused_alone():
    from vit_fast.serve.loadtest import LoadTestReport

    def report(**counts):
        return LoadTestReport("m", 1, 4, [1], "fp32", **counts)

    assert report(requests=4, answered=3, within_rule=3, broken=1, refused=1).passed
    assert not report(requests=4, answered=3, within_rule=3, broken=1, refused=0).passed  # answered, or no reason
    assert not report(requests=4, answered=4, within_rule=4, broken=1, refused=1).passed  # counts that do not add up
    assert not report(requests=4, answered=3, within_rule=2, broken=1, refused=1).passed
