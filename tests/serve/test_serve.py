"""`vit-fast serve default` as a child process on loopback: health and metrics, a bounded load test
(8 clients x 100 requests, HTTP and gRPC, batch sizes 1..8) whose every answer is checked against
the model, malformed requests that get errors while the server keeps serving, and a clean stop on
SIGTERM that releases the ports."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import numpy as np
import pytest
import torch

from ._support import LOAD_TEST_REPORTS, NEEDS_SERVE, Child, port_is_free, start_serve

pytest.importorskip("pytriton", reason=NEEDS_SERVE)
http = pytest.importorskip("tritonclient.http", reason=NEEDS_SERVE)
grpc = pytest.importorskip("tritonclient.grpc", reason=NEEDS_SERVE)
from tritonclient.utils import InferenceServerException  # noqa: E402

import vit_fast  # noqa: E402
from vit_fast.numerics import assert_within_eager  # noqa: E402
from vit_fast.serve.loadtest import load_test  # noqa: E402

MODEL = "default"
MAX_BATCH = 64


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    child = start_serve(tmp_path_factory.mktemp("serve"), MODEL, "--batch", f"1,8,{MAX_BATCH}", "--instances", "2")
    yield child
    if child.proc.poll() is None:
        child.terminate()


@pytest.fixture(scope="module")
def model():
    return vit_fast.load_model(MODEL, backend="torch")


def _clients(server: Child):
    return {
        "http": (http, http.InferenceServerClient(server.http)),
        "grpc": (grpc, grpc.InferenceServerClient(server.grpc)),
    }


def _infer(module, client, x: np.ndarray, triton_type: str = "FP32", name: str = "images") -> np.ndarray:
    inp = module.InferInput(name, list(x.shape), triton_type)
    inp.set_data_from_numpy(x)
    return client.infer(MODEL, [inp]).as_numpy("logits")


def _check_answer(model, x: np.ndarray, y: np.ndarray) -> None:
    xt = torch.from_numpy(x)
    with torch.no_grad():
        eager = model(xt)
        ref = model.double()(xt.double())
        model.float()
    assert_within_eager(torch.from_numpy(np.array(y)), eager, ref, "served logits")


def test_health_model_and_metrics_endpoints(server: Child) -> None:
    with urllib.request.urlopen(f"http://{server.http}/v2/health/ready", timeout=10) as r:
        assert r.status == 200
    for module, client in _clients(server).values():
        try:
            assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
            # HTTP answers the config as a dict; gRPC as JSON only when asked (int64 fields become strings)
            config = client.get_model_config(MODEL) if module is http else client.get_model_config(MODEL, as_json=True)
            config = config.get("config", config)
            assert int(config["max_batch_size"]) == MAX_BATCH
            assert [int(b) for b in config["dynamic_batching"]["preferred_batch_size"]] == [8, MAX_BATCH]
            assert sum(int(g["count"]) for g in config["instance_group"]) == 2
        finally:
            client.close()
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    assert f'nv_inference_request_success{{model="{MODEL}",version="1"}}' in text


def test_the_warmup_comes_before_the_server_reports_ready(server: Child) -> None:
    out = server.output()
    # on this CPU the torch backend serves: nothing to compile, and it says so, before Triton starts
    warm = out.index("[vit-fast warmup] nothing to compile: the model runs on the torch backend here")
    assert warm < out.index("serving "), out[-3000:]


def test_load_test_every_answer_matches_the_model(server: Child, model, tmp_path) -> None:
    report = load_test(model, MODEL, server.http, server.grpc, clients=8, requests=100, batch_sizes=range(1, 9), seed=0)
    (tmp_path / "load-test.json").write_text(json.dumps(report.to_dict(), indent=2))
    text = report.format()
    print(text)
    LOAD_TEST_REPORTS.append(text)
    assert report.errors == []
    assert report.requests == report.answered == report.within_rule == 800
    assert report.passed
    assert report.by_protocol["http"]["requests"] == report.by_protocol["grpc"]["requests"] == 400
    assert 0 < report.p50_ms <= report.p99_ms <= report.max_ms
    assert report.requests_per_s > 0 and report.images >= 800


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_malformed_requests_get_errors_and_the_server_keeps_serving(server: Child, model, protocol) -> None:
    module, client = _clients(server)[protocol]
    good = np.random.default_rng(1).standard_normal((3, 1, 32, 32)).astype(np.float32)
    bad = [  # (what, images, Triton dtype, input name, what Triton's error says)
        ("wrong image size", np.zeros((2, 1, 16, 16), np.float32), "FP32", "images", "unexpected shape"),
        ("wrong channel count", np.zeros((2, 3, 32, 32), np.float32), "FP32", "images", "unexpected shape"),
        ("wrong dtype", good.astype(np.float64), "FP64", "images", "data-type is 'FP64'"),
        ("empty batch", np.zeros((0, 1, 32, 32), np.float32), "FP32", "images", "byte size mismatch"),
        ("batch above max", np.zeros((MAX_BATCH + 1, 1, 32, 32), np.float32), "FP32", "images", "batch-size must be"),
        ("unknown input name", good, "FP32", "pixels", "unexpected inference input 'pixels'"),
        ("no batch dimension", good[0], "FP32", "images", "unexpected shape"),
    ]
    try:
        for what, x, triton_type, name, says in bad:
            with pytest.raises(InferenceServerException, match=says):
                _infer(module, client, x, triton_type, name)
            assert server.proc.poll() is None, f"the server died on a request with {what}"
            _check_answer(model, good, _infer(module, client, good))  # still serving, still right
    finally:
        client.close()


def test_sigterm_stops_the_server_cleanly_and_releases_its_ports(server: Child) -> None:
    assert server.proc.poll() is None
    assert not any(port_is_free(p) for p in server.ports)
    assert server.terminate(timeout_s=60) == 0, server.output()[-3000:]
    assert all(port_is_free(p) for p in server.ports), "a port is still bound after the server stopped"
    assert "stopping" in server.output()


def test_ctrl_c_stops_the_server_cleanly(tmp_path) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group: vit-fast serve and the
    tritonserver it started both get it."""
    child = start_serve(tmp_path, MODEL, "--batch", "1,8")
    os.killpg(child.proc.pid, signal.SIGINT)
    assert child.proc.wait(60) == 0, child.output()[-3000:]
    assert all(port_is_free(p) for p in child.ports)
