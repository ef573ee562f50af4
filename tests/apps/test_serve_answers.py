"""Issue 46's serving cases without a server: each request of a batch answered on its own (a refused one with its own
message, never a traceback), one console line per refused request at most once a second, the stub's change that
turns a refusal into that request's error, the bounded restarts of a Triton that died, and a killed server's folder
removed by the next one. Through a real Triton server: tests/serve/test_serve_faults.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest

from vit_fast.serve import lifecycle, refusals
from vit_fast.serve import server as srv
from vit_fast.serve.answers import REFUSED_KEY, RefusalLog, answer_each, answer_stacked, failure_message, refused

from ..fakes import tiny_model


def _message(response: dict) -> str:
    assert list(response) == [REFUSED_KEY]
    return response[REFUSED_KEY].tobytes().decode()


def test_a_refused_request_carries_its_message_only() -> None:
    assert _message(refused("images [1, 3, 72, 32]: too large ü")) == "images [1, 3, 72, 32]: too large ü"


def test_a_failed_batch_answers_each_request_with_a_message_and_the_console_one_line(monkeypatch) -> None:
    lines = io.StringIO()
    log = RefusalLog(lines)

    def boom() -> list:
        raise RuntimeError("CUDA out of memory at /home/me/vit_fast/model/vit.py:12")

    out = answer_each([{}, {}, {}], "logits", boom, log)
    assert [_message(r) for r in out] == [
        "the server failed to run this request's batch (RuntimeError); its console says why"
    ] * 3
    assert lines.getvalue().count("\n") == 1 and "RuntimeError: CUDA out of memory" in lines.getvalue()
    assert "Traceback" not in lines.getvalue()
    assert failure_message(ValueError("images must be [B, C, H, W]")) == "images must be [B, C, H, W]"


def test_the_console_gets_a_line_per_refused_request_at_most_once_a_second(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(refusals.time, "monotonic", lambda: now[0])
    lines = io.StringIO()
    log = RefusalLog(lines)
    for t in (0.0, 0.1, 0.2, 0.9, 1.5, 3.0):  # 188 tracebacks in the issue: here 6 refusals, 3 lines
        now[0] = 100.0 + t
        log.note(f"refusal at {t}\nsecond line never shown")
    assert lines.getvalue().splitlines() == [
        "[vit-fast serve] refused a request: refusal at 0.0",
        "[vit-fast serve] refused a request: refusal at 1.5 (and 3 more refused since the last line)",
        "[vit-fast serve] refused a request: refusal at 3.0",
    ]
    assert log.summary() == "[vit-fast serve] 6 request(s) refused while serving"
    assert RefusalLog(lines).summary() is None


def test_fixed_size_requests_are_run_as_one_batch_and_split_back(monkeypatch) -> None:
    server = srv.Server(tiny_model(), threads=1)
    seen = []

    def infer(images):
        seen.append(images.shape)
        return {"logits": images.reshape(len(images), -1)[:, :2] * 2}

    monkeypatch.setattr(server, "infer", infer)
    rng = np.random.default_rng(0)
    requests = [{"images": rng.standard_normal((b, 3, 32, 32)).astype(np.float32)} for b in (2, 1, 3)]
    for r in requests:
        r["images"].flags.writeable = False  # as PyTriton hands them over
    out = server.answer(requests)
    assert seen == [(6, 3, 32, 32)]
    for request, response in zip(requests, out, strict=True):
        np.testing.assert_array_equal(
            response["logits"], request["images"].reshape(len(request["images"]), -1)[:, :2] * 2
        )
    assert answer_stacked(requests[:1], "images", "logits", infer)[0]["logits"].shape == (2, 2)


STUB = """import json

def _wrap_response(response: Response, requested_outputs_names, model_outputs_dict):
    if response.data is not None:
        return 1
    else:
        return None
