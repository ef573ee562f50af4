"""`vit-fast serve`'s HTTP front against a real Triton server on loopback (issue 46, case 3): one unauthenticated
request declaring [1, 3, 60000, 60000] with 12 values made tritonserver 2.51 allocate 43 GB and die. Now the front
refuses it with a 400 and a one-line message before Triton reads it, for `serve default` and a fixed-size checkpoint
(here; --variable-size and --encoded: test_serve_variable.py, test_serve_encoded.py), and so are its neighbours:
negative and zero dims, shapes that do not match the data, a binary header that lies, a body over the largest valid
request (refused from its length, before it is sent); a valid request is answered bit-identically to Triton's own
port, and health, metadata, statistics and the repository index pass through."""

from __future__ import annotations

import http.client
import json
import re
import socket

import numpy as np
import pytest

from ._support import LIE, NEEDS_SERVE, Child, start_serve, tritonserver_pid

pytest.importorskip("pytriton", reason=NEEDS_SERVE)
httpclient = pytest.importorskip("tritonclient.http", reason=NEEDS_SERVE)

MODEL = "default"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    child = start_serve(tmp_path_factory.mktemp("front"), MODEL, "--batch", "1,8")
    yield child
    assert child.terminate() == 0, child.output()[-3000:]


def triton_port(child: Child) -> int:
    """Where the Triton that ``child`` (a `vit-fast serve`) started listens for HTTP itself, behind the front."""
    cmdline = open(f"/proc/{tritonserver_pid(child.proc.pid)}/cmdline", "rb").read().decode()
    return int(re.search(r"--http-port[= \0](\d+)", cmdline).group(1))


def _send(conn: http.client.HTTPConnection, path: str, body: bytes | dict | None = None, **headers: str):
    """(status, JSON answer) of one request on ``conn`` (kept alive)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request("POST" if data is not None else "GET", path, body=data, headers=headers)
    answer = conn.getresponse()
    text = answer.read()
    return answer.status, json.loads(text) if text else None


def _failed(port: int) -> int:
    """How many inference requests Triton itself counted as failed for the model."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        _, stats = _send(conn, f"/v2/models/{MODEL}/stats")
    finally:
        conn.close()
    return int(stats["model_stats"][0]["inference_stats"]["fail"]["count"])


def _binary(shape: list[int], payload: bytes, size: int | None = None) -> tuple[bytes, dict]:
    header = {"inputs": [{"name": "images", "shape": shape, "datatype": "FP32", "parameters": {}}]}
    header["inputs"][0]["parameters"]["binary_data_size"] = len(payload) if size is None else size
    text = json.dumps(header).encode()
    return text + payload, {"Inference-Header-Content-Length": str(len(text))}


def test_the_lie_and_its_neighbours_get_a_400_before_triton_reads_them(server: Child) -> None:
    before, pid = _failed(triton_port(server)), tritonserver_pid(server.proc.pid)
    good = np.random.default_rng(0).standard_normal((1, 1, 32, 32)).astype(np.float32)
    json_good = {
        "inputs": [{"name": "images", "shape": [1, 1, 32, 32], "datatype": "FP32", "data": good.ravel().tolist()}]
    }
    bad = [  # (what, body or (body, headers), what the message says)
        ("the issue's lie", LIE, "shape [1, 3, 60000, 60000]: dim 1 is 3; this server takes images [B, 1, 32, 32]"),
        ("a negative dim", {"inputs": [{**json_good["inputs"][0], "shape": [1, 1, -32, 32]}]}, "dim 2 is -32"),
        ("a zero dim", {"inputs": [{**json_good["inputs"][0], "shape": [0, 1, 32, 32], "data": []}]}, "dim 0 is 0"),
        (
            "a shape its data does not fill",
            {"inputs": [{**json_good["inputs"][0], "shape": [2, 1, 32, 32]}]},
            "its shape declares 2048 elements and its 'data' holds 1024",
        ),
        ("a binary lie", _binary([1, 3, 60000, 60000], b"\0" * 48), "dim 1 is 3"),
        ("a binary size that lies", _binary([1, 1, 32, 32], b"\0" * 48), "declares 4096 bytes (1024 x FP32)"),
        (
            "a binary header that lies",
            _binary([1, 1, 32, 32], b"\0" * 48, size=4096),
            "its 'binary_data_size' is 4096 bytes and 48 follow the JSON part",
        ),
    ]
    conn = http.client.HTTPConnection(server.http, timeout=60)
    try:
        for what, request, says in bad:
            body, headers = request if isinstance(request, tuple) else (request, {})
            status, answer = _send(conn, f"/v2/models/{MODEL}/infer", body, **headers)
            assert status == 400 and says in answer["error"], (what, status, answer)
            assert "Traceback" not in answer["error"] and "/" not in answer["error"], answer
            # the same connection (its body read) goes on: a valid request is answered
            status, answer = _send(conn, f"/v2/models/{MODEL}/infer", json_good)
            assert status == 200 and answer["outputs"][0]["name"] == "logits", (what, answer)
    finally:
        conn.close()
    assert _failed(triton_port(server)) == before, "a refused request reached Triton"
    assert tritonserver_pid(server.proc.pid) == pid and "exited by itself" not in server.output()
    assert "refused a request: input 'images': shape [1, 3, 60000, 60000]" in server.output()


