"""`vit-fast serve --variable-size` through a real Triton server on loopback: three images of different sizes sent at
once are batched together by Triton (a ragged input) into one execution, each answer is the model's own forward
on that image alone, and refused requests batched with them fail alone, each with its own message."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from ._support import LIE, NEEDS_SERVE, counts_after, free_ports, post_json

pytest.importorskip("pytriton", reason=NEEDS_SERVE)
http = pytest.importorskip("tritonclient.http", reason=NEEDS_SERVE)
from tritonclient.utils import InferenceServerException  # noqa: E402

from vit_fast.serve.server import Server  # noqa: E402
from vit_fast.util.numerics import assert_within_eager  # noqa: E402

from ..fakes import tiny_model  # noqa: E402

NAME = "naflex"
SIZES = [(32, 32), (24, 40), (16, 8)]


def _counts(client) -> tuple[int, int]:
    """(inferences, executions) Triton counted for the model so far."""
    stats = client.get_inference_statistics(NAME)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_sizes_sent_at_once_are_one_execution_and_refused_ones_among_them_fail_alone(capfd) -> None:
    """Three images of three sizes and two refused requests sent at once are one execution; each good answer is that
    image's own forward, and each refused request gets its own message (issue 46, cases 7 and 4: no traceback, no
    path; the console gets at most one line per refused request, never a traceback)."""
    model = tiny_model(dynamic_img_size=True, reg_tokens=1)
    rng = np.random.default_rng(0)
    images = [rng.standard_normal((1, 3, h, w)).astype(np.float32) for h, w in SIZES]
    # sizes the front lets through (within --max-image-size) and the model refuses
    bad = [np.zeros((1, 3, 4, 8), np.float32), np.zeros((1, 3, 30, 32), np.float32)]
    sent = [images[0], bad[0], images[1], bad[1], images[2]]
    http_port, grpc_port, metrics_port = free_ports(3)
    # the batcher waits up to 2 s for a batch of 5 (it sends one as soon as 5 requests are in): all five arrive
    # within that, so one execution of three sizes shows they were batched ragged, not one shape at a time
    with Server(
        model,
        name=NAME,
        batch=[len(sent)],
        queue_delay_us=2_000_000,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        threads=1,
        variable_size=True,
        max_image_size=64,
    ) as server:
        capfd.readouterr()
        client = http.InferenceServerClient(server.endpoints.http, concurrency=len(sent))
        try:
            config = client.get_model_config(NAME)
            (declared,) = config["input"]
            assert [int(d) for d in declared["dims"]] == [3, -1, -1] and declared["allow_ragged_batch"] is True, (
                declared
            )
            before = _counts(client)
            pending = []
            for image in sent:  # all in flight at once (the client's own concurrency: it is not thread-safe)
                request = http.InferInput("images", list(image.shape), "FP32")
                request.set_data_from_numpy(image)
                pending.append(client.async_infer(NAME, [request]))
            outcomes = []
            for p in pending:
                try:
                    outcomes.append(p.get_result(timeout=120).as_numpy("logits"))
                except InferenceServerException as err:
                    outcomes.append(err)
            inferences, executions = counts_after(client, NAME, before, len(sent))
            assert (inferences, executions) == (len(sent), 1), "five requests of five sizes, one execution"
            # issue 46 case 3: the lie, and a side over --max-image-size, are refused by the front, before Triton
            for shape, says in (([1, 3, 60000, 60000], "dim 2 is 60000"), ([1, 3, 72, 32], "dim 2 is 72")):
                lie = {"inputs": [{**LIE["inputs"][0], "shape": shape}]}
                status, answer = post_json(f"http://{server.endpoints.http}/v2/models/{NAME}/infer", lie)
                assert status == 400 and says in answer and "H and W from 1 to 64 px (--max-image-size)" in answer
            assert client.infer(NAME, [request]).as_numpy("logits").shape == (1, 7)  # still serving
        finally:
            client.close()
    answers = outcomes[0::2]
    assert all(isinstance(a, np.ndarray) for a in answers), outcomes  # the good ones are answered
    errors = [outcomes[1].message(), outcomes[3].message()]
    assert errors[0].startswith("images [1, 3, 4, 8]: 4x8 is smaller than one 8x8 patch"), errors
    assert errors[1].startswith("images [1, 3, 30, 32]: 30x32 is not a multiple of the 8-px patch"), errors
    for message in errors:
        assert "Traceback" not in message and 'File "' not in message and ".py" not in message, message
    model64 = copy.deepcopy(model).double()
    for image, answer in zip(images, answers, strict=True):
        x = torch.from_numpy(image)
        with torch.no_grad():
            eager, ref = model(x), model64(x.double())
        assert_within_eager(torch.from_numpy(np.array(answer)), eager, ref, f"served logits at {tuple(x.shape[2:])}")
    console = capfd.readouterr()
    text = console.out + console.err
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "refused a request" in line and "by the front" not in line]
    # one line per refused request, at most one a second (one within the second of another is counted, then summed)
    assert 1 <= len(lines) <= 2 and all("x8 is" in line or "x32 is" in line for line in lines), lines
    assert "the HTTP front refused 2 request(s)" in text
    assert "[vit-fast serve] 2 request(s) refused while serving" in text
