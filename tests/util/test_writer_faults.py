"""The fault tests of tests/export/test_export_faults.py, for the other writers: save_checkpoint, the Triton repository
writer, bench, demo and serve.

A kill (SIGKILL) or a failure at any point leaves the target as it was, byte for byte, plus at most the dead
run's staging folder, which carries the proof that vit-fast made it and which the next run removes; a folder
that only looks like staging is never removed. Every output path is refused before any work (the work is
stubbed to fail loudly, and a control run shows the stub is reached when the path is fine). The demo's
interpreter child dies with the demo and takes its temporary folder with it.
"""

from __future__ import annotations

import json
import os
import re
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
from vit_fast.cli import main
from vit_fast.util import files

from ..fakes import skip_if_interpreter_broken, tiny_model


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
    from vit_fast.interop import checkpoints
    from tests.fakes import tiny_model

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
    root = Path(__file__).resolve().parents[2]
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
    from vit_fast.interop import checkpoints

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
    from vit_fast.util import files
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

    monkeypatch.setattr(demo.report, "load_default_model", reached)
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
    from vit_fast.demo import plots as demo_plots

    png = demo_plots._png(demo_plots._pyplot().figure(figsize=(1, 1)))
    files.write_atomic(tmp_path / "patches.png", png)
    files.write_atomic(tmp_path / "report.md", files.seal_markdown("# vit-fast demo\n", "0.1.0"))
    (tmp_path / "theirs.png").write_bytes(png.replace(b"vit-fast", b"somebody"))
    assert files.written_by_vit_fast(tmp_path / "patches.png") and files.written_by_vit_fast(tmp_path / "report.md")
    assert not files.written_by_vit_fast(tmp_path / "theirs.png")
    files.check_files_in(tmp_path, ["patches.png", "report.md"], "demo --out")


def test_demo_publishes_its_onnx_only_verified(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    from vit_fast import demo
    from vit_fast.assets import load_default_eval_set
    from vit_fast.export import onnx as onnx_export
    from vit_fast.export import read_metadata
    from vit_fast.interop.loading import load_default_model
    from vit_fast.util.progress import Stages

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
    step = demo.base.guarded_step("onnx", demo.steps.onnx_step, model, images, labels, s, stages)
    assert step["status"] == "failed" and "VerificationError" in step["summary"], step["summary"]
    assert [p.name for p in tmp_path.iterdir()] == []
    monkeypatch.setattr(onnx_export, "verify_staged", real)
    step = demo.steps.onnx_step(model, images, labels, s, stages)
    assert step["status"] == "ok", step["summary"]
    record = read_metadata(tmp_path / demo.ONNX_NAME)["verification"]
    assert record["passed"] is True and record["seed"] == s.seed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [demo.ONNX_NAME, demo.ONNX_NAME + ".json", demo.ONNX_REPORT]
    )


