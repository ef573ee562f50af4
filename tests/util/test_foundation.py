"""The shared leaf modules every layer uses: dtypes, files, numerics, env (the recorded commit)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_fast.backend import env
from vit_fast.util import dtypes, files, numerics

from ..fakes import fail_replace_onto


# --------------------------------------------------------------------------- dtypes
def test_dtype_spellings_map_to_one_name():
    for text in ("fp16", "FP16", "float16", "half", "torch.float16"):
        assert dtypes.parse_dtype(text) is torch.float16
        assert dtypes.dtype_name(text) == "fp16"
    assert dtypes.parse_dtype(torch.bfloat16) is torch.bfloat16
    assert dtypes.parse_dtype_list("bf16, float16,bf16") == ["bf16", "fp16"]
    with pytest.raises(ValueError, match=r"dtype must be one of fp32, fp16 or bf16"):
        dtypes.parse_dtype("int8")
    with pytest.raises(ValueError, match=r"unknown dtype 'fp8' in 'bf16,fp8': choose from fp32, fp16, bf16"):
        dtypes.parse_dtype_list("bf16,fp8")


# --------------------------------------------------------------------------- files
def test_write_atomic_leaves_no_temporaries_and_ordinary_permissions(tmp_path):
    path = files.write_atomic(tmp_path / "sub" / "r.json", "{}")
    files.write_atomic(path, b"[1]")
    assert path.read_bytes() == b"[1]"
    assert sorted(os.listdir(path.parent)) == ["r.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_publish_rolls_back_what_it_moved(tmp_path):
    staged = tmp_path / "stage"
    staged.mkdir()
    (staged / "a").write_text("a")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FileNotFoundError):
        files.publish([staged / "a", staged / "missing"], dest)
    assert os.listdir(dest) == []


def test_staging_dir_is_removed_and_folders_it_did_not_make_are_left_alone(tmp_path):
    """Cleaning goes by proof (a marker holding the folder's own token, and a free lock), never by name or age:
    a user's folder that merely looks like staging, even an old one with an unlocked ``.owner``, is kept."""
    target = tmp_path / "m.onnx"
    old = tmp_path / f".m.onnx{files.STAGING_MARK}dead"
    old.mkdir()
    os.utime(old, (0, 0))  # looks like a run killed long ago: not proof
    owner = tmp_path / f".m.onnx{files.STAGING_MARK}0123456789abcdef"
    owner.mkdir()
    (owner / files.OWNER_FILE).write_text("my own file")  # an unlocked .owner that is not our marker
    backup = tmp_path / ".m.onnx.tmp-backup"
    backup.mkdir()
    with files.staging_dir(target) as stage:
        assert stage.is_dir() and stage.parent == tmp_path
        assert stat.S_IMODE(stage.stat().st_mode) == 0o700 and files.is_our_staging(stage)
        (stage / "x").write_text("x")
    assert not stage.exists() and old.exists() and owner.exists() and backup.exists()
    assert (owner / files.OWNER_FILE).read_text() == "my own file"


def test_staging_names_fit_name_max_for_a_250_character_target(tmp_path):
    target = tmp_path / ("n" * 245 + ".json")
    files.check_output_file(target, (".json",), "report")  # the probe name no longer grows with the target's
    files.write_json_atomic({files.MARKER_KEY: "t"}, target)
    assert files.written_by_vit_fast(target) and os.listdir(tmp_path) == [target.name]


def test_publish_puts_previous_files_back_when_a_later_move_fails(tmp_path, monkeypatch):
    (tmp_path / "a").write_text("old a")
    (tmp_path / "b").write_text("old b")
    for name in ("a", "b"):  # the check before the work: these two may be replaced
        files.claim(tmp_path / name)
    with files.staging_dir(tmp_path / "a") as stage:
        for name in ("a", "b", "c"):
            (stage / name).write_text(f"new {name}")
        fail_replace_onto(monkeypatch, "/c", files.STAGING_MARK)
        with pytest.raises(OSError, match="No space left"):
            files.publish([stage / "a", stage / "b", stage / "c"], tmp_path)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a": "old a", "b": "old b"}


def test_a_dead_runs_staging_folder_is_cleaned_at_once(tmp_path):
    """The run's lock dies with its process (here: the process that made it exits without cleaning)."""
    code = (
        "import os, sys; from vit_fast.util import files; "
        "cm = files.staging_dir(sys.argv[1]); cm.__enter__(); os._exit(0)"  # exit without leaving the context
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.onnx")], check=True)
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(f".m.onnx{files.STAGING_MARK}") and (left / files.OWNER_FILE).is_file()
    # another target's run cleans it too: the lock says its run is gone
    assert files.clean_stale_staging(tmp_path, "other.json") == [left] and not left.exists()


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("r.txt", {}, r"report '.*r.txt' has the wrong suffix '.txt': a report is written as .json"),
        ("dir.json", {}, r"report '.*dir.json' is a folder"),
        ("theirs.json", {}, r"report '.*theirs.json' exists and was not written by vit-fast.*overwrite=True"),
        ("afile/r.json", {"make_parents": True}, r"'.*afile' is a file, not a folder"),
        ("new/r.json", {}, r"output folder '.*new' for report '.*r.json' does not exist: create it first"),
    ],
)
def test_check_output_file_refuses(tmp_path, name, kwargs, match):
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "theirs.json").write_text('{"a": 1}')
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=match) as info:
        files.check_output_file(tmp_path / name, (".json",), "report", **kwargs)
    assert ("mkdir -p" in str(info.value)) == ("does not exist" in str(info.value))