def test_a_body_over_the_largest_valid_request_is_refused_before_it_is_sent(server: Child) -> None:
    host, port = server.http.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {10**12}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):  # the answer and the close come without a byte of the body sent
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in answer, answer
    assert b"over the" in answer and b"largest valid request" in answer
    conn = http.client.HTTPConnection(server.http, timeout=60)
    try:
        assert _send(conn, f"/v2/models/{MODEL}/ready")[0] == 200
    finally:
        conn.close()


def test_valid_requests_are_answered_bit_identically_and_other_endpoints_pass_through(server: Child) -> None:
    x = np.random.default_rng(1).standard_normal((3, 1, 32, 32)).astype(np.float32)
    answers = []
    for address in (server.http, f"127.0.0.1:{triton_port(server)}"):  # the front, then Triton's own port
        client = httpclient.InferenceServerClient(address)
        try:
            for binary in (True, False):
                request = httpclient.InferInput("images", list(x.shape), "FP32")
                request.set_data_from_numpy(x, binary_data=binary)
                answers.append(client.infer(MODEL, [request]).as_numpy("logits"))
            assert client.is_server_live() and client.is_model_ready(MODEL)
            assert client.get_model_metadata(MODEL)["inputs"][0]["shape"] == [-1, 1, 32, 32]
            assert client.get_inference_statistics(MODEL)["model_stats"][0]["name"] == MODEL
            assert [m["name"] for m in client.get_model_repository_index()] == [MODEL]
        finally:
            client.close()
    for answer in answers[1:]:
        assert answer.tobytes() == answers[0].tobytes()


def test_a_fixed_size_checkpoint_refuses_the_lie_and_answers(tmp_path) -> None:
    import vit_fast

    from ..fakes import tiny_model

    checkpoint = tmp_path / "tiny.safetensors"
    vit_fast.save_checkpoint(tiny_model(), checkpoint)
    child = start_serve(tmp_path, str(checkpoint), "--batch", "1,4")
    try:
        conn = http.client.HTTPConnection(child.http, timeout=60)
        status, answer = _send(conn, "/v2/models/tiny/infer", LIE)
        assert status == 400 and "dim 2 is 60000; this server takes images [B, 3, 32, 32]" in answer["error"], answer
        good = {"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.25] * 3072}]}
        status, answer = _send(conn, "/v2/models/tiny/infer", good)
        assert status == 200 and answer["outputs"][0]["shape"] == [1, 7], answer
        conn.close()
    finally:
        assert child.terminate() == 0, child.output()[-3000:]


def test_shared_memory_inputs_pass_the_front_when_their_size_matches_their_shape(server: Child) -> None:
    """What perf_analyzer's --shared-memory system does over HTTP: a region registered through the front, then
    inputs that name it; a byte size that does not match the shape is refused before Triton maps anything."""
    import tritonclient.utils.shared_memory as shm

    x = np.random.default_rng(2).standard_normal((2, 1, 32, 32)).astype(np.float32)
    key = f"/vf-front-{server.proc.pid}"
    region = shm.create_shared_memory_region("front", key, x.nbytes)
    client = httpclient.InferenceServerClient(server.http)
    try:
        shm.set_shared_memory_region(region, [x])
        client.register_system_shared_memory("front", key, x.nbytes)
        request = httpclient.InferInput("images", list(x.shape), "FP32")
        request.set_shared_memory("front", x.nbytes)
        via_shm = client.infer(MODEL, [request]).as_numpy("logits")
        plain = httpclient.InferInput("images", list(x.shape), "FP32")
        plain.set_data_from_numpy(x)
        assert via_shm.tobytes() == client.infer(MODEL, [plain]).as_numpy("logits").tobytes()
        request.set_shared_memory("front", x.nbytes // 2)
        with pytest.raises(Exception, match="'shared_memory_byte_size' 4096"):
            client.infer(MODEL, [request])
        client.unregister_system_shared_memory("front")
    finally:
        client.close()
        shm.destroy_shared_memory_region(region)
