"""The fault tests of tests/test_export_faults.py, for the other writers: save_checkpoint, the Triton repository
writer, bench, demo and serve.

A kill (SIGKILL) or a failure at any point leaves the target as it was, byte for byte, plus at most the dead
run's staging folder, which carries the proof that vit-fast made it and which the next run removes; a folder
that only looks like staging is never removed. Every output path is refused before any work (the work is
stubbed to fail loudly, and a control run shows the stub is reached when the path is fine). The demo's
interpreter child dies with the demo and takes its temporary folder with it.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import vit_fast
from vit_fast import files
from vit_fast.cli import main

from .util import skip_if_interpreter_broken, tiny_model


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every path below ``folder`` (staging folders left out) -> its bytes ('dir' / 'special' otherwise)."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(files.STAGING_MARK in part for part in rel.parts):
            continue
        mode = p.lstat().st_mode
        out[str(rel)] = p.read_bytes() if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "special"
    return out


def staging_left(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if files.STAGING_MARK in p.name)


class Reached(Exception):
    """Raised by a stub standing for the long work a refusal must come before."""


def reached(*args, **kwargs):
    raise Reached("the work started")


# --------------------------------------------------------------------------- save_checkpoint
def test_save_checkpoint_never_follows_a_planted_link(tmp_path):
    """The old temporary name was .NAME.tmp-PID: a link planted there was followed. Now nothing predictable is
    opened, and the staging folder is made exclusively (mode 0700)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    planted = tmp_path / f".m.safetensors.tmp-{os.getpid()}"
    planted.symlink_to(victim)
    path = vit_fast.save_checkpoint(tiny_model(), tmp_path / "m.safetensors")
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert planted.is_symlink() and vit_fast.load_checkpoint(path).cfg == tiny_model().cfg
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([planted.name, "m.safetensors", "victim.txt"])


def test_staging_folders_are_unpredictable_and_private(tmp_path):
    a, fa = files.make_staging(tmp_path, "m.pth")
    b, fb = files.make_staging(tmp_path, "m.pth")
    try:
        assert a != b and a.name.startswith(".m.pth.tmp-") and b.name.startswith(".m.pth.tmp-")
        assert {stat.S_IMODE(p.stat().st_mode) for p in (a, b)} == {0o700}
        assert files.is_our_staging(a) and files.clean_stale_staging(tmp_path) == []  # both locks are held
    finally:
        os.close(fa)
        os.close(fb)
    assert sorted(files.clean_stale_staging(tmp_path)) == sorted([a, b])  # their run is "gone": locks free


KILL_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    import vit_fast
    from vit_fast import checkpoints
    from tests.util import tiny_model

    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    checkpoints.publish_to = die  # the new file is complete in its staging folder; killed before the move
    vit_fast.save_checkpoint(tiny_model(seed=1), sys.argv[1])
    print("not killed")
    """
)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_sigkill_while_saving_leaves_the_previous_checkpoint(tmp_path, suffix):
    path = vit_fast.save_checkpoint(tiny_model(), tmp_path / f"m{suffix}")
    (tmp_path / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", KILL_SAVE, str(path)], capture_output=True, text=True, timeout=300, cwd=root
    )
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert snapshot(tmp_path) == before
    (left,) = staging_left(tmp_path)
    assert files.is_our_staging(left)
    vit_fast.save_checkpoint(tiny_model(), path)  # the next save removes the dead run's folder
    assert staging_left(tmp_path) == [] and snapshot(tmp_path) == before  # same weights: same bytes


def test_a_failing_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    from vit_fast import checkpoints

    path = vit_fast.save_checkpoint(tiny_model(), tmp_path / "m.safetensors")
    before = snapshot(tmp_path)
    monkeypatch.setattr(checkpoints, "publish_to", reached)
    with pytest.raises(Reached):
        vit_fast.save_checkpoint(tiny_model(seed=1), path)
    assert snapshot(tmp_path) == before and staging_left(tmp_path) == []


# --------------------------------------------------------------------------- the Triton repository writer
def _entry(name: str, action):
    from vit_fast.export.tritonserver import ModelEntry

    def build(folder: Path):
        (folder / "1").mkdir(parents=True)
        files.write_new(folder / "1" / "model.onnx", b"half written")
        return action()

    return ModelEntry(name, build)


KILL_REPO = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from vit_fast import files
    from vit_fast.export.tritonserver import ModelEntry, write_repository

    def build(folder):
        (folder / "1").mkdir(parents=True)
        files.write_new(folder / "1" / "model.onnx", b"half written")
        os.kill(os.getpid(), signal.SIGKILL)

    write_repository(sys.argv[1], [ModelEntry("vit", build)], progress=False)
    print("not killed")
    """
)