def test_check_output_file_accepts(tmp_path):
    files.write_json_atomic({files.MARKER_KEY: "0.1", "x": 1}, tmp_path / "ours.json")
    (tmp_path / "theirs.json").write_text("[]")
    assert files.written_by_vit_fast(tmp_path / "ours.json") and not files.written_by_vit_fast(tmp_path / "theirs.json")
    assert files.check_output_file(tmp_path / "ours.json", (".json",), "report") == tmp_path / "ours.json"
    files.check_output_file(tmp_path / "theirs.json", (".json",), "report", overwrite=True)
    files.check_output_file(tmp_path / "NEW.JSON", (".json",), "report")  # suffixes compare case-insensitively
    files.check_output_file(tmp_path / "a" / "b" / "r.json", (".json",), "report", make_parents=True)
    assert not (tmp_path / "a").exists()  # checked, not made
    with pytest.raises(ValueError, match=r"is a file, not a folder"):
        files.check_output_dir(tmp_path / "ours.json")
    assert files.check_output_dir(tmp_path / "out" / "deeper") == tmp_path / "out" / "deeper"


# --------------------------------------------------------------------------- numerics
def test_rule_passes_within_twice_eager_and_fails_beyond():
    ref = torch.randn(4, 10, dtype=torch.float64)
    eager = (ref + 1e-3).float()
    ok = (ref + 2.0e-3).float()
    bad = (ref + 5e-3).float()
    assert numerics.compare(ok, eager, ref, torch.float32)["passed"]
    row = numerics.compare(bad, eager, ref, torch.float32)
    assert not row["passed"] and row["bound"] == pytest.approx(2e-3 + 1e-5 * numerics.scale_of(ref), rel=1e-3)
    with pytest.raises(AssertionError, match=r"> 2.0x eager"):
        numerics.assert_within_eager(bad, eager, ref)
    nan = ok.clone()
    nan[0, 0] = float("nan")
    assert numerics.compare(nan, eager, ref, torch.float32)["max_abs_err"] == float("inf")


# --------------------------------------------------------------------------- env
def test_git_commit_is_best_effort(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    monkeypatch.delenv("VIT_FAST_COMMIT", raising=False)
    from vit_fast import __version__

    assert env.git_commit() == f"vit-fast {__version__}"
    monkeypatch.setenv("VIT_FAST_COMMIT", "abc123")  # a copied tree without .git, e.g. on a GPU machine
    assert env.git_commit() == "abc123"


def test_git_commit_in_this_checkout_is_its_head(monkeypatch):
    """The tests run from vit-fast's own checkout (an editable install): its HEAD is recorded, not the fallback."""
    monkeypatch.delenv("VIT_FAST_COMMIT", raising=False)
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout: the tests run from a copied tree")
    assert env.SOURCE_ROOT == root
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert env.git_commit().removesuffix("+dirty") == head


def test_git_commit_never_records_another_repository(tmp_path, monkeypatch):
    """vit-fast installed inside a user's own repository (a .venv in their project): the user's
    HEAD must not be recorded as vit-fast's commit."""
    user = tmp_path / "user-project"
    site = user / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    run = ["git", "-C", str(user)]
    subprocess.run([*run, "init", "-q"], check=True)
    (user / "x").write_text("x")
    subprocess.run([*run, "add", "x"], check=True)
    subprocess.run([*run, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-qm", "x"], check=True)
    user_head = subprocess.run([*run, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    monkeypatch.delenv("VIT_FAST_COMMIT", raising=False)
    monkeypatch.setattr(env, "SOURCE_ROOT", site)
    assert user_head not in env.git_commit()
    # the user's repository has a pyproject, but not vit-fast's: still not ours
    (user / "pyproject.toml").write_text('[project]\nname = "their-app"\n')
    monkeypatch.setattr(env, "SOURCE_ROOT", user)
    assert user_head not in env.git_commit()


def test_environment_records_what_a_result_needs():
    rec = env.collect_environment(torch.device("cpu"))
    for key in ("device_name", "driver_version", "torch", "triton", "onnxruntime", "git_commit", "torch_threads"):
        assert key in rec


def test_a_manifest_tells_vit_fasts_files_from_everyone_elses(tmp_path):
    """foreign_entries: a file is vit-fast's only while the sealed manifest holds its digest; a folder with nothing
    of vit-fast's is one entry; links and files the manifest does not list are someone else's."""
    from vit_fast.util.files import MANIFEST_NAME, foreign_entries, link_entries, write_manifest

    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"ours")
    (folder / "config.pbtxt").write_text("ours\n")
    write_manifest(folder, "test")
    assert foreign_entries(folder) == []
    (folder / "2" / "deep").mkdir(parents=True)
    (folder / "2" / "deep" / "x").write_text("theirs")
    (folder / "1" / "labels.txt").write_text("theirs")
    (folder / "link").symlink_to("config.pbtxt")
    (folder / "config.pbtxt").write_text("edited\n")
    assert foreign_entries(folder) == [
        ("1/labels.txt", "not written by vit-fast"),
        ("2/", "not written by vit-fast"),
        ("config.pbtxt", "changed since vit-fast wrote it"),
        ("link", "not written by vit-fast"),
    ]
    target = tmp_path / "new"
    target.mkdir()
    link_entries(folder, target, ["2/", "link"])
    assert os.stat(target / "2" / "deep" / "x").st_ino == os.stat(folder / "2" / "deep" / "x").st_ino
    assert os.readlink(target / "link") == "config.pbtxt"
    (folder / MANIFEST_NAME).write_text((folder / MANIFEST_NAME).read_text().replace("test", "tset"))  # not sealed
    assert ("config.pbtxt", "not written by vit-fast") in foreign_entries(folder)
