"""The HTTP front's checks without a server (stdlib only, so they run in either virtual environment): what an
inference request declares against the served model's limits (vit_fast.serve.declared), the strict request head
and body framing, bounded decompression, and one front in this process in front of a stand-in for Triton that
records what reaches it."""

from __future__ import annotations

import asyncio
import gzip
import json
import re

import pytest

from vit_fast.serve.declared import JSON_MAX, RequestLimits, model_limits, request_problem
from vit_fast.serve.front import Front, Refused, body_length, inflate, is_inference, parse_head
from vit_fast.serve.refusals import RefusalLog

FIXED = model_limits("images", "FP32", (1, 32, 32), 8, None, 4)
VARIABLE = model_limits("images", "FP32", (3, -1, -1), 8, 64, 4)
ENCODED = model_limits("image_bytes", "BYTES", (1,), 5, None, 4 + 16 * 2**20)


def _request(shape, data=None, datatype="FP32", name="images", **params) -> bytes:
    item = {"name": name, "shape": shape, "datatype": datatype}
    if data is not None:
        item["data"] = data
    if params:
        item["parameters"] = params
    return json.dumps({"inputs": [item]}).encode()


def test_the_issues_lie_and_its_neighbours_are_named_and_valid_requests_pass() -> None:
    lie = _request([1, 3, 60000, 60000], list(range(12)))
    assert "dim 1 is 3; this server takes images [B, 1, 32, 32] with B from 1 to 8" in request_problem(lie, 0, FIXED)
    lie3 = _request([1, 3, 60000, 60000], list(range(12)))
    problem = request_problem(lie3, 0, VARIABLE)
    assert "dim 2 is 60000" in problem and "H and W from 1 to 64 px (--max-image-size)" in problem
    assert request_problem(_request([1, 1, 32, 32], [0.5] * 1024), 0, FIXED) is None
    assert request_problem(_request([2, 1, 32, 32], [[0.5] * 1024] * 2), 0, FIXED) is None  # nested data
    assert (
        request_problem(_request([8, 3, 64, 24], binary_data_size=8 * 3 * 64 * 24 * 4), 8 * 3 * 64 * 24 * 4, VARIABLE)
        is None
    )
    assert (
        request_problem(_request([5, 1], datatype="BYTES", name="image_bytes", binary_data_size=50), 50, ENCODED)
        is None
    )
    cases = {
        "dim 0 is -1, and every dim is at least 1": _request([-1, 1, 32, 32], [0.5] * 1024),
        "dim 0 is 0, and every dim is at least 1": _request([0, 1, 32, 32], []),
        "dim 0 is 9;": _request([9, 1, 32, 32], [0.5] * 9 * 1024),
        "has 3 dims": _request([1, 32, 32], [0.5] * 1024),
        "its shape declares 2048 elements and its 'data' holds 1024": _request([2, 1, 32, 32], [0.5] * 1024),
        "its shape declares 4096 bytes (1024 x FP32) and its 'binary_data_size' 12": _request(
            [1, 1, 32, 32], binary_data_size=12
        ),
        "'shared_memory_byte_size' 99": _request([1, 1, 32, 32], shared_memory_region="r", shared_memory_byte_size=99),
        "one way": _request([1, 1, 32, 32], [0.5] * 1024, binary_data_size=4096),
        'is "FP64"; this server takes FP32': _request([1, 1, 32, 32], [0.5] * 1024, datatype="FP64"),
        'input "pixels" is not this model\'s': _request([1, 1, 32, 32], [0.5] * 1024, name="pixels"),
        "a list of integers": _request([1.5, 1, 32, 32], [0.5] * 1024),
        "not a number": _request([1, 1, 32, 32], [0.5] * 1023 + ["x"]),
        "is not JSON": b'{"inputs": [',
    }
    for says, body in cases.items():
        problem = request_problem(body, 0, FIXED)
        assert problem is not None and says in problem, (says, problem)
    two = json.dumps({"inputs": [json.loads(_request([1, 1, 32, 32], [0.5] * 1024))["inputs"][0]] * 2}).encode()
    assert "one input" in request_problem(two, 0, FIXED)
    # the binary sizes against what follows the JSON part
    claimed = _request([1, 1, 32, 32], binary_data_size=4096)
    assert "'binary_data_size' is 4096 bytes and 12 follow the JSON part" in request_problem(claimed, 12, FIXED)
    assert "and 5 follow" in request_problem(_request([1, 1, 32, 32], [0.5] * 1024), 5, FIXED)
    # BYTES: each element carries its 4-byte length and at most the largest encoded image
    huge = _request([1, 1], datatype="BYTES", name="image_bytes", binary_data_size=16 * 2**20 + 5)
    assert "outside 4 x 1 to" in request_problem(huge, 16 * 2**20 + 5, ENCODED)
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert "is not JSON" in request_problem(deep, 0, FIXED)


def test_limits_bound_the_largest_valid_body_and_travel_as_json() -> None:
    assert FIXED.max_elements == 8 * 32 * 32 and FIXED.max_body == FIXED.max_json + 8 * 32 * 32 * 4
    assert VARIABLE.max_json == 64 * 1024 + 8 * 3 * 64 * 64 * 32  # room for every number as JSON text
    large = model_limits("images", "FP32", (3, -1, -1), 64, 1024, 4)
    assert large.max_json == JSON_MAX and large.max_body == JSON_MAX + 64 * 3 * 1024 * 1024 * 4  # binary beyond
    assert RequestLimits.from_json(VARIABLE.to_json()) == VARIABLE


