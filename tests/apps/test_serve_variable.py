"""`vit-fast serve --variable-size` without a server: which models are served at any size, the checks every request
passes before any work, and one packed forward per served batch whose rows are each image's own forward. Served
through a real Triton server: tests/serve/test_serve_variable.py."""

from __future__ import annotations

import copy
import io
import re

import numpy as np
import pytest
import torch

import vit_fast
from vit_fast.serve import server as srv
from vit_fast.serve.settings import VARIABLE_MAX_SIDE

from ..fakes import tiny_model
from ..numerics import assert_within_eager

# three sizes, one of them twice, one request carrying two images of one size: mixed in one served batch
SIZES = [(1, 32, 32), (1, 24, 40), (2, 16, 8), (1, 24, 40)]


def _server(**kwargs) -> srv.Server:
    return srv.Server(tiny_model(dynamic_img_size=True, reg_tokens=1), variable_size=True, threads=1, **kwargs)


def _requests(seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"images": rng.standard_normal((b, 3, h, w)).astype(np.float32)} for b, h, w in SIZES]


def _count_packed_forwards(monkeypatch, model) -> list[int]:
    calls: list[int] = []
    real = type(model).forward_packed

    def forward_packed(self, images, *args, **kwargs):
        calls.append(len(images))
        return real(self, images, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward_packed", forward_packed)
    return calls


def test_a_mixed_batch_is_one_packed_forward_and_each_request_gets_its_images_own_answer(monkeypatch) -> None:
    server = _server()
    calls = _count_packed_forwards(monkeypatch, server.model)
    requests = _requests()
    answers = server.infer_requests(requests)
    assert calls == [sum(b for b, _, _ in SIZES)]  # every image of the batch in one forward
    assert len(answers) == len(requests)
    model = server.model
    model64 = copy.deepcopy(model).double()
    for r, (request, answer) in enumerate(zip(requests, answers, strict=True)):
        x = torch.from_numpy(request["images"])
        assert answer["logits"].shape == (len(x), model.cfg.num_classes)
        for i in range(len(x)):  # each image alone, through the ordinary forward
            with torch.no_grad():
                eager, ref = model(x[i : i + 1]), model64(x[i : i + 1].double())
            ours = torch.from_numpy(np.array(answer["logits"][i : i + 1]))
            assert_within_eager(ours, eager, ref, f"request {r}, image {i} ({tuple(x.shape[2:])})")


def test_the_served_input_is_variable_in_height_and_width() -> None:
    server = _server(max_image_size=64)
    assert server.input.dims == (3, -1, -1) and server.image_dims == (3, 32, 32)
    assert server.max_image_size == 64 and "up to 64 px a side" in server.description
    assert _server().max_image_size == VARIABLE_MAX_SIDE
    fixed = srv.Server(tiny_model(dynamic_img_size=True))
    assert fixed.input.dims == (3, 32, 32) and fixed.max_image_size is None and "px a side" not in fixed.description


def test_a_model_without_a_resampled_position_embedding_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"takes 32x32 images only: serve it without --variable-size"):
        srv.Server(tiny_model(), variable_size=True)
    with pytest.raises(ValueError, match="takes 32x32 images only"):  # the embedded default model, too
        srv.Server(vit_fast.load_model("default", backend="torch"), variable_size=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(max_image_size=64), ValueError, "pass variable_size=True"),
        (dict(variable_size=True, max_image_size=4), ValueError, r"from the patch size \(8\)"),
        (dict(variable_size=True, max_image_size=10**6), ValueError, "to 65536 pixels"),
        (dict(variable_size="yes"), TypeError, "variable_size must be True or False"),
    ],
)
def test_server_checks_its_variable_size_arguments(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        srv.Server(tiny_model(dynamic_img_size=True), **kwargs)


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((1, 4, 32, 32), r"^images \[1, 4, 32, 32\]: the model takes 3 channels"),
        ((1, 3, 8, 4), r"^images \[1, 3, 8, 4\]: 8x4 is smaller than one 8x8 patch"),
        ((1, 3, 72, 32), r"^images .*: 72x32 is larger than this server's 64 px a side \(--max-image-size\)"),
        ((1, 3, 30, 32), r"^images .*: 30x32 is not a multiple of the 8-px patch; resize or crop it to 24x32"),
        ((0, 3, 32, 32), r"^images .*: no image"),
        ((3, 32, 32), r"^images \[3, 32, 32\]: images must be \[B, C, H, W\]"),
    ],
)
def test_a_request_the_model_cannot_take_fails_only_itself_before_any_work(monkeypatch, shape, match) -> None:
    """Issue 46, case 7: a refused request gets its own error response (its message, no traceback) and the others of
    its batch are answered, their images alone in the packed forward; the console gets one line for it."""
    from vit_fast.serve.answers import REFUSED_KEY

    server = _server(max_image_size=64)
    lines = io.StringIO()
    server.refusals.stream = lines
    calls = _count_packed_forwards(monkeypatch, server.model)
    good = np.random.default_rng(0).standard_normal((2, 3, 16, 24)).astype(np.float32)
    answers = server.infer_requests([{"images": good}, {"images": np.zeros(shape, dtype=np.float32)}, {"images": good}])
    assert calls == [4]  # the two good requests' images only
    assert list(answers[0]) == list(answers[2]) == ["logits"] and list(answers[1]) == [REFUSED_KEY]
    np.testing.assert_array_equal(answers[0]["logits"], answers[2]["logits"])
    message = answers[1][REFUSED_KEY].tobytes().decode()
    assert re.match(match, message) and "Traceback" not in message and "/" not in message.split(": ", 1)[0]
    assert lines.getvalue() == f"[vit-fast serve] refused a request: {message}\n"
    with pytest.raises(ValueError, match="empty batch"):
        server.infer_requests([])


