"""A server only its owner controls, each attack planted against a real `vit-fast serve` on loopback:

- another client unloads the model, or loads one of its own whose code Triton's python backend would run: refused
  (Triton's model control is off), over HTTP and gRPC, also with the access token a local user reads from
  tritonserver's command line; the model keeps serving;
- two `vit-fast serve` started at once on the same ports: one serves, the other is refused in one line naming the
  port and the first one's pid, and touches nothing of it;
- the ready JSON holding the access token is readable by its user only, also over an existing 0644 file;
- the shared-memory blocks that carry requests and responses are readable by their user only while it serves.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from ._support import (
    NEEDS_SERVE,
    START_TIMEOUT_S,
    Child,
    free_ports,
    process_tree,
    ready_info,
    spawn_serve,
    start_serve,
    tritonserver_pid,
    wait_ready,
)

pytest.importorskip("pytriton", reason=NEEDS_SERVE)
http = pytest.importorskip("tritonclient.http", reason=NEEDS_SERVE)
grpc = pytest.importorskip("tritonclient.grpc", reason=NEEDS_SERVE)
from tritonclient.utils import InferenceServerException  # noqa: E402

from vit_fast.util.files import MARKER_KEY, json_text  # noqa: E402

MODEL = "default"
#: what Triton answers to a load or unload with model control "none"
REFUSED = "explicit model load / unload is not allowed"
#: a model a client would load with its own files: Triton's python backend would run this code as the server's user
PLANTED_MODEL_PY = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n\nclass TritonPythonModel:\n    pass\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`vit-fast serve default` as it starts by default: loopback, statistics and shared memory open."""
    child = start_serve(tmp_path_factory.mktemp("serve-open"), MODEL, "--batch", "1,8")
    yield child
    if child.proc.poll() is None:
        assert child.terminate() == 0, child.output()[-3000:]


@pytest.fixture(scope="module")
def protected(tmp_path_factory):
    """`vit-fast serve default --protect on --json ready.json` over a ready JSON of an earlier run, mode 0644."""
    tmp = tmp_path_factory.mktemp("serve-protected")
    earlier = tmp / "ready.json"
    earlier.write_text(json_text({MARKER_KEY: "0", "note": "an earlier run's ready JSON"}))  # sealed, as ours are
    earlier.chmod(0o644)
    child = start_serve(tmp, MODEL, "--batch", "1,8", "--protect", "on")
    yield child, tmp / "ready.json"
    if child.proc.poll() is None:
        assert child.terminate() == 0, child.output()[-3000:]


