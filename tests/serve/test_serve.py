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
from vit_fast.serve.loadtest import load_test  # noqa: E402
from vit_fast.util.numerics import assert_within_eager  # noqa: E402

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


def test_the_model_is_listed_by_the_repository_index_and_found_by_name(server: Child) -> None:
    """Triton loads the model from its --model-repository folder when it starts (model control "none"), so a client
    that discovers models through the repository index finds it, READY; its own probe and metadata, by name, too."""
    request = urllib.request.Request(f"http://{server.http}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        assert [(m["name"], m.get("state")) for m in json.loads(r.read())] == [(MODEL, "READY")]
    with urllib.request.urlopen(f"http://{server.http}/v2/models/{MODEL}/ready", timeout=10) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://{server.http}/v2/models/{MODEL}", timeout=10) as r:
        assert json.loads(r.read())["name"] == MODEL


def test_perf_analyzer_apis_answer_without_a_token_on_loopback(server: Child) -> None:
    """perf_analyzer reads statistics first, and --shared-memory system registers regions: both open on loopback."""
    for module, client in _clients(server).values():
        try:
            stats = client.get_inference_statistics(MODEL, as_json=True) if module is grpc else None
            stats = stats or client.get_inference_statistics(MODEL)
            assert stats["model_stats"][0]["name"] == MODEL
            assert client.get_system_shared_memory_status(**({"as_json": True} if module is grpc else {})) is not None
        finally:
            client.close()
    info = json.loads((server.log.parent / "ready.json").read_text())
    assert info["protected"] is False and info["access_token"] is None


def test_ready_means_the_model_answers(server: Child) -> None:
    info = json.loads((server.log.parent / "ready.json").read_text())
    assert info["ready"] == f"http://{server.http}/v2/models/{MODEL}/ready"
    with urllib.request.urlopen(info["ready"], timeout=10) as r:
        assert r.status == 200
    # the one request start-up sent through the whole path before it said ready
    client = http.InferenceServerClient(server.http)
    try:
        assert int(client.get_inference_statistics(MODEL)["model_stats"][0]["inference_count"]) >= 1
    finally:
        client.close()


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
    # (what, images, Triton dtype, input name, what Triton's error says over gRPC, what the HTTP front says)
    bad = [
        ("wrong image size", np.zeros((2, 1, 16, 16), np.float32), "FP32", "images", "unexpected shape", "dim 2 is 16"),
        (
            "wrong channel count",
            np.zeros((2, 3, 32, 32), np.float32),
            "FP32",
            "images",
            "unexpected shape",
            "dim 1 is 3",
        ),
        ("wrong dtype", good.astype(np.float64), "FP64", "images", "data-type is 'FP64'", 'is "FP64"; this server'),
        ("empty batch", np.zeros((0, 1, 32, 32), np.float32), "FP32", "images", "byte size mismatch", "dim 0 is 0"),
        (
            "batch above max",
            np.zeros((MAX_BATCH + 1, 1, 32, 32), np.float32),
            "FP32",
            "images",
            "batch-size must be",
            f"dim 0 is {MAX_BATCH + 1}",
        ),
        ("unknown input name", good, "FP32", "pixels", "unexpected inference input 'pixels'", '"pixels" is not this'),
        ("no batch dimension", good[0], "FP32", "images", "unexpected shape", "has 3 dims"),
    ]
    try:
        for what, x, triton_type, name, grpc_says, http_says in bad:
            with pytest.raises(InferenceServerException, match=grpc_says if protocol == "grpc" else http_says):
                _infer(module, client, x, triton_type, name)
            assert server.proc.poll() is None, f"the server died on a request with {what}"
            _check_answer(model, good, _infer(module, client, good))  # still serving, still right
    finally:
        client.close()


def test_a_second_serve_on_its_ports_names_the_owner_at_once_and_the_first_keeps_serving(server: Child, model) -> None:
    """The same user's second server on a port in use is refused on its lock, before any work, in one line naming
    the port and the first server's pid; the first one's model is untouched."""
    import resource
    import subprocess
    import sys

    ports = server.ports
    cmd = [sys.executable, "-m", "vit_fast", "serve", MODEL, "--http-port", str(ports[0])]
    cmd += ["--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU seconds, which a loaded machine does not stretch
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"vit-fast serve: error: HTTP port {ports[0]} is held by another vit-fast serve (pid {server.proc.pid}): "
        "stop that server, or pick another port with --http-port"
    ]
    assert "starting Triton" not in done.stdout  # refused before the model warmed up and Triton started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime < 60
    assert server.proc.poll() is None
    module, client = _clients(server)["http"]
    try:
        assert client.is_model_ready(MODEL)
        good = np.random.default_rng(2).standard_normal((2, 1, 32, 32)).astype(np.float32)
        _check_answer(model, good, _infer(module, client, good))
    finally:
        client.close()


def test_sigterm_under_load_stops_the_server_in_bounded_time_and_releases_its_ports(server: Child) -> None:
    import threading
    import time

    from vit_fast.serve.server import DRAIN_TIMEOUT_S

    assert server.proc.poll() is None
    assert not any(port_is_free(p) for p in server.ports)
    shm_before = set(os.listdir("/dev/shm"))
    stop = threading.Event()

    def keep_sending(module) -> None:  # clients that keep the server busy until it goes away
        client = module.InferenceServerClient(server.http if module is http else server.grpc)
        x = np.zeros((8, 1, 32, 32), np.float32)
        try:
            while not stop.is_set():
                try:
                    _infer(module, client, x)
                except Exception:
                    return
        finally:
            client.close()

    clients = [threading.Thread(target=keep_sending, args=(m,), daemon=True) for m in (http, grpc) * 3]
    for t in clients:
        t.start()
    time.sleep(2)
    t0 = time.monotonic()
    status = server.terminate(timeout_s=DRAIN_TIMEOUT_S + 30)
    took = time.monotonic() - t0
    stop.set()
    assert status == 0, server.output()[-3000:]
    # Triton gives in-flight requests DRAIN_TIMEOUT_S; the rest is the processes ending (a busy 2-core machine)
    assert took < DRAIN_TIMEOUT_S + 30, took
    left = {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith(f"pytrtion{server.proc.pid}")}
    assert not left, f"shared memory left behind: {sorted(left)}"
    # no python-backend stub of this server outlives it (they hold the psm_* shared-memory blocks)
    from vit_fast.serve.backend import _processes

    marker = f"pytrtion{server.proc.pid}-"
    assert not [pid for pid, (_, cmd) in _processes().items() if marker in cmd], "a backend stub outlived the server"
    assert all(port_is_free(p) for p in server.ports), "a port is still bound after the server stopped"
    assert "stopping" in server.output()
    assert "exited with failure" not in server.output()  # a requested stop is a clean stop (issue 46)


def test_ctrl_c_stops_the_server_cleanly(tmp_path) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group: vit-fast serve and the
    tritonserver it started both get it."""
    child = start_serve(tmp_path, MODEL, "--batch", "1,8")
    os.killpg(child.proc.pid, signal.SIGINT)
    assert child.proc.wait(60) == 0, child.output()[-3000:]
    assert all(port_is_free(p) for p in child.ports)
    assert "Signal (2) received" not in child.output()  # tritonserver's stdout stays in PyTriton's record


def test_on_other_interfaces_the_token_is_printed_and_required(tmp_path) -> None:
    """Listening on every interface (0.0.0.0) keeps PyTriton's access token; the server prints it and writes it to
    --json, and a client that sends it in the triton-access-token header reads the statistics."""
    child = start_serve(tmp_path, MODEL, "--batch", "1,8", "--host", "0.0.0.0")
    try:
        info = json.loads((tmp_path / "ready.json").read_text())
        token = info["access_token"]
        assert info["protected"] is True and token and token in child.output()
        client = http.InferenceServerClient(child.http)
        gclient = grpc.InferenceServerClient(child.grpc)
        try:
            with pytest.raises(InferenceServerException, match="restricted"):
                client.get_inference_statistics(MODEL)
            with pytest.raises(InferenceServerException, match="restricted"):
                gclient.get_inference_statistics(MODEL)
            stats = client.get_inference_statistics(MODEL, headers={"triton-access-token": token})
            assert stats["model_stats"][0]["name"] == MODEL
            headers = {"triton-grpc-protocol-triton-access-token": token}
            stats = gclient.get_inference_statistics(MODEL, headers=headers, as_json=True)
            assert stats["model_stats"][0]["name"] == MODEL
            assert client.is_model_ready(MODEL)  # inference and health stay open, as on any Triton
        finally:
            client.close()
            gclient.close()
    finally:
        assert child.terminate() == 0, child.output()[-3000:]


@pytest.mark.parametrize(("img", "chans", "transport"), [(32, 1, "base64"), (64, 3, "tensor store")])
def test_both_ways_pytriton_hands_requests_over_give_the_models_answers(img, chans, transport) -> None:
    """Small images travel inside PyTriton's messages, larger ones through its shared-memory tensor store
    (vit_fast.serve.settings.BASE64_MAX_IMAGE_BYTES): both answer as the model does, over both protocols, and
    the switch is back as it was once the server started (another PyTriton server here is not touched)."""
    from vit_fast.serve.server import NO_TENSORSTORE, Server

    from ._support import free_ports

    base = vit_fast.load_model(MODEL, backend="torch")
    model = vit_fast.VisionTransformer(
        vit_fast.ViTConfig(**{**base.cfg.to_dict(), "img_size": img, "in_chans": chans}), backend="torch"
    ).eval()
    before = os.environ.get(NO_TENSORSTORE)
    http_port, grpc_port, metrics_port = free_ports(3)
    x = np.random.default_rng(img).standard_normal((3, chans, img, img)).astype(np.float32)
    with Server(model, name=MODEL, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, threads=1) as s:
        assert s.transport == transport and os.environ.get(NO_TENSORSTORE) == before
        # what PyTriton 0.7.0 (pinned by the serve extra) took from the switch: its serializer in this process
        (bound,) = s._triton._model_manager.models
        serializer = {"base64": "Base64SerializerDeserializer", "tensor store": "TensorStoreSerializerDeserializer"}
        assert type(bound._serializer_deserializer).__name__ == serializer[transport]
        for module, address in ((http, s.endpoints.http), (grpc, s.endpoints.grpc)):
            client = module.InferenceServerClient(address)
            try:
                _check_answer(model, x, _infer(module, client, x))
            finally:
                client.close()
