"""Long commands stopped part way keep what they finished: Ctrl-C (SIGINT) and SIGTERM (what ``timeout`` sends)
reach a real ``vit-fast`` process while it runs; the finished cases, checks or steps are in its report files,
marked as cut, and it exits 130 or 143. Plus the signal handling itself (vit_fast.util.interrupts)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from vit_fast.util import interrupts

NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet (each rewrite is atomic: never half a file)
        return None


def interrupted(argv: list[str], ready: Callable[[], bool], sig: int, timeout: float = 300) -> tuple[int, str]:
    """Start ``vit-fast ARGV``, wait until ``ready()``, send ``sig``; its exit status and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vit_fast.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as a terminal delivers it: a background job of a non-interactive shell inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"it ended before it was interrupted:\n{proc.communicate()[1]}"
            assert time.monotonic() < deadline, "never got ready"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def _no_staging_left(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=NAMES.get)
def test_an_interrupted_bench_keeps_the_finished_cases(tmp_path, sig):
    """Four cases of at least 2 s each; the signal comes once the first case's row is on disk."""
    out = tmp_path / "out"
    report = out / "bench_default.json"
    argv = ["bench", "default", "--out", str(out), "--batch", "1,2,4,8", "--backends", "torch", "--min-samples", "50"]
    argv += ["--min-time", "2", "--device", "cpu", "--threads", "1", "--no-ceilings"]
    code, err = interrupted(argv, lambda: ((_json(report) or {}).get("cases") or {}).get("done", 0) >= 1, sig)
    assert code == 128 + sig, err
    data = json.loads(report.read_text())
    done = data["cases"]["done"]
    assert 1 <= done < 4 and data["cases"]["total"] == 4
    assert data["complete"] is False and data["interrupted"] == f"interrupted by {NAMES[sig]} after {done} of 4 cases"
    assert [r["batch"] for r in data["rows"]] == [1, 2, 4, 8][:done]
    assert all(r["status"] == "ok" and r["n"] >= 50 for r in data["rows"])
    with open(out / "bench_default.csv") as f:
        lines = list(csv.DictReader(f))
    assert [int(r["infer_batch_size"]) for r in lines] == [1, 2, 4, 8][:done]
    assert [float(r["median_ms"]) for r in lines] == [r["median_ms"] for r in data["rows"]]
    cut = f"**incomplete: interrupted by {NAMES[sig]} after {done} of 4 cases**"
    assert cut in (out / "bench_default.md").read_text()
    assert (out / "bench_default.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[bench] 1/4 fp32 torch batch 1: median" in err  # the row was printed as the case ended
    assert f"wrote json (partial): {report}" in err
    assert err.rstrip().endswith(
        "vit-fast bench: " + ("terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted")
    )
    _no_staging_left(out)


@pytest.mark.slow
def test_an_interrupted_doctor_keeps_the_checks_that_ended(tmp_path):
    """SIGTERM once a kernel check of the interpreter child (forwarded as it ends) is in report.json."""
    out = tmp_path / "doctor"

    def kernel_check_written() -> bool:
        checks = (_json(out / "report.json") or {}).get("checks") or []
        return any(c["section"] == "kernels" and c["status"] != "skipped" for c in checks)

    code, err = interrupted(["doctor", "--out", str(out), "--device", "cpu"], kernel_check_written, signal.SIGTERM)
    assert code == 143, err
    data = json.loads((out / "report.json").read_text())
    n = len(data["checks"])
    assert data["complete"] is False and data["interrupted"] == f"interrupted by SIGTERM after {n} checks"
    assert data["exit_code"] is None and data["ok"] is False
    assert any(c["section"] == "environment" for c in data["checks"])
    assert any(c["section"] == "kernels" and c["status"] == "ok" for c in data["checks"])
    assert f"INCOMPLETE (interrupted by SIGTERM after {n} checks" in (out / "report.md").read_text()
    assert f"interrupted by SIGTERM after {n} checks: {out / 'report.json'}" in err
    _no_staging_left(out)


@pytest.mark.slow
def test_an_interrupted_verify_keeps_the_finished_cases(tmp_path):
    """The triton backend in Triton's interpreter, four batches; Ctrl-C once the first batch's rows are written."""
    path = tmp_path / "verify.json"
    argv = ["verify", "default", "triton", "--batch", "1,2,3,4", "--limit", "2", "--json", str(path)]
    code, err = interrupted(argv, lambda: bool((_json(path) or {}).get("rows")), signal.SIGINT)
    assert code == 130, err
    data = json.loads(path.read_text())
    done = len({r["batch"] for r in data["rows"]})
    assert data["complete"] is False and data["passed"] is False  # a cut run has not passed, whatever its rows say
    assert data["interrupted"] == f"interrupted by SIGINT after {done} of 4 cases"
    assert sorted({r["batch"] for r in data["rows"]}) == [1, 2, 3, 4][:done]
    assert "[vit-fast verify] batch 1 at 32x32: done (" in err and f"the finished cases are in {path}" in err


@pytest.mark.slow
def test_an_interrupted_demo_keeps_the_steps_that_ended(tmp_path):
    """SIGTERM once step 1 is in report.json (step 3, the ONNX export, is running then)."""
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--skip-triton", "--no-plots"]
    code, err = interrupted(argv, lambda: bool((_json(out / "report.json") or {}).get("steps")), signal.SIGTERM)
    assert code == 143, err
    data = json.loads((out / "report.json").read_text())
    assert data["complete"] is False and data["exit_code"] is None
    n = len(data["steps"])
    assert data["steps"][0]["name"] == "accuracy"
    assert data["interrupted"] == f"interrupted by SIGTERM after {n} step{'' if n == 1 else 's'}"
    _no_staging_left(out)


# ------------------------------------------------------------------------------ vit_fast.util.interrupts itself
def test_sigterm_raises_and_is_held_while_files_change():
    # a process started in the background by a non-interactive shell (`cmd &`) inherits SIGINT ignored; handled()
    # installs over the default handler only, which is what this test is about
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _sigterm_then_sigint()
    finally:
        signal.signal(signal.SIGINT, previous)


def _sigterm_then_sigint():
    with interrupts.handled():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        with pytest.raises(interrupts.Terminated):
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # delivered, and held: the block runs to its end
                reached = True
        assert reached
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers it installed are gone again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_someone_else_set_is_kept():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("theirs"))
    try:
        with interrupts.handled():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert seen == ["theirs"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_exit_statuses_and_notes():
    assert interrupts.exit_status(KeyboardInterrupt()) == 130 and interrupts.exit_status(interrupts.Terminated()) == 143
    assert interrupts.cut_note(interrupts.Terminated(), 5, 18, "case") == "interrupted by SIGTERM after 5 of 18 cases"
    assert interrupts.cut_note(KeyboardInterrupt(), 1, None, "check") == "interrupted by SIGINT after 1 check"


def test_an_interrupt_a_library_wrapped_is_found_behind_its_error():
    """interrupt_behind: the KeyboardInterrupt in an error's causes and contexts, or a signal handled's handler took
    while its block is open; nothing for an ordinary error."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as err:
            raise RuntimeError("the exporter could not trace") from err
    except RuntimeError as err:
        assert isinstance(interrupts.interrupt_behind(err), KeyboardInterrupt)
    assert interrupts.interrupt_behind(ValueError("a plain error")) is None
    with interrupts.handled():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # never reached: the handler raises first
        except interrupts.Terminated:
            pass  # a library swallowing it, keeping only its own words
        assert isinstance(interrupts.interrupt_behind(RuntimeError("could not trace")), interrupts.Terminated)
    assert interrupts.interrupt_behind(RuntimeError("after the block")) is None
    with interrupts.handled():  # a new run starts clean
        assert interrupts.interrupt_behind(RuntimeError("nothing happened")) is None


def test_library_text_loses_its_escape_sequences():
    from vit_fast.util.text import plain_text

    coloured = "\x1b[1;31mError:\x1b[0m see \x1b]8;;https://example.org\x07the docs\x1b]8;;\x1b\\ \x1b(Bnow"
    assert plain_text(coloured) == "Error: see the docs now"
    assert plain_text("plain text [1] stays") == "plain text [1] stays"