def _post(url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, str]:
    """POST ``body`` as JSON (what curl -X POST sends); the status and the answer's text."""
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _still_serving(server: Child) -> None:
    """The model answers ready and infers (one image through the whole path)."""
    with urllib.request.urlopen(f"http://{server.http}/v2/models/{MODEL}/ready", timeout=10) as reply:
        assert reply.status == 200
    client = http.InferenceServerClient(server.http)
    try:
        x = np.random.default_rng(0).standard_normal((1, 1, 32, 32)).astype(np.float32)
        request = http.InferInput("images", list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        assert client.infer(MODEL, [request]).as_numpy("logits").shape == (1, 10)
    finally:
        client.close()


def _planted_load(tmp_path: Path) -> tuple[dict, Path]:
    """A load request for a model named "planted" that brings its own model.py, and the file that code writes."""
    marker = tmp_path / "planted-model-ran"
    config = json.dumps({"name": "planted", "backend": "python", "max_batch_size": 0})
    files = {"file:1/model.py": PLANTED_MODEL_PY.format(marker=str(marker))}
    import base64

    params = {"config": config, **{k: base64.b64encode(v.encode()).decode() for k, v in files.items()}}
    return {"parameters": params}, marker


def test_no_client_unloads_the_model_or_loads_its_own_over_http(server: Child, tmp_path) -> None:
    """The issue's own attack: curl -X POST 127.0.0.1:PORT/v2/repository/models/default/unload."""
    status, text = _post(f"http://{server.http}/v2/repository/models/{MODEL}/unload")
    assert status == 503 and REFUSED in text, (status, text)
    body, marker = _planted_load(tmp_path)
    status, text = _post(f"http://{server.http}/v2/repository/models/planted/load", body)
    assert status == 503 and REFUSED in text, (status, text)
    time.sleep(1)
    assert not marker.exists(), "the planted model's code ran"
    assert server.proc.poll() is None
    _still_serving(server)


def test_no_client_unloads_the_model_or_loads_one_over_grpc(server: Child) -> None:
    client = grpc.InferenceServerClient(server.grpc)
    try:
        for act in (client.unload_model, client.load_model):
            with pytest.raises(InferenceServerException, match=REFUSED):
                act(MODEL)
        index = client.get_model_repository_index(as_json=True)["models"]
        assert [(m["name"], m.get("state")) for m in index] == [(MODEL, "READY")]
    finally:
        client.close()
    _still_serving(server)


def test_no_secret_on_tritonservers_command_line_by_default(server: Child) -> None:
    """Every local user reads a process's command line (/proc/PID/cmdline, ps): the default server gives
    tritonserver no token there, because nothing it serves needs one."""
    cmdline = Path(f"/proc/{tritonserver_pid(server.proc.pid)}/cmdline").read_bytes().split(b"\0")
    assert b"--model-control-mode" in cmdline and cmdline[cmdline.index(b"--model-control-mode") + 1] == b"none"
    assert not any(b"restricted" in arg or b"access-token" in arg for arg in cmdline), cmdline


def test_request_and_response_blocks_are_private_while_it_serves(server: Child) -> None:
    """Triton's python backend sets its blocks' mode (0644) itself; the server narrows them before the first
    request. Checked while requests flow: the blocks named after the server, and every shared-memory file any
    process of the server (tritonserver, its stubs, PyTriton's store) has mapped."""
    stop = threading.Event()

    def keep_sending() -> None:
        client = http.InferenceServerClient(server.http)
        x = np.zeros((4, 1, 32, 32), np.float32)
        try:
            while not stop.is_set():
                request = http.InferInput("images", list(x.shape), "FP32")
                request.set_data_from_numpy(x)
                client.infer(MODEL, [request])
        finally:
            client.close()

    sender = threading.Thread(target=keep_sending, daemon=True)
    sender.start()
    try:
        time.sleep(1)
        named = sorted(Path("/dev/shm").glob(f"pytrtion{server.proc.pid}-*"))
        assert named, "no shared-memory block of this server's python backend"
        mapped = set()
        for pid in process_tree(server.proc.pid):
            try:
                maps = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                continue
            mapped |= {Path(line.split(maxsplit=5)[5]) for line in maps.splitlines() if " /dev/shm/" in line}
        assert set(named) <= mapped, (named, mapped)
        modes = {str(p): oct(stat.S_IMODE(os.stat(p).st_mode)) for p in {*named, *mapped} if p.exists()}
        assert modes and set(modes.values()) == {"0o600"}, modes
        assert sender.is_alive(), "the requests stopped"
    finally:
        stop.set()
        sender.join(30)


def test_the_token_a_local_user_reads_from_ps_does_not_take_the_model_down(protected, tmp_path) -> None:
    """Triton reads its access token from its command line only (no option file, no environment variable): with
    --protect on it is there, where every local user can list it. It opens statistics and the rest, but loading
    and unloading stay closed to it."""
    server, ready = protected
    info = ready_info(ready)
    cmdline = Path(f"/proc/{tritonserver_pid(server.proc.pid)}/cmdline").read_bytes().decode()
    read_from_ps = re.search(r"triton-access-token=([^\0]+)", cmdline).group(1)
    assert read_from_ps == info["access_token"]
    headers = {"triton-access-token": read_from_ps}
    status, text = _post(f"http://{server.http}/v2/repository/models/{MODEL}/unload", headers=headers)
    assert status == 503 and REFUSED in text, (status, text)
    body, marker = _planted_load(tmp_path)
    status, text = _post(f"http://{server.http}/v2/repository/models/planted/load", body, headers=headers)
    assert status == 503 and REFUSED in text, (status, text)
    client = grpc.InferenceServerClient(server.grpc)
    try:
        with pytest.raises(InferenceServerException, match=REFUSED):
            client.unload_model(MODEL, headers={"triton-grpc-protocol-triton-access-token": read_from_ps})
    finally:
        client.close()
    status, _ = _post(f"http://{server.http}/v2/repository/models/{MODEL}/unload")
    assert status == 403  # without it the restriction answers first
    assert not marker.exists()
    _still_serving(server)


def test_the_ready_json_with_the_token_is_readable_by_its_user_only(protected) -> None:
    server, ready = protected
    info = ready_info(ready)
    assert info["protected"] is True and info["access_token"]
    assert stat.S_IMODE(os.stat(ready).st_mode) == 0o600  # it replaced a 0644 file of an earlier run


def test_of_two_servers_started_at_once_on_the_same_ports_one_serves(tmp_path) -> None:
    """Both used to pass the port probe; the loser's Triton then talked to the winner's, and its clean-up unloaded
    the winner's model. Now the ports' locks decide at once: the loser says so in one line, naming the port and the
    winner's pid, before the warm-up and Triton's start."""
    ports = free_ports(3)
    children = [
        spawn_serve(tmp_path, ports, MODEL, "--batch", "1,8", ready=tmp_path / f"ready-{i}.json", name=f"serve-{i}")
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S  # a hang guard as long as a start's: the refusal needs imports
        while all(c.proc.poll() is None for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        lost = [i for i, c in enumerate(children) if c.proc.poll() is not None]
        assert len(lost) == 1, [c.output()[-2000:] for c in children]
        loser, winner = children[lost[0]], children[1 - lost[0]]
        assert loser.proc.returncode == 1
        assert loser.output().strip().splitlines() == [
            f"vit-fast serve: error: HTTP port {ports[0]} is held by another vit-fast serve (pid {winner.proc.pid}): "
            "stop that server, or pick another port with --http-port"
        ]
        assert not (tmp_path / f"ready-{lost[0]}.json").exists()
        wait_ready(winner, tmp_path / f"ready-{1 - lost[0]}.json")
        _still_serving(winner)
    finally:
        for child in children:
            if child.proc.poll() is None:
                assert child.terminate() == 0, child.output()[-3000:]