"""


class _Triton:
    def __init__(self, store) -> None:
        self._workspace = type("Workspace", (), {"model_store_path": store})()


def test_the_stub_turns_a_refusal_into_that_requests_own_error(tmp_path) -> None:
    from vit_fast.serve.backend import REFUSAL_LINES, per_request_errors

    script = tmp_path / "m" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text(STUB)
    assert per_request_errors(_Triton(tmp_path), "m") == script
    assert per_request_errors(_Triton(tmp_path), "m") == script  # twice: changed once
    text = script.read_text()
    assert text.count(REFUSAL_LINES) == 1 and text.replace(REFUSAL_LINES, "") == STUB
    compile(text, str(script), "exec")

    class Error(Exception):
        def __init__(self, message) -> None:
            self.message = message

    class PbUtils:  # what the stub's module sees as pb_utils
        TritonError = Error

        @staticmethod
        def InferenceResponse(output_tensors, error):  # noqa: N802 - Triton's name
            return (output_tensors, error.message)

    scope = {"pb_utils": PbUtils, "Response": object}
    exec(text, scope)
    response = type("R", (), {"data": refused("images [1, 3, 30, 32]: not a multiple")})()
    assert scope["_wrap_response"](response, ["logits"], {}) == ([], "images [1, 3, 30, 32]: not a multiple")
    (tmp_path / "other" / "1").mkdir(parents=True)
    (tmp_path / "other" / "1" / "model.py").write_text("def _wrap_response(response):\n    pass\n")
    with pytest.raises(RuntimeError, match="cannot answer each request of a batch on its own with this PyTriton"):
        per_request_errors(_Triton(tmp_path), "other")


def test_a_dying_triton_is_restarted_three_times_within_the_window_then_given_up(monkeypatch, capsys) -> None:
    now = [0.0]
    monkeypatch.setattr(lifecycle.time, "monotonic", lambda: now[0])
    restarts = lifecycle.Restarts(limit=3, window_s=600.0)
    allowed = []
    for t in (0, 10, 20, 30, 700):
        now[0] = t
        allowed.append(restarts.allow("Triton Inference Server exited by itself"))
    assert allowed == [True, True, True, False, True]
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "[vit-fast serve] Triton Inference Server exited by itself; restarting it (1 of at most 3 restarts in 600 s)"
    )
    assert len(err) == 4


KILLED = """
import os, sys
from vit_fast.util.files import temp_staging
with temp_staging(sys.argv[1]) as folder:
    (folder / "w1").mkdir()
    print(folder, flush=True)
    os._exit(0)  # as if killed: no clean-up
"""


def test_a_killed_servers_folder_is_removed_by_the_next_and_named(tmp_path, monkeypatch, capsys) -> None:
    import contextlib

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(lifecycle.tempfile, "tempdir", None)  # read TMPDIR again
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    left = subprocess.run([sys.executable, "-c", KILLED, lifecycle.WORKSPACE_NAME], env=env, capture_output=True)
    stale = tmp_path / left.stdout.decode().strip()
    assert stale.is_dir() and (stale / "w1").is_dir(), left.stderr.decode()
    other = tmp_path / ".vit-fast-serve.tmp-0123456789abcdef"  # looks like one, no marker: not proven ours
    other.mkdir()
    with contextlib.ExitStack() as stack:
        mine = lifecycle.private_folder(stack, "s")
        assert mine.is_dir() and not stale.exists() and other.is_dir()
        assert f"removed 1 folder(s) that killed vit-fast serve runs left: {stale}" in capsys.readouterr().err
        with contextlib.ExitStack() as second:  # a live server's folder is never removed
            lifecycle.private_folder(second, "s")
            assert mine.is_dir()
    assert not mine.exists()
    with pytest.raises(OSError, match="too deep for the sockets.*set TMPDIR to a shorter folder"):
        lifecycle.private_folder(contextlib.ExitStack(), "x" * 120)
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name]
