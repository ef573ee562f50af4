"""Issue 46's serving cases against a real Triton server on loopback (cases 7 and 4, refused requests in a batch:
tests/serve/test_serve_variable.py; case 3's front: tests/serve/test_serve_front.py):

- (3) an HTTP request that declares a huge shape, which killed Triton 2.51, is refused by the front and Triton stays
  up; a Triton that dies anyway (killed here) is restarted, said so, and serves again with the same access token,
  and so is the front;
- (8) a SIGKILLed server's private folder (PyTriton's workspace, Triton's log) is removed by the next one, which
  names it; a SIGTERM stop is a clean stop, not "exited with failure", and removes its own folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from vit_fast.serve.backend import _processes
from vit_fast.serve.endpoints import ACCESS_HEADERS

from ._support import LIE, NEEDS_SERVE, post_json, process_tree, start_serve, tritonserver_pid

pytest.importorskip("pytriton", reason=NEEDS_SERVE)

#: 12 TB declared: what killed Triton 2.51 at once on any machine before the front
HUGE = {"inputs": [{"name": "images", "shape": [1, 3, 10**6, 10**6], "datatype": "FP32", "data": list(range(12))}]}


@pytest.fixture
def short_tmpdir(monkeypatch):
    """A TMPDIR of the children's own, apart from other servers', and short: PyTriton's sockets live in it."""
    folder = Path(tempfile.mkdtemp(prefix="vf-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _restarted(child, what: str, times: int) -> None:
    """Wait until ``child`` said ``times`` times that ``what`` restarted."""
    deadline = time.monotonic() + 180
    while child.output().count(f"{what} restarted: serving again") < times:
        assert child.proc.poll() is None, child.output()[-3000:]
        assert time.monotonic() < deadline, child.output()[-3000:]
        time.sleep(0.5)


def test_a_lying_shape_is_refused_a_dying_triton_or_front_restarted_then_a_killed_servers_folder_is_removed(
    tmp_path, short_tmpdir
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = start_serve(tmp_path / "a", "default", "--batch", "1,8", "--protect", "on")
    try:
        token = json.loads((tmp_path / "a" / "ready.json").read_text())["access_token"]
        infer = f"http://{first.http}/v2/models/default/infer"
        good = {"inputs": [{"name": "images", "shape": [1, 1, 32, 32], "datatype": "FP32", "data": [0.5] * 1024}]}
        triton = tritonserver_pid(first.proc.pid)
        for lie in (LIE, HUGE):
            status, body = post_json(infer, lie)
            assert status == 400 and "dim 1 is 3" in json.loads(body)["error"], body
        assert tritonserver_pid(first.proc.pid) == triton and "exited by itself" not in first.output()
        os.kill(triton, signal.SIGKILL)  # a Triton that dies anyway
        _restarted(first, "Triton Inference Server", 1)
        assert "Triton Inference Server exited by itself" in first.output()
        assert "restarting it (1 of at most 3" in first.output()
        status, body = post_json(infer, good)
        assert status == 200 and json.loads(body)["outputs"][0]["name"] == "logits", body
        # the restarted Triton keeps the token the ready JSON gave clients
        stats_url = f"http://{first.http}/v2/models/default/stats"
        stats = urllib.request.Request(stats_url, headers={ACCESS_HEADERS["http"]: token})
        with urllib.request.urlopen(stats, timeout=60) as answer:
            assert answer.status == 200
        (front,) = [p for p, (ppid, cmd) in _processes().items() if ppid == first.proc.pid and "serve.front" in cmd]
        os.kill(front, signal.SIGKILL)  # a front that dies: the next one takes over the same listening socket
        _restarted(first, "the HTTP front", 1)
        assert "restarting it (2 of at most 3" in first.output()
        status, body = post_json(infer, good)
        assert status == 200 and json.loads(body)["outputs"][0]["name"] == "logits", body
        folders = sorted(short_tmpdir.glob(".vit-fast-serve.tmp-*"))
        assert len(folders) == 1, sorted(short_tmpdir.iterdir())
        assert len(list(folders[0].glob("triton-*.log"))) == 2, sorted(folders[0].iterdir())  # each start's log
    except BaseException:  # a failed check leaves no server behind
        first.terminate()
        raise

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
