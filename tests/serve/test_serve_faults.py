"""Issue 46's serving cases against a real Triton server on loopback:

- (7, 4) under --variable-size, refused requests batched with good ones fail only themselves, each with its own
  message (no traceback, no path), and the console gets one line per refused request, not a traceback;
- (3) an HTTP request that declares a huge shape kills Triton 2.51 (its HTTP frontend allocates what the shape
  needs before any check): `vit-fast serve` restarts it, says so, and serves again;
- (8) a SIGKILLed server's private folder (PyTriton's workspace, Triton's log) is removed by the next one, which
  names it; a SIGTERM stop is a clean stop, not "exited with failure", and removes its own folder.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from ._support import NEEDS_SERVE, free_ports, process_tree, start_serve

pytest.importorskip("pytriton", reason=NEEDS_SERVE)
http = pytest.importorskip("tritonclient.http", reason=NEEDS_SERVE)

from vit_fast.serve.server import Server  # noqa: E402
from vit_fast.util.numerics import assert_within_eager  # noqa: E402

from ..fakes import tiny_model  # noqa: E402

NAME = "naflex"
#: [1, 3, 60000, 60000] fp32 is 43 GB: more than this machine has, so Triton's allocation fails at once
LIE = {"inputs": [{"name": "images", "shape": [1, 3, 60000, 60000], "datatype": "FP32", "data": list(range(12))}]}


def _post(url: str, body: dict, timeout_s: float = 60.0) -> tuple[int | None, str]:
    """(HTTP status, body) of a JSON POST; (None, why) when the connection broke."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:  # the server died on it: connection reset, or no answer
        return None, str(err)


def test_refused_requests_in_a_batch_fail_only_themselves_with_a_message_and_one_console_line(capfd) -> None:
    model = tiny_model(dynamic_img_size=True, reg_tokens=1)
    rng = np.random.default_rng(0)
    good = [rng.standard_normal((1, 3, h, w)).astype(np.float32) for h, w in [(32, 32), (24, 40)]]
    bad = [np.zeros((1, 3, 72, 32), np.float32), np.zeros((1, 3, 30, 32), np.float32)]
    http_port, grpc_port, metrics_port = free_ports(3)
    # the batcher waits up to 2 s for a batch of 4, sent as soon as the 4 requests are in: one batch of all four
    with Server(
        model,
        name=NAME,
        batch=[4],
        queue_delay_us=2_000_000,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        threads=1,
        variable_size=True,
        max_image_size=64,
    ) as server:
        capfd.readouterr()
        client = http.InferenceServerClient(server.endpoints.http, concurrency=4)
        try:
            stats = client.get_inference_statistics(NAME)["model_stats"][0]
            executions = int(stats["execution_count"])
            pending = []
            for images in [good[0], bad[0], good[1], bad[1]]:
                request = http.InferInput("images", list(images.shape), "FP32")
                request.set_data_from_numpy(images)
                pending.append(client.async_infer(NAME, [request]))
            outcomes = []
            for p in pending:
                try:
                    outcomes.append(p.get_result(timeout=120).as_numpy("logits"))
                except Exception as err:  # tritonclient's InferenceServerException
                    outcomes.append(err)
            stats = client.get_inference_statistics(NAME)["model_stats"][0]
            assert int(stats["execution_count"]) - executions == 1, "the four requests were one batch"
        finally:
            client.close()
    answers = [outcomes[0], outcomes[2]]
    errors = [str(outcomes[1]), str(outcomes[3])]
    assert all(isinstance(a, np.ndarray) for a in answers), outcomes  # the good ones are answered
    assert "72x32 is larger than this server's 64 px a side" in errors[0]
    assert "30x32 is not a multiple of the 8-px patch" in errors[1]
    for message in errors:
        assert "Traceback" not in message and 'File "' not in message and ".py" not in message, message
    model64 = copy.deepcopy(model).double()
    for images, answer in zip(good, answers, strict=True):
        x = torch.from_numpy(images)
        with torch.no_grad():
            eager, ref = model(x), model64(x.double())
        assert_within_eager(torch.from_numpy(np.array(answer)), eager, ref, f"logits at {tuple(x.shape[2:])}")
    console = capfd.readouterr()
    text = console.out + console.err
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "refused a request" in line]
    # one line per refused request, at most one a second (one within the second of another is counted, then summed)
    assert 1 <= len(lines) <= 2 and any("72x32" in line or "30x32" in line for line in lines), lines
    assert "[vit-fast serve] 2 request(s) refused while serving" in text


@pytest.fixture
def short_tmpdir(monkeypatch):
    """A TMPDIR of the children's own, apart from other servers', and short: PyTriton's sockets live in it."""
    folder = Path(tempfile.mkdtemp(prefix="vf-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_lying_shape_kills_triton_and_serve_restarts_it_then_a_killed_servers_folder_is_removed(
    tmp_path, short_tmpdir
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = start_serve(tmp_path / "a", "default", "--batch", "1,8")
    infer = f"http://{first.http}/v2/models/default/infer"
    good = {"inputs": [{"name": "images", "shape": [1, 1, 32, 32], "datatype": "FP32", "data": [0.5] * 1024}]}
    status, _ = _post(infer, LIE)
    assert status != 200
    deadline = time.monotonic() + 180
    while "restarted: serving again" not in first.output():
        assert first.proc.poll() is None, first.output()[-3000:]
        assert time.monotonic() < deadline, first.output()[-3000:]
        time.sleep(0.5)
    assert "exited by itself" in first.output() and "restarting it (1 of at most 3" in first.output()
    status, body = _post(infer, good)
    assert status == 200 and json.loads(body)["outputs"][0]["name"] == "logits", body
    folders = sorted(short_tmpdir.glob(".vit-fast-serve.tmp-*"))
    assert len(folders) == 1, sorted(short_tmpdir.iterdir())
    assert len(list(folders[0].glob("triton-*.log"))) == 2, sorted(folders[0].iterdir())  # each start's log

    tree = process_tree(first.proc.pid)  # SIGKILL: no clean-up of its own (its Triton is ended here too)
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    first.proc.wait(30)
    assert folders[0].is_dir()
    second = start_serve(tmp_path / "b", "default", "--batch", "1,8")
    try:
        assert not folders[0].exists()
        assert f"removed 1 folder(s) that killed vit-fast serve runs left: {folders[0]}" in second.output()
    finally:
        status = second.terminate()
    assert status == 0, second.output()[-3000:]
    assert "exited with failure" not in second.output() and "stopping" in second.output()
    assert not list(short_tmpdir.glob(".vit-fast-serve.tmp-*")), "a stopped server removes its own folder"
