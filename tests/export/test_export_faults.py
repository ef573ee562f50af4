"""Publish only what passed: an export killed or failing at any point leaves its target folder as it was.

The kill tests run an export in a subprocess that SIGKILLs itself at one point (after tracing, while
writing, while verifying): the folder then holds exactly the files it held before, byte for byte, plus
the dead run's staging folder, which the next run's cleaning removes. The same points fail by exception
in-process, a full disk (a 1 MiB tmpfs) and a read-only mount are tried where mount is permitted, and
every output path is refused before any work when it would replace a file vit-fast did not write.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("onnx", reason="the onnx extra is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

import onnx  # noqa: E402

import vit_fast  # noqa: E402
from vit_fast import export
from vit_fast.export import onnx as onnx_export  # noqa: E402
from vit_fast.export import runners  # noqa: E402
from vit_fast.util import files  # noqa: E402

from ..fakes import (
    fail_replace_onto,  # noqa: E402
    tiny_model,  # noqa: E402
)

QUIET = dict(batch=(1, 4), exporter="torchscript", progress=False)
VERIFY = export.VerifyOptions(print_table=False, seed=0)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (staging folders left out) -> its bytes."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and not any(files.STAGING_MARK in part for part in rel.parts):
            out[str(rel)] = p.read_bytes()
    return out


def staging_left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if files.STAGING_MARK in p.name)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[Path, Path]:
    """A checkpoint and a verified ONNX export of it, with its report: (checkpoint, folder holding them)."""
    folder = tmp_path_factory.mktemp("good")
    ckpt = vit_fast.save_checkpoint(tiny_model(), folder / "m.safetensors")
    export.to_onnx(tiny_model(), folder / "m.onnx", verify=VERIFY, report=folder / "m.report.json", **QUIET)
    return ckpt, folder


@pytest.fixture
def previous(good, tmp_path) -> Path:
    """A folder holding an earlier good export (artifact, metadata, report) and an unrelated file."""
    ckpt, folder = good
    for name in ("m.onnx", "m.onnx.json", "m.report.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "notes.txt").write_text("mine\n")
    return tmp_path


# --------------------------------------------------------------------------- SIGKILL at three points
KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import onnx
    import vit_fast
    from vit_fast import export
    from vit_fast.export import onnx as onnx_export, runners

    ckpt, out, point = sys.argv[1:4]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "tracing":  # the exporter has written its file into the staging folder; then the kill
        real = onnx_export._run_exporter
        onnx_export._run_exporter = lambda *a, **k: (real(*a, **k), die())
    elif point == "writing":  # our file is saved in the staging folder, its metadata not yet
        onnx.checker.check_model = lambda *a, **k: die()
    elif point == "verifying":  # ONNX Runtime runs the staged file
        runners.OrtRunner.run_all = lambda self, x: die()
    model = vit_fast.load_checkpoint(ckpt, backend="torch")
    export.to_onnx(model, out, batch=(1, 4), exporter="torchscript", progress=False, report=out + ".report.json",
                   verify=export.VerifyOptions(print_table=False, seed=0))
    print("not killed")
    """
)


@pytest.mark.parametrize("point", ["tracing", "writing", "verifying"])
def test_sigkill_leaves_the_target_as_it_was(good, previous, point):
    ckpt, _ = good
    before = snapshot(previous)
    out = previous / "m.onnx"
    # the report goes to m.onnx.report.json: a new name, which must not appear either
    proc = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(ckpt), str(out), point], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert snapshot(previous) == before  # byte for byte: the previous artifact, its metadata, the rest
    left = staging_left(previous)
    assert left and all(name.startswith(".m.onnx.tmp-") for name in left), left  # what SIGKILL cannot clean
    # the next run cleans the dead run's staging folder at once (its lock died with it)
    removed = files.clean_stale_staging(previous, "m.onnx")
    assert sorted(p.name for p in removed) == left
    assert staging_left(previous) == [] and snapshot(previous) == before


def test_a_live_runs_staging_folder_is_not_cleaned(tmp_path):
    with files.staging_dir(tmp_path / "m.onnx") as stage:
        (stage / "m.onnx").write_bytes(b"half")
        assert files.clean_stale_staging(tmp_path, "m.onnx") == []
        assert stage.is_dir()
    assert not stage.exists()


