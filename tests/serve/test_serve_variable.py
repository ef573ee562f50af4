"""`vit-fast serve --variable-size` through a real Triton server on loopback: three images of different sizes sent at
once are batched together by Triton (a ragged input) into one execution, and each answer is the model's own forward
on that image alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from ._support import NEEDS_SERVE, free_ports

pytest.importorskip("pytriton", reason=NEEDS_SERVE)
http = pytest.importorskip("tritonclient.http", reason=NEEDS_SERVE)

from vit_fast.serve.server import Server  # noqa: E402
from vit_fast.util.numerics import assert_within_eager  # noqa: E402

from ..fakes import tiny_model  # noqa: E402

NAME = "naflex"
SIZES = [(32, 32), (24, 40), (16, 8)]


def _counts(client) -> tuple[int, int]:
    """(inferences, executions) Triton counted for the model so far."""
    stats = client.get_inference_statistics(NAME)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_three_sizes_sent_at_once_are_one_execution_and_each_answer_is_that_images_own_forward() -> None:
    model = tiny_model(dynamic_img_size=True, reg_tokens=1)
    rng = np.random.default_rng(0)
    images = [rng.standard_normal((1, 3, h, w)).astype(np.float32) for h, w in SIZES]
    http_port, grpc_port, metrics_port = free_ports(3)
    # the batcher waits up to 2 s for a batch of 3 (it sends one as soon as 3 requests are in): all three arrive
    # within that, so one execution of three sizes shows they were batched ragged, not one shape at a time
    with Server(
        model,
        name=NAME,
        batch=[3],
        queue_delay_us=2_000_000,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        threads=1,
        variable_size=True,
        max_image_size=64,
    ) as server:
        client = http.InferenceServerClient(server.endpoints.http, concurrency=len(images))
        try:
            config = client.get_model_config(NAME)
            (declared,) = config["input"]
            assert [int(d) for d in declared["dims"]] == [3, -1, -1] and declared["allow_ragged_batch"] is True, (
                declared
            )
            before = _counts(client)
            pending = []
            for image in images:  # all three in flight at once (the client's own concurrency: it is not thread-safe)
                request = http.InferInput("images", list(image.shape), "FP32")
                request.set_data_from_numpy(image)
                pending.append(client.async_infer(NAME, [request]))
            answers = [p.get_result(timeout=120).as_numpy("logits") for p in pending]
            inferences, executions = (a - b for a, b in zip(_counts(client), before, strict=True))
            assert (inferences, executions) == (3, 1), "three requests of three sizes, one execution"

            too_large = np.zeros((1, 3, 72, 32), dtype=np.float32)
            request = http.InferInput("images", list(too_large.shape), "FP32")
            request.set_data_from_numpy(too_large)
            with pytest.raises(Exception, match=r"72x32 is larger than this server's 64 px a side"):
                client.infer(NAME, [request])
        finally:
            client.close()
    model64 = copy.deepcopy(model).double()
    for image, answer in zip(images, answers, strict=True):
        x = torch.from_numpy(image)
        with torch.no_grad():
            eager, ref = model(x), model64(x.double())
        assert_within_eager(torch.from_numpy(np.array(answer)), eager, ref, f"served logits at {tuple(x.shape[2:])}")