PARENT = textwrap.dedent(
    """
    import sys, time
    from vit_fast.demo.interpreter import InterpreterVerify
    child = InterpreterVerify(1, 0, 600.0)
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


# --------------------------------------------------------------------------- ownership held until the publish
# What a check saw before the work is what the publish may replace, and nothing else: a file that appears, is
# edited or is replaced while vit-fast works stays as the user left it, and this run's result is kept beside it.
# Each mechanism runs three ways: with renameat2 (RENAME_NOREPLACE / RENAME_EXCHANGE), without it (a hard link
# then an unlink; a compare then a rename), and without hard links either (an existence check then a rename).
@pytest.fixture(params=["renameat2", "hard links", "neither"])
def rename_mode(request, monkeypatch):
    if request.param != "renameat2":
        monkeypatch.setattr(files.renames, "_renameat2", lambda: None)
    if request.param == "neither":
        import errno

        def no_links(*args, **kwargs):
            raise OSError(errno.EPERM, "this file system has no hard links")

        monkeypatch.setattr(files.renames.os, "link", no_links)
    return request.param


def kept_left(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if files.KEPT_MARK in p.name)


def test_this_machine_has_renameat2():
    """The mechanism the other modes stand in for is the one that runs here (Linux, glibc >= 2.28)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    assert files.renames._renameat2() is not None


def test_a_file_that_appears_after_the_check_is_never_replaced(tmp_path, rename_mode):
    target = tmp_path / "r.json"
    files.check_report_file(target)  # nothing there: the publish must find nothing there either
    target.write_text("the user's report\n")
    with pytest.raises(files.OutputChanged) as info:
        files.write_json_atomic({files.MARKER_KEY: "t", "rows": []}, target)
    assert target.read_text() == "the user's report\n"
    (kept,) = kept_left(tmp_path)
    assert re.fullmatch(r"r\.json\.unpublished-[0-9a-f]{16}", kept.name)
    assert f"'{target}' appeared while vit-fast was working (it did not exist when checked)" in str(info.value)
    assert f"kept in '{kept}'" in str(info.value)
    assert os.listdir(kept) == ["r.json"] and files.written_by_vit_fast(kept / "r.json")
    assert staging_left(tmp_path) == []


@pytest.mark.parametrize("edit", ["appended in place", "replaced by another file", "the same bytes, a new file"])
def test_a_file_changed_after_the_check_is_never_replaced(tmp_path, rename_mode, edit):
    target = files.write_json_atomic({files.MARKER_KEY: "t", "rows": [1]}, tmp_path / "r.json")
    files.check_report_file(target)  # ours, as it is now
    if edit == "appended in place":
        with open(target, "a") as f:
            f.write("\n")
    else:
        other = tmp_path / "other"
        other.write_bytes(target.read_bytes() if edit.startswith("the same") else b'{"mine": 1}\n')
        os.replace(other, target)
    before = target.read_bytes()
    with pytest.raises(files.OutputChanged, match=r"changed while vit-fast was working \(it is not the file checked"):
        files.write_json_atomic({files.MARKER_KEY: "t", "rows": [2]}, target)
    assert target.read_bytes() == before and staging_left(tmp_path) == []
    (kept,) = kept_left(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(["r.json", kept.name])


def test_an_unchanged_file_is_replaced_and_a_removed_one_written_again(tmp_path, rename_mode):
    target = files.write_json_atomic({files.MARKER_KEY: "t", "rows": [1]}, tmp_path / "r.json")
    files.check_report_file(target)
    files.write_json_atomic({files.MARKER_KEY: "t", "rows": [2]}, target)
    files.write_json_atomic({files.MARKER_KEY: "t", "rows": [3]}, target)  # the same run's second write
    assert json.loads(target.read_text())["rows"] == [3]
    files.check_report_file(target)
    target.unlink()  # gone meanwhile: nothing is lost by writing it
    files.write_json_atomic({files.MARKER_KEY: "t", "rows": [4]}, target)
    assert json.loads(target.read_text())["rows"] == [4]
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_a_path_never_checked_is_written_only_when_new_or_provably_ours(tmp_path, rename_mode):
    ours = files.write_json_atomic({files.MARKER_KEY: "t"}, tmp_path / "ours.json")
    files.claims._claims.pop(files.claims._key(ours))  # as if another process had written it
    files.write_json_atomic({files.MARKER_KEY: "t", "again": True}, ours)
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"vit_fast_version": "0.0.1"}\n')  # a marker of old, no digest
    with pytest.raises(files.OutputChanged, match=r"was not checked before the work.*marker but no digest"):
        files.write_atomic(theirs, "{}")
    assert theirs.read_text() == '{"vit_fast_version": "0.0.1"}\n'


def test_overwrite_replaces_what_is_there_at_the_publish(tmp_path, rename_mode):
    """--overwrite is the user's word that the file at the path may go, whatever it is by then."""
    target = tmp_path / "r.json"
    target.write_text("theirs\n")
    files.check_report_file(target, overwrite=True)
    target.write_text("theirs, edited\n")
    files.write_json_atomic({files.MARKER_KEY: "t"}, target)
    assert files.written_by_vit_fast(target) and sorted(os.listdir(tmp_path)) == ["r.json"]


def test_a_failed_set_is_put_back_and_kept(tmp_path, rename_mode):
    """Three targets: the first is new, the second replaced, the third appears meanwhile: the first two are undone
    and the three staged files kept together."""
    (tmp_path / "b").write_bytes(b"b, ours to replace")
    for name in "abc":
        files.claim(tmp_path / name)
    (tmp_path / "c").write_bytes(b"c, the user's")
    before = snapshot(tmp_path)
    with files.staging_dir(tmp_path / "a") as stage:
        for name in "abc":
            files.write_new(stage / name, f"new {name}")
        with pytest.raises(files.OutputChanged, match=r"'.*/c' appeared"):
            files.publish([stage / "a", stage / "b", stage / "c"], tmp_path)
    (kept,) = kept_left(tmp_path)
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith(kept.name)} == before
    assert {p.name: p.read_text() for p in kept.iterdir()} == {n: f"new {n}" for n in "abc"}
    assert staging_left(tmp_path) == []