# --------------------------------------------------------------------------- the same points, by exception
def _fail(*args, **kwargs):
    raise RuntimeError("injected failure")


@pytest.mark.parametrize(
    "target, attr",
    [
        (onnx_export, "_run_exporter"),  # tracing
        (onnx.checker, "check_model"),  # writing
        (runners.OrtRunner, "run_all"),  # verifying
        (onnx_export, "write_metadata"),  # recording the verification
    ],
)
def test_failure_leaves_the_target_as_it_was(previous, monkeypatch, target, attr):
    before = snapshot(previous)
    monkeypatch.setattr(target, attr, _fail)
    with pytest.raises((RuntimeError, export.ExportError), match="injected failure"):
        export.to_onnx(tiny_model(), previous / "m.onnx", verify=VERIFY, report=previous / "m.report.json", **QUIET)
    assert snapshot(previous) == before and staging_left(previous) == []


def test_failed_verification_publishes_nothing(previous, monkeypatch):
    before = snapshot(previous)
    real = onnx_export.verify_staged
    # judged against other weights of the same architecture: the staged file cannot pass
    monkeypatch.setattr(onnx_export, "verify_staged", lambda model, *a: real(tiny_model(seed=1), *a))
    with pytest.raises(export.VerificationError, match=r"m.onnx' failed: worst is output 'logits'.*seed=0"):
        export.to_onnx(tiny_model(), previous / "m.onnx", verify=VERIFY, report=previous / "r.json", **QUIET)
    assert snapshot(previous) == before and staging_left(previous) == []


def test_a_failing_move_puts_the_previous_files_back(previous, monkeypatch):
    before = snapshot(previous)
    fail_replace_onto(monkeypatch, "m.report.json", files.STAGING_MARK)
    with pytest.raises(OSError, match="No space left"):
        export.to_onnx(tiny_model(), previous / "m.onnx", verify=VERIFY, report=previous / "m.report.json", **QUIET)
    # m.onnx and m.onnx.json had been replaced when the report's move failed: they are the previous ones again
    assert snapshot(previous) == before and staging_left(previous) == []


def test_a_verified_reexport_replaces_the_previous_artifact(previous):
    (previous / "m.onnx").write_bytes((previous / "m.onnx").read_bytes())  # the same previous export
    export.to_onnx(tiny_model(), previous / "m.onnx", verify=VERIFY, report=previous / "m.report.json", **QUIET)
    meta = export.read_metadata(previous / "m.onnx")
    assert meta["verification"]["passed"] and meta["verification"]["seed"] == 0
    assert (previous / "notes.txt").read_text() == "mine\n" and staging_left(previous) == []


# --------------------------------------------------------------------------- refused before any work
@pytest.fixture
def never_traced(monkeypatch):
    monkeypatch.setattr(onnx_export, "_run_exporter", _fail)  # a refusal must come before this


@pytest.mark.parametrize(
    "out, report, match",
    [
        ("notes.txt", None, r"ONNX file '.*notes.txt' has the wrong suffix '.txt'.*\.onnx"),
        ("m.onnx", "m.report.txt", r"report '.*m.report.txt' has the wrong suffix"),
        ("notes.onnx", None, r"ONNX file '.*notes.onnx' exists and was not written by vit-fast.*overwrite=True"),
        ("j.onnx", None, r"metadata of ONNX file '.*j.onnx' goes to '.*j.onnx.json', which is a folder"),
        ("k.onnx", None, r"metadata of ONNX file '.*k.onnx' goes to '.*k.onnx.json', which exists and was not"),
        ("m.onnx", "afile/r.json", r"report '.*afile/r.json': '.*afile' is a file, not a folder"),
        ("m.onnx", "notes.json", r"report '.*notes.json' exists and was not written by vit-fast"),
        ("sub", None, r"ONNX file '.*sub' is a folder"),
        ("missing/m.onnx", None, r"output folder '.*missing' for ONNX file .* does not exist: create it first"),
    ],
)
def test_output_paths_are_refused_up_front(previous, never_traced, out, report, match):
    (previous / "notes.onnx").write_bytes(b"someone's model")
    (previous / "notes.json").write_text('{"theirs": 1}')
    (previous / "j.onnx").write_bytes((previous / "m.onnx").read_bytes())
    (previous / "j.onnx.json").mkdir()
    (previous / "k.onnx.json").write_text("their notes")
    (previous / "afile").write_text("a file")
    (previous / "sub").mkdir()
    before = snapshot(previous)
    with pytest.raises(ValueError, match=match) as info:
        export.to_onnx(
            tiny_model(),
            previous / out,
            verify=VERIFY,
            report=None if report is None else previous / report,
            **QUIET,
        )
    assert "mkdir -p" not in str(info.value) or "does not exist" in str(info.value)
    assert snapshot(previous) == before and staging_left(previous) == []