def test_the_largest_image_must_fit_the_memory_here(monkeypatch) -> None:
    from vit_fast.serve import variable

    monkeypatch.setattr(variable, "check_batch_fits", _raise_fit)
    with pytest.raises(ValueError, match=r"up to 64 px a side.*smaller --max-image-size"):
        _server(max_image_size=64)


def _raise_fit(cfg, batch, height, width, element_size, what, fix, available=None) -> None:
    assert (batch, height, width, element_size) == (1, 64, 64, 4)
    raise ValueError(f"{what}: {fix}")


def test_the_input_is_declared_ragged_in_the_config_pytriton_wrote(tmp_path) -> None:
    """Triton batches requests of different shapes only for a ragged input; PyTriton 0.7 cannot say so, and the
    config it wrote to its model store is changed before Triton reads it (the rest of it kept)."""
    pytest.importorskip("tritonclient.grpc", reason="needs tritonclient (the serve extra): run `make test-serve`")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from vit_fast.serve.backend import allow_ragged_batch

    store = tmp_path / "store"
    (store / "m").mkdir(parents=True)
    written = (
        'name: "m"\nmax_batch_size: 64\ninput {\n  name: "images"\n  data_type: TYPE_FP32\n  dims: 3\n  dims: -1\n'
        '  dims: -1\n}\noutput {\n  name: "logits"\n  data_type: TYPE_FP32\n  dims: 7\n}\n'
        "dynamic_batching {\n}\n"
    )
    (store / "m" / "config.pbtxt").write_text(written)

    class Workspace:
        model_store_path = store

    class Triton:
        _workspace = Workspace()

    path = allow_ragged_batch(Triton(), "m", "images")
    parsed = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    expected = text_format.Parse(written, model_config_pb2.ModelConfig())
    expected.input[0].allow_ragged_batch = True
    assert parsed == expected
    with pytest.raises(RuntimeError, match="declares no input 'pixels'"):
        allow_ragged_batch(Triton(), "m", "pixels")
    with pytest.raises(RuntimeError, match="cannot declare 'images' ragged with this PyTriton"):
        allow_ragged_batch(object(), "m", "images")