EXPORT = ["export", "onnx", "default", "--exporter", "torchscript", "--no-verify", "--quiet"]


def _after(monkeypatch, module, name: str, action) -> None:
    """Run ``action`` (the user, meanwhile) right after ``module.name`` returns."""
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        out = real(*args, **kwargs)
        action()
        return out

    monkeypatch.setattr(module, name, wrapped)


@pytest.mark.parametrize("written", [("m.onnx",), ("m.onnx.json",), ("m.onnx", "m.onnx.json")])
def test_files_a_user_writes_during_an_export_are_kept(tmp_path, monkeypatch, capsys, written):
    """`vit-fast export onnx default --out toc/m.onnx`, the user writing toc/m.onnx (and its .json) meanwhile:
    they were replaced, exit 0, no --overwrite. Now they stay; the export is kept beside them, named."""
    from vit_fast.export import onnx as onnx_export

    (tmp_path / "toc").mkdir()
    monkeypatch.chdir(tmp_path)

    def user():
        for name in written:
            (tmp_path / "toc" / name).write_text(f"the user's {name}\n")

    _after(monkeypatch, onnx_export, "finish_graph", user)
    assert main([*EXPORT, "--out", "toc/m.onnx"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Errno" not in err
    assert re.search(
        rf"^vit-fast export onnx: error: 'toc/{re.escape(written[0])}' appeared while vit-fast was working \(it did "
        r"not exist when checked\): it was left as it is, and this run's files were kept in "
        r"'toc/m\.onnx\.unpublished-[0-9a-f]{16}': compare, and move them into place yourself, or remove them$",
        err.strip(),
    ), err
    assert {n: (tmp_path / "toc" / n).read_text() for n in written} == {n: f"the user's {n}\n" for n in written}
    (kept,) = kept_left(tmp_path / "toc")
    assert sorted(os.listdir(kept)) == ["m.onnx", "m.onnx.json"]
    assert vit_fast.export.is_vit_fast_artifact(kept / "m.onnx") and files.written_by_vit_fast(kept / "m.onnx.json")
    assert sorted(os.listdir(tmp_path / "toc")) == sorted([*written, kept.name])


def test_an_earlier_export_edited_during_the_export_stays(tmp_path, monkeypatch, capsys):
    from vit_fast.export import onnx as onnx_export

    monkeypatch.chdir(tmp_path)
    assert main([*EXPORT, "--out", "m.onnx"]) == 0
    meta = tmp_path / "m.onnx.json"
    _after(monkeypatch, onnx_export, "finish_graph", lambda: meta.write_text(meta.read_text() + "\n"))
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert main([*EXPORT, "--out", "m.onnx"]) == 1
    err = capsys.readouterr().err
    assert "'m.onnx.json' changed while vit-fast was working (it is not the file checked before the work)" in err
    kept = kept_left(tmp_path)
    edited = {**before, "m.onnx.json": before["m.onnx.json"] + b"\n"}  # as the user left it
    assert {k: v for k, v in snapshot(tmp_path).items() if files.KEPT_MARK not in k} == edited and len(kept) == 1


def test_an_earlier_export_removed_during_the_export_is_written_again(tmp_path, monkeypatch):
    from vit_fast.export import onnx as onnx_export

    monkeypatch.chdir(tmp_path)
    assert main([*EXPORT, "--out", "m.onnx"]) == 0

    def remove():
        (tmp_path / "m.onnx").unlink()
        (tmp_path / "m.onnx.json").unlink()

    _after(monkeypatch, onnx_export, "finish_graph", remove)
    assert main([*EXPORT, "--out", "m.onnx"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.json"]


def _python_entry_with(monkeypatch, user) -> None:
    """The python entry (no export: quick) of the Triton repository writer, the user acting after it is built."""
    from vit_fast.export.tritonserver import python_backend

    real = python_backend.python_entry

    def entry(*args, **kwargs):
        made = real(*args, **kwargs)
        build = made.build

        def build_then_user(folder):
            config = build(folder)
            user()
            return config

        made.build = build_then_user
        return made

    monkeypatch.setattr(python_backend, "python_entry", entry)


REPO = ["export", "tritonserver", "default", "--out", "repoT", "--name", "default", "--entries", "python", "--quiet"]


def test_a_model_folder_added_while_the_repository_stages_is_kept(tmp_path, monkeypatch, capsys):
    """`vit-fast export tritonserver default --out repoT`, the user adding repoT/default/2/... meanwhile: the whole
    repoT/default was moved away and deleted without --force. Now it stays, and nothing is published."""
    monkeypatch.chdir(tmp_path)

    def user():
        (tmp_path / "repoT" / "default_python" / "2").mkdir(parents=True)
        (tmp_path / "repoT" / "default_python" / "2" / "model.py").write_text("the user's version 2\n")

    _python_entry_with(monkeypatch, user)
    assert main(REPO) == 1
    err = capsys.readouterr().err
    assert re.search(
        r"^vit-fast export tritonserver: error: 'repoT/default_python' appeared while vit-fast was working \(it did "
        r"not exist when checked\): it was left as it is, and this run's folders were removed$",
        err.strip(),
    ), err
    assert snapshot(tmp_path / "repoT") == {
        "default_python": "dir",
        "default_python/2": "dir",
        "default_python/2/model.py": b"the user's version 2\n",
    }
    assert staging_left(tmp_path / "repoT") == []


@pytest.mark.parametrize("where", ["a new version folder", "a file edited deep inside"])
def test_a_forced_model_folder_that_changes_while_staging_is_kept(tmp_path, monkeypatch, capsys, rename_mode, where):
    """--force replaces the model folder as it was checked; one that changes meanwhile is never moved away."""
    from vit_fast.export.tritonserver import python_backend

    monkeypatch.chdir(tmp_path)
    assert main(REPO) == 0
    folder = tmp_path / "repoT" / "default_python"
    weights = folder / "1" / python_backend.WEIGHTS

    def user():
        if where == "a new version folder":
            (folder / "2").mkdir()
            (folder / "2" / "notes.txt").write_text("mine\n")
        else:
            with open(weights, "ab") as f:
                f.write(b"\0")

    real = python_backend.python_entry
    _python_entry_with(monkeypatch, user)
    capsys.readouterr()
    assert main([*REPO, "--force"]) == 1
    err = capsys.readouterr().err
    assert "'repoT/default_python' changed while vit-fast was working (it is not the folder checked" in err
    if where == "a new version folder":
        assert (folder / "2" / "notes.txt").read_text() == "mine\n"
    else:
        assert weights.read_bytes().endswith(b"\0")
    assert staging_left(tmp_path / "repoT") == []
    monkeypatch.setattr(python_backend, "python_entry", real)  # the user done: --force replaces only vit-fast's files
    if where == "a new version folder":  # the user's 2/ is kept (issue 46), vit-fast's files replaced
        assert main([*REPO, "--force"]) == 0
        assert sorted(os.listdir(folder)) == ["1", "2", "config.pbtxt", "verification.json", "vit-fast-files.json"]
        assert (folder / "2" / "notes.txt").read_text() == "mine\n"
    else:  # vit-fast's weights edited by the user are theirs now: never replaced, named
        capsys.readouterr()
        assert main([*REPO, "--force"]) == 1
        assert "holds '1/model.safetensors' (changed since vit-fast wrote it) where vit-fast writes" in (
            capsys.readouterr().err
        )
        assert weights.read_bytes().endswith(b"\0")
    assert staging_left(tmp_path / "repoT") == []


def test_folders_publish_only_over_what_was_claimed(tmp_path, rename_mode):
    """publish_folders itself: a folder that appeared is never replaced; one claimed and unchanged is, and the
    folder it replaced is handed back inside the staging folder."""
    target = tmp_path / "m"
    files.claim_folder(target)
    with files.staging_dir(target) as stage:
        (stage / "m").mkdir()
        (stage / "m" / "new").write_text("ours")
        (target / "2").mkdir(parents=True)
        (target / "2" / "x").write_text("theirs")
        with pytest.raises(files.OutputChanged, match=r"'.*/m' appeared while vit-fast was working"):
            files.publish_folders([(stage / "m", target)])
        assert (target / "2" / "x").read_text() == "theirs" and (stage / "m" / "new").is_file()
        files.claim_folder(target)
        (replaced,) = files.publish_folders([(stage / "m", target)])
        assert os.listdir(target) == ["new"] and replaced.parent == stage
        assert (replaced / "2" / "x").read_text() == "theirs"
    assert os.listdir(tmp_path) == ["m"]


# --------------------------------------------------------------------------- the proof a file carries: its digest
def _png(software: str | None = None) -> bytes:
    """A 1x1 grey PNG made by hand (no matplotlib needed), with a Software text chunk when given."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    text = [chunk(b"tEXt", b"Software\0" + software.encode())] if software else []
    ihdr = chunk(b"IHDR", (1).to_bytes(4, "big") * 2 + bytes([8, 0, 0, 0, 0]))
    idat = chunk(b"IDAT", zlib.compress(b"\0\x80"))
    return b"\x89PNG\r\n\x1a\n" + ihdr + b"".join(text) + idat + chunk(b"IEND", b"")


def test_reports_prove_themselves_by_their_digest_not_their_marker(tmp_path):
    """A report a user annotated, marker kept, was replaced silently: "written by vit-fast" now means its bytes
    are the ones vit-fast wrote. Files of an older vit-fast (a marker, no digest) prove nothing either."""
    ours = {
        "r.json": files.json_text({files.MARKER_KEY: "0.2", "rows": [1], "nested": {files.DIGEST_KEY: "f" * 64}}),
        "r.md": files.seal_markdown("# report\n\nall passed\n", "0.2"),
        "p.png": files.seal_png(_png("vit-fast 0.2")),
    }
    for name, data in ours.items():
        files.write_atomic(tmp_path / name, data)
        assert files.written_by_vit_fast(tmp_path / name), name
        (tmp_path / f"copy-{name}").write_bytes((tmp_path / name).read_bytes())  # the proof travels with the bytes
        assert files.written_by_vit_fast(tmp_path / f"copy-{name}"), name
    reloaded = json.loads(ours["r.json"])
    annotated = {
        "r.json": json.dumps({**reloaded, "note": "checked by hand"}, indent=2, sort_keys=True) + "\n",
        "r.json (spaces)": ours["r.json"].replace('  "rows"', '   "rows"'),
        "r.md": ours["r.md"].replace("all passed\n", "all passed\nexcept on Tuesdays\n"),
        "p.png": ours["p.png"].replace(b"vit-fast 0.2", b"vit-fast 0.3"),
    }
    old = {
        "r.json": json.dumps({files.MARKER_KEY: "0.1", "rows": [1]}, indent=2) + "\n",
        "r.md": "# report\n<!-- written by vit-fast 0.1 -->\n",
        "p.png": _png("vit-fast 0.1"),
    }
    for kind, versions in (("no longer match", annotated), ("marker but no digest", old)):
        for name, data in versions.items():
            path = tmp_path / f"{kind}-{name.split()[0]}"
            path.write_bytes(data.encode() if isinstance(data, str) else data)
            assert not files.written_by_vit_fast(path), (kind, name)
            assert kind in files.ownership_note(path), (name, files.ownership_note(path))
    with pytest.raises(ValueError, match=r"is not provably vit-fast.s as written \(.*no longer match.*--overwrite"):
        files.check_report_file(tmp_path / "no longer match-r.json")
    resealed = files.json_text(reloaded)  # a record read back and written again gets a fresh digest
    assert json.loads(resealed)[files.DIGEST_KEY] == reloaded[files.DIGEST_KEY]
    assert files.json_text([1, 2]) == "[\n  1,\n  2\n]\n"  # only an object can carry the field


def test_a_verify_report_a_user_annotated_is_refused_by_the_cli(tmp_path, monkeypatch, capsys):
    import importlib

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(importlib.import_module("vit_fast.export.verify"), "verify", reached)
    report = files.write_json_atomic({files.MARKER_KEY: "0.2", "artifact": "triton", "rows": []}, tmp_path / "v.json")
    with pytest.raises(Reached):  # unchanged: ours, the run starts
        main(["verify", "default", "triton", "--json", "v.json"])
    data = json.loads(report.read_text())
    report.write_text(json.dumps({**data, "my note": "seen on the H100 too"}, indent=2) + "\n")
    before = snapshot(tmp_path)
    assert main(["verify", "default", "triton", "--json", "v.json"]) == 1
    err = capsys.readouterr().err
    assert re.search(
        r"--json 'v.json' exists and is not provably vit-fast's as written \(it carries vit-fast's digest, but its "
        r"bytes no longer match it \(edited since vit-fast wrote it\)\); refusing to replace it.*--overwrite",
        err,
    ), err
    assert snapshot(tmp_path) == before