def test_a_killed_repository_write_is_cleaned_by_the_next(tmp_path):
    from vit_fast.export.tritonserver import write_repository

    repo = tmp_path / "repo"
    (repo / "other" / "1").mkdir(parents=True)
    (repo / "other" / "config.pbtxt").write_text('name: "other"\n')
    mine = repo / ".vit-fast-repo.tmp-mine"  # the user's, named like staging: never removed
    mine.mkdir()
    (mine / files.OWNER_FILE).write_text("not a marker")
    before = snapshot(repo)
    proc = subprocess.run([sys.executable, "-c", KILL_REPO, str(repo)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert snapshot(repo) == before
    dead = [p for p in staging_left(repo) if p != mine]
    assert len(dead) == 1 and dead[0].name.startswith(".vit-fast-repo.tmp-") and files.is_our_staging(dead[0])
    # the next run (failing here, in-process) first removes the dead run's folder, then its own
    with pytest.raises(Reached):
        write_repository(repo, [_entry("vit", lambda: reached())], progress=False)
    assert staging_left(repo) == [mine] and snapshot(repo) == before


# --------------------------------------------------------------------------- bench, demo, serve: refused before work
@pytest.fixture
def folder(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "pipe.json")
    (tmp_path / "theirs.json").write_text('{"theirs": 1}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("json_name, refused", [("pipe.json", True), ("theirs.json", True), ("new.json", False)])
def test_bench_checks_json_before_any_work(folder, monkeypatch, capsys, json_name, refused):
    import vit_fast.bench as bench_api  # the command imports its work from here when it runs

    monkeypatch.setattr(bench_api, "run_benchmark", reached)
    monkeypatch.setattr(bench_api, "resolve_device", reached)
    before = snapshot(folder)
    if refused:
        assert main(["bench", "default", "--out", "b", "--json", json_name]) == 1
        assert "error: --json" in capsys.readouterr().err
    else:  # the control: with a fine path the stubbed work is reached
        with pytest.raises(Reached):
            main(["bench", "default", "--out", "b", "--json", json_name])
    assert snapshot(folder) == before


@pytest.mark.parametrize("given, refused", [("report.md", True), ("patches.png", True), (None, False)])
def test_demo_checks_its_files_before_any_step(folder, monkeypatch, capsys, given, refused):
    from vit_fast import demo

    monkeypatch.setattr(demo, "load_default_model", reached)
    (folder / "d").mkdir()
    if given is not None:
        (folder / "d" / given).write_bytes(b"the user's own file")
    before = snapshot(folder)
    if refused:
        assert main(["demo", "--out", "d"]) == 1
        err = capsys.readouterr().err
        assert f"'d/{given}' exists and was not written by vit-fast" in err and "--overwrite" in err
        with pytest.raises(Reached):  # --overwrite lets the run start
            main(["demo", "--out", "d", "--overwrite"])
    else:
        with pytest.raises(Reached):
            main(["demo", "--out", "d"])
    assert snapshot(folder) == before


def test_demo_files_it_wrote_carry_their_own_proof(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    from vit_fast import demo_plots

    png = demo_plots._png(demo_plots._pyplot().figure(figsize=(1, 1)))
    files.write_atomic(tmp_path / "patches.png", png)
    files.write_atomic(tmp_path / "report.md", "# vit-fast demo\n" + files.markdown_mark("0.1.0"))
    (tmp_path / "theirs.png").write_bytes(png.replace(b"vit-fast", b"somebody"))
    assert files.written_by_vit_fast(tmp_path / "patches.png") and files.written_by_vit_fast(tmp_path / "report.md")
    assert not files.written_by_vit_fast(tmp_path / "theirs.png")
    files.check_files_in(tmp_path, ["patches.png", "report.md"], "demo --out")


def test_demo_publishes_its_onnx_only_verified(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    from vit_fast import demo
    from vit_fast.assets import load_default_eval_set, load_default_model
    from vit_fast.export import onnx as onnx_export
    from vit_fast.export import read_metadata
    from vit_fast.progress import Stages

    model = load_default_model(backend="torch")
    images, labels = load_default_eval_set()
    images, labels = images[:6], labels[:6]
    s = demo.DemoSettings(out=tmp_path, exporter="torchscript")
    stages = Stages("test", False)
    real = onnx_export.verify_staged
    # judged against other weights: the staged file cannot pass, so nothing may appear
    other = vit_fast.load_model("default", backend="torch")
    with __import__("torch").no_grad():
        for p in other.parameters():
            p.add_(0.5)
    monkeypatch.setattr(onnx_export, "verify_staged", lambda m, *a: real(other, *a))
    step = demo._guarded("onnx", demo._onnx_step, model, images, labels, s, stages)
    assert step["status"] == "failed" and "VerificationError" in step["summary"], step["summary"]
    assert [p.name for p in tmp_path.iterdir()] == []
    monkeypatch.setattr(onnx_export, "verify_staged", real)
    step = demo._onnx_step(model, images, labels, s, stages)
    assert step["status"] == "ok", step["summary"]
    record = read_metadata(tmp_path / demo.ONNX_NAME)["verification"]
    assert record["passed"] is True and record["seed"] == s.seed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [demo.ONNX_NAME, demo.ONNX_NAME + ".json", demo.ONNX_REPORT]
    )


PARENT = textwrap.dedent(
    """
    import sys, time
    from vit_fast.demo import _InterpreterVerify
    child = _InterpreterVerify(1, 0, 600.0)
    print(child.proc.pid, child.tmp, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("after_s", [0.0, 3.0])  # while the child starts; once its handler is in place
@skip_if_interpreter_broken  # the child's verify would end at once, with the interpreter's fault, not live on
def test_the_demos_child_dies_with_it_and_takes_its_folder(after_s):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        pid, tmp = parent.stdout.readline().split()
        child = int(pid)
        time.sleep(after_s)
        assert Path(tmp).is_dir()
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 60
        while (_alive(child) or Path(tmp).exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the verify child outlived the demo"
        assert not Path(tmp).exists(), f"the child's folder {tmp} was left behind"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


@pytest.mark.parametrize("json_name, refused", [("pipe.json", True), ("theirs.json", True), ("new.json", False)])
def test_serve_checks_json_before_the_server_starts(folder, monkeypatch, capsys, json_name, refused):
    from vit_fast.serve import server

    started: list[str] = []

    class FakeServer:
        def __init__(self, model, name, **kwargs):
            self.name, self.description = name, "fake"
            self.endpoints = SimpleNamespace(http="h", grpc="g", health_url="u", metrics_url="m")

        def check_ports(self):  # the real one binds each port once: nothing to do for a fake
            pass

        def start(self):
            started.append(self.name)
            raise Reached("the server started")

        def stop(self):
            pass

    monkeypatch.setattr(server, "require_serve", lambda: None)  # the serve extra is not installed here
    monkeypatch.setattr(server, "Server", FakeServer)
    before = snapshot(folder)
    if refused:
        assert main(["serve", "default", "--json", json_name]) == 1
        assert "error: --json" in capsys.readouterr().err and started == []
    else:
        with pytest.raises(Reached):
            main(["serve", "default", "--json", json_name])
        assert started == ["default"]
    assert snapshot(folder) == before