def test_overwrite_allows_replacing_a_foreign_file(previous):
    (previous / "notes.onnx").write_bytes(b"someone's model")
    export.to_onnx(tiny_model(), previous / "notes.onnx", verify=VERIFY, overwrite=True, **QUIET)
    assert export.is_vit_fast_artifact(previous / "notes.onnx")


def test_an_artifact_without_its_json_is_still_ours(previous):
    """The ONNX file's own metadata_props say it is vit-fast's: a re-export may replace it."""
    (previous / "m.onnx.json").unlink()
    assert export.is_vit_fast_artifact(previous / "m.onnx")
    export.check_artifact_outputs(previous / "m.onnx", "onnx")


def test_unwritable_folder_is_refused(previous, never_traced, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.checks.tempfile, "mkstemp", denied)  # root ignores chmod: the probe is what is refused
    with pytest.raises(ValueError, match=r"output folder '.*' for ONNX file .* cannot be written: Permission denied"):
        export.to_onnx(tiny_model(), previous / "m.onnx", **QUIET)


def test_engine_and_report_paths_are_checked_too(previous):
    with pytest.raises(ValueError, match=r"TensorRT engine '.*m.onnx' has the wrong suffix.*\.plan/\.engine/\.trt"):
        export.check_artifact_outputs(previous / "m.onnx", "engine")
    with pytest.raises(ValueError, match=r"TensorRT engine '.*notes.txt' has the wrong suffix"):
        export.to_tensorrt(previous / "m.onnx", previous / "notes.txt", batch=(1, 2, 4))
    with pytest.raises(ValueError, match=r"report '.*notes.txt' has the wrong suffix"):
        export.verify(tiny_model(), previous / "m.onnx", json_path=previous / "notes.txt")
    with pytest.raises(ValueError, match=r"report '.*afile/v.json': '.*afile' is a file"):
        (previous / "afile").write_text("x")
        export.verify(tiny_model(), previous / "m.onnx", json_path=previous / "afile" / "v.json")
    assert json.loads((previous / "m.report.json").read_text())["passed"]


# --------------------------------------------------------------------------- a full disk and a read-only folder
@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size: str):
    folder.mkdir()
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; this test runs as an ordinary user")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {proc.stderr.decode().strip() or proc.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_full_disk_leaves_the_previous_artifact(good, tmp_path):
    _, folder = good
    with mounted_tmpfs(tmp_path / "disk", "1M") as disk:
        for name in ("m.onnx", "m.onnx.json"):
            (disk / name).write_bytes((folder / name).read_bytes())
        # fill the disk to within 40 KiB: a new export's staged file cannot be written
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(b"\0" * max(0, free - 40 * 1024))
        before = snapshot(disk)
        with pytest.raises((OSError, export.ExportError), match="No space left on device"):
            export.to_onnx(tiny_model(), disk / "m.onnx", verify=VERIFY, **QUIET)
        assert snapshot(disk) == before and staging_left(disk) == []


def test_read_only_folder_is_refused_up_front(good, tmp_path):
    _, folder = good
    with mounted_tmpfs(tmp_path / "ro", "1M") as ro:
        (ro / "m.onnx").write_bytes((folder / "m.onnx").read_bytes())
        proc = subprocess.run(["mount", "-o", "remount,ro", str(ro)], capture_output=True)
        if proc.returncode != 0:
            pytest.skip(f"remounting read-only is not permitted here: {proc.stderr.decode().strip()}")
        before = snapshot(ro)
        with pytest.raises(ValueError, match=r"output folder '.*ro' for ONNX file .* cannot be written: Read-only"):
            export.to_onnx(tiny_model(), ro / "m.onnx", **QUIET)
        assert snapshot(ro) == before
