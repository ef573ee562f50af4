"""`vit-fast serve --encoded` through a real Triton server on loopback (one start): encoded images sent at once are
one execution in which a request whose bytes do not decode, and one whose header declares a decompression bomb, each
fail alone with their own message while the others get the model's answer on its own preprocessing; then the
built-in load test sends PNG files under load with one broken request in every three, each refused alone."""

from __future__ import annotations

import copy
import io
import struct
import zlib

import numpy as np
import pytest
import torch

from ._support import LOAD_TEST_REPORTS, NEEDS_SERVE, counts_after, free_ports, post_json

pytest.importorskip("pytriton", reason=NEEDS_SERVE)
http = pytest.importorskip("tritonclient.http", reason=NEEDS_SERVE)
from tritonclient.utils import InferenceServerException  # noqa: E402

from vit_fast.serve.encoded import ENCODED_INPUT, LABELS_OUTPUT, PROBABILITIES_OUTPUT, random_pngs  # noqa: E402
from vit_fast.serve.loadtest import load_test  # noqa: E402
from vit_fast.serve.server import Server  # noqa: E402
from vit_fast.util.numerics import assert_within_eager  # noqa: E402

from ..fakes import tiny_model  # noqa: E402

NAME = "encoded"
CFG = {"input_size": (3, 32, 32), "interpolation": "bicubic", "crop_pct": 0.9, "mean": (0.5,) * 3, "std": (0.5,) * 3}


def _bomb() -> bytes:
    """A 1x1 PNG whose header declares 50000 x 50000 pixels (its IHDR CRC fixed)."""
    buffer = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = struct.pack(">II", 50000, 50000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _bmp(h: int, w: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(3).integers(1, 256, size=(h, w, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "BMP")
    return buffer.getvalue()


def _counts(client) -> tuple[int, int]:
    stats = client.get_inference_statistics(NAME)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_encoded_images_batched_with_broken_ones_and_under_the_load_test(capfd) -> None:
    model = tiny_model()
    model.pretrained_cfg = dict(CFG)
    # a BMP 17 px wide ends in its last row's zero padding: the bytes must reach the decoder unstripped
    good = [*random_pngs(1, count=2), _bmp(13, 17)]
    assert good[2].endswith(b"\x00")
    # five images in four requests: the batcher sends them as one batch of five (its largest)
    sent = [[good[0], good[1]], [b"\x89PNG\r\n\x1a\n not a png"], [good[2]], [_bomb()]]
    http_port, grpc_port, metrics_port = free_ports(3)
    with Server(
        model,
        name=NAME,
        batch=[5],
        queue_delay_us=2_000_000,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        threads=1,
        encoded=True,
        top_k=3,
    ) as server:
        capfd.readouterr()
        client = http.InferenceServerClient(server.endpoints.http, concurrency=len(sent))
        try:
            before = _counts(client)
            pending = []
            for blobs in sent:
                request = http.InferInput(ENCODED_INPUT, [len(blobs), 1], "BYTES")
                request.set_data_from_numpy(np.array([[b] for b in blobs], dtype=np.object_))
                pending.append(client.async_infer(NAME, [request]))
            outcomes = []
            for p in pending:
                try:
                    result = p.get_result(timeout=120)
                    outcomes.append({k: result.as_numpy(k) for k in ("logits", LABELS_OUTPUT, PROBABILITIES_OUTPUT)})
                except InferenceServerException as err:
                    outcomes.append(err)
            inferences, executions = counts_after(client, NAME, before, 5)
            assert (inferences, executions) == (5, 1), "five images in four requests, one execution"
        finally:
            client.close()
        # the built-in load test on the same server: PNG files, a broken request in every three, each refused alone
        report = load_test(
            model,
            NAME,
            server.endpoints.http,
            server.endpoints.grpc,
            clients=5,
            requests=6,
            batch_sizes=[1],
            encoded=random_pngs(2, count=8),
            broken_every=3,
        )
        LOAD_TEST_REPORTS.append(report.format())
        # issue 46 case 3: the lie (and a batch over the largest) refused by the front, before Triton reads it
        for shape, says in (([1, 3, 60000, 60000], "has 4 dims"), ([60000, 1], "dim 0 is 60000")):
            lie = {"inputs": [{"name": ENCODED_INPUT, "shape": shape, "datatype": "BYTES", "data": ["x"] * 12}]}
            status, answer = post_json(f"http://{server.endpoints.http}/v2/models/{NAME}/infer", lie)
            assert status == 400 and says in answer and "image_bytes [B, 1] with B from 1 to 5" in answer, answer
        assert server.alive()
    assert report.passed and report.broken == report.refused == 10 and report.answered == 20, report.format()
    errors = [outcomes[1], outcomes[3]]
    assert all(isinstance(e, InferenceServerException) for e in errors), outcomes
    assert errors[0].message().startswith("image 0 of the request: image bytes"), errors[0].message()
    assert errors[1].message().startswith("image 0 of the request: an image whose header declares"), errors[1]
    for err in errors:
        assert "Traceback" not in err.message() and ".py" not in err.message(), err.message()
    transform = server.encoded.transform
    x = torch.stack([transform(b) for b in good])
    with torch.no_grad():
        eager, ref = model(x), copy.deepcopy(model).double()(x.double())
    got = torch.from_numpy(np.concatenate([np.array(outcomes[0]["logits"]), np.array(outcomes[2]["logits"])]))
    assert_within_eager(got, eager, ref, "served logits of encoded images")
    top = torch.softmax(ref, dim=-1).topk(3, dim=-1)
    labels = [row.tolist() for o in (outcomes[0], outcomes[2]) for row in o[LABELS_OUTPUT]]
    assert labels == [[str(i).encode() for i in row] for row in top.indices.tolist()]
    probabilities = np.concatenate([outcomes[0][PROBABILITIES_OUTPUT], outcomes[2][PROBABILITIES_OUTPUT]])
    np.testing.assert_allclose(probabilities, top.values.numpy(), atol=1e-5)
    text = "".join(capfd.readouterr())
    assert "Traceback" not in text, text[-3000:]
    assert "[vit-fast serve] 12 request(s) refused while serving" in text, text[-3000:]