def test_heads_and_framings_triton_might_read_differently_are_refused() -> None:
    head = parse_head(b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 12\r\nX: a b\r\n\r\n")
    assert head.method == "POST" and body_length(head) == 12 and head.values("x") == ["a b"]
    for raw in (
        b"POST /x HTTP/1.1\r\nContent-Length: 1\nTransfer-Encoding: chunked\r\n\r\n",  # a bare LF
        b"POST /x HTTP/1.1\r\nContent Length: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\n folded: 1\r\n\r\n",
        b"POST  /x HTTP/1.1\r\n\r\n",
    ):
        with pytest.raises(Refused) as err:
            parse_head(raw)
        assert err.value.status == 400 and not err.value.readable
    with pytest.raises(Refused, match="HTTP/1.0 and HTTP/1.1 only"):
        parse_head(b"GET / HTTP/2.0\r\n\r\n")
    for headers, says in (
        (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "both"),
        (b"Content-Length: 5\r\nContent-Length: 6\r\n", "malformed Content-Length"),
        (b"Content-Length: -5\r\n", "malformed Content-Length"),
        (b"Transfer-Encoding: gzip, chunked\r\n", "other than chunked"),
    ):
        with pytest.raises(Refused, match=says):
            body_length(parse_head(b"POST /x HTTP/1.1\r\n" + headers + b"\r\n"))
    assert body_length(parse_head(b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")) is None
    for target in (
        "/v2/models/m/infer",
        "/v2/models/m/versions/1/infer?x=1",
        "/v2/models/m/%69nfer",
        "http://h/a/INFER",
    ):
        assert is_inference("POST", target), target
    # a model named after inference keeps its probes and metadata; Triton answers other methods with 405 unread
    for target in ("/v2/models/inference/ready", "/v2/models/infer_model", "/v2/health/ready"):
        assert not is_inference("POST", target) and not is_inference("GET", target), target
    assert not is_inference("GET", "/v2/models/m/infer")


def test_decompression_is_bounded() -> None:
    body = _request([1, 1, 32, 32], [0.5] * 1024)
    assert inflate(gzip.compress(body), "gzip", len(body)) == body
    with pytest.raises(Refused, match="decompresses to over"):
        inflate(gzip.compress(b"0" * 10**6), "gzip", 1000)
    with pytest.raises(Refused, match="does not decompress"):
        inflate(b"not gzip", "gzip", 1000)


async def _exchange(front: Front, raw: bytes) -> tuple[bytes, list[bytes]]:
    """``raw`` sent to ``front`` in this process, in front of a stand-in for Triton that answers every request with
    200 and records it; returns what the client read and what reached the stand-in."""
    reached: list[bytes] = []

    async def triton(reader, writer) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.CancelledError):  # the front closed it, or the test ended
                break
            length = int(parse_head(head).values("content-length")[0])
            reached.append(head + await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(triton, "127.0.0.1", 0)
    front.upstream = ("127.0.0.1", upstream.sockets[0].getsockname()[1])
    server = await asyncio.start_server(front.serve, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    writer.write(raw)
    await writer.drain()
    writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    server.close()
    upstream.close()
    return answer, reached


def test_one_front_passes_valid_requests_on_one_kept_alive_connection_and_refuses_the_rest(capsys) -> None:
    front = Front(FIXED, ("127.0.0.1", 1), RefusalLog())
    good = _request([1, 1, 32, 32], [0.5] * 1024)
    lie = _request([1, 3, 60000, 60000], list(range(12)))
    binary = _request([1, 1, 32, 32], binary_data_size=4096)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(good), good)
    packed = gzip.compress(good)
    raw = b"".join(
        [
            b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(good), good),
            b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(lie), lie),
            b"POST /v2/models/m/infer HTTP/1.1\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s"
            % (len(binary), len(binary) + 4096, binary + b"\0" * 4096),
            b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
            b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(packed)
            + packed,
            b"GET /v2/models/m/ready HTTP/1.1\r\ntriton-access-token: t\r\n\r\n",
            b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",  # refused unread, then closed
            b"GET /v2/health/ready HTTP/1.1\r\n\r\n",  # never read: the connection closed after the refusal
        ]
    )
    answer, reached = asyncio.run(_exchange(front, raw))
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert statuses == [b"200", b"400", b"200", b"200", b"200", b"200", b"413"], answer
    assert len(reached) == 5 and all(b"60000" not in r for r in reached)
    assert reached[0].endswith(good) and reached[2].endswith(good) and reached[3].endswith(good)  # re-framed, plain
    assert b"Transfer-Encoding" not in reached[2] and b"Content-Encoding" not in reached[3]
    assert b"triton-access-token: t\r\n" in reached[4]  # headers pass as sent
    assert b"Connection: close" in answer.split(b"HTTP/1.1 413")[1]
    assert front.refused == 2
    assert "refused a request: input 'images': shape [1, 3, 60000, 60000]" in capsys.readouterr().err


def test_triton_down_is_a_503_and_a_head_too_large_a_431() -> None:
    async def run() -> tuple[bytes, bytes]:
        front = Front(FIXED, ("127.0.0.1", 1), RefusalLog())  # port 1: nothing listens there
        server = await asyncio.start_server(front.serve, "127.0.0.1", 0, limit=2**16)
        answers = []
        for raw in (b"GET /v2/health/ready HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nX: " + b"a" * 2**17 + b"\r\n\r\n"):
            reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            writer.write(raw)
            await writer.drain()
            writer.write_eof()
            answers.append(await asyncio.wait_for(reader.read(), 30))
            writer.close()
        server.close()
        return answers[0], answers[1]

    down, large = asyncio.run(run())
    assert down.startswith(b"HTTP/1.1 503") and b"Triton is not answering" in down
    assert large.startswith(b"HTTP/1.1 431")
