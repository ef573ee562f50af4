"""The catalogue of bad inputs and faults a user can cause, through the API and the CLI.

Every case asserts the error's type (or the exit code), that the message names the problem AND
the fix, that no traceback reaches a CLI user, and that the folder the command ran in is exactly
as before (no file made, changed or deleted). Kill and disk faults during an export are in
tests/export/test_export_faults.py; this file is about what is refused before or instead of work.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import vit_fast
from vit_fast import VisionTransformer, ViTConfig
from vit_fast.cli import main

from ..fakes import skip_if_interpreter_broken

TINY = dict(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)


def _tiny() -> VisionTransformer:
    return VisionTransformer(ViTConfig(**TINY), backend="torch").eval()


def _snapshot(folder: Path) -> dict[str, str]:
    """Every path below ``folder`` with a hash of its bytes (folders as 'dir')."""
    out = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# --------------------------------------------------------------------------- API
# id -> (call, exception type, regex naming the problem, regex naming the fix)
API: dict[str, tuple[Callable[[], object], type[BaseException], str, str]] = {
    # configuration
    "config bool as string": (lambda: ViTConfig(qkv_bias="no"), ValueError, r"qkv_bias .*got 'no'", r"True or False"),
    "config zero-unit MLP": (lambda: ViTConfig(mlp_ratio=0.001), ValueError, r"0 hidden units", r"mlp_ratio >= "),
    "config ratio as string": (lambda: ViTConfig(mlp_ratio="4"), ValueError, r"mlp_ratio .*'4' \(str\)", r"a number"),
    "config float classes": (lambda: ViTConfig(num_classes=10.0), ValueError, r"num_classes .*10.0", r"an int >= 0"),
    "config heads": (
        lambda: ViTConfig(embed_dim=100, num_heads=3),
        ValueError,
        r"not divisible by num_heads",
        r"head_dim",
    ),
    "config size": (lambda: ViTConfig(img_size=225), ValueError, r"225x225 is not divisible", r"e\.g\. 224x224"),
    "config pool": (lambda: ViTConfig(global_pool="max"), ValueError, r"global_pool .*'max'", r"one of"),
    "config token pool": (
        lambda: ViTConfig(class_token=False),
        ValueError,
        r"needs a class token",
        r"global_pool='avg'",
    ),
    "config act": (lambda: ViTConfig(act="relu"), ValueError, r"act .*'relu'", r"one of"),
    "config depth": (lambda: ViTConfig(depth=0), ValueError, r"depth .*got 0", r"an int >= 1"),
    "config eps": (lambda: ViTConfig(layer_norm_eps=0.0), ValueError, r"layer_norm_eps", r"a number > 0"),
    "config layerscale": (lambda: ViTConfig(init_values=-1.0), ValueError, r"init_values", r"None .* or a number > 0"),
    "config float patch": (lambda: ViTConfig(patch_size=16.0), ValueError, r"patch_size .*16.0", r"an int >= 1"),
    "config fc_norm": (lambda: ViTConfig(fc_norm="yes"), ValueError, r"fc_norm", r"True, False or None"),
    "config unknown field": (lambda: ViTConfig.from_dict({"hidden_size": 3}), ValueError, r"'hidden_size'", r"known:"),
    "config unknown preset": (
        lambda: ViTConfig.from_name("vit_base_patch16_22"),
        KeyError,
        r"vit_base_patch16_22'",
        "Did you mean",
    ),
    # the model and its inputs
    "model from dict": (lambda: VisionTransformer({"img_size": 32}), TypeError, r"got a dict", r"ViTConfig\(\*\*d\)"),
    "model from int": (lambda: VisionTransformer(3), TypeError, r"got int", r"ViTConfig or a preset name"),
    "model bad backend": (lambda: _tiny().set_backend("cuda"), ValueError, r"backend must be one of", r"'torch'"),
    "input not a tensor": (lambda: _tiny()([[1.0]]), TypeError, r"got list", r"torch.Tensor image batch"),
    "input 3-D": (lambda: _tiny()(torch.randn(3, 16, 16)), ValueError, r"3-D tensor", r"unsqueeze\(0\)"),
    "input NHWC": (
        lambda: _tiny()(torch.randn(1, 16, 16, 3)),
        ValueError,
        r"channels in dim 1",
        r"permute\(0, 3, 1, 2\)",
    ),
    "input RGBA": (
        lambda: _tiny()(torch.randn(1, 4, 16, 16)),
        ValueError,
        r"got shape \(1, 4, 16, 16\)",
        r"x\[:, :3\]",
    ),
    "input size": (
        lambda: _tiny()(torch.randn(1, 3, 24, 24)),
        ValueError,
        r"expected 16x16 .* got 24x24",
        r"dynamic_img_size",
    ),
    "input not divisible": (
        lambda: _tiny()(torch.randn(1, 3, 17, 16)),
        ValueError,
        r"17x16 is not divisible",
        r"resize to 16x16",
    ),
    "input uint8": (
        lambda: _tiny()(torch.zeros(1, 3, 16, 16, dtype=torch.uint8)),
        ValueError,
        r"input dtype torch.uint8",
        r"set_input_normalization",
    ),
    "input dtype": (
        lambda: _tiny()(torch.randn(1, 3, 16, 16).half()),
        ValueError,
        r"differs from the weights'",
        r"x.to\(",
    ),
    "input empty": (lambda: _tiny()(torch.randn(0, 3, 16, 16)), ValueError, r"empty batch", r"at least one image"),
    "input normalisation std": (
        lambda: _tiny().set_input_normalization((0.5,) * 3, (0.2, 0.0, 0.2)),
        ValueError,
        r"std must be > 0",
        r"per channel",
    ),
    # files and names
    "checkpoint suffix": (
        lambda: vit_fast.save_checkpoint(_tiny(), "w.bin"),
        ValueError,
        r"format of 'w.bin'",
        r"w.safetensors",
    ),
    "checkpoint missing": (
        lambda: vit_fast.load_checkpoint("none.safetensors"),
        FileNotFoundError,
        r"none.safetensors",
        r"does not exist",
    ),
    "model name empty": (
        lambda: vit_fast.load_model(" "),
        ValueError,
        r"model name is empty",
        r"give 'default', a preset",
    ),
    "model name typo": (
        lambda: vit_fast.load_model("vit_tiny_patch16_22"),
        ValueError,
        r"cannot resolve",
        r"did you mean",
    ),
    "model file missing": (
        lambda: vit_fast.load_model("gone.pth"),
        FileNotFoundError,
        r"'gone.pth'",
        r"does not exist",
    ),
    "optimize unknown": (
        lambda: vit_fast.optimize(torch.nn.Linear(2, 2)),
        TypeError,
        r"does not know",
        r"timm VisionTransformer",
    ),
    "patch unknown": (
        lambda: vit_fast.apply_vit_fast(torch.nn.Linear(2, 2)),
        TypeError,
        r"does not know",
        r"set_backend",
    ),
}


@pytest.mark.parametrize("case", sorted(API))
def test_api_refuses_with_problem_and_fix(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    call, kind, problem, fix = API[case]
    before = _snapshot(tmp_path)
    with pytest.raises(kind) as info:
        call()
    text = str(info.value.args[0]) if isinstance(info.value, KeyError) else str(info.value)
    assert re.search(problem, text), f"{case}: the problem is not named in: {text}"
    assert re.search(fix, text), f"{case}: no fix in: {text}"
    assert _snapshot(tmp_path) == before


def test_export_api_refusals_touch_nothing(tmp_path):
    """The export library's up-front checks: each refuses before tracing, and the folder is as it was."""
    from vit_fast import export

    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "mine.onnx").write_text("not vit-fast's")
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "j.onnx.json").mkdir()
    model, before = _tiny(), _snapshot(tmp_path)
    cases = [
        (dict(path=tmp_path / "notes.txt"), r"wrong suffix '.txt'", r"\.onnx"),
        (dict(path=tmp_path / "mine.onnx"), r"not written by vit-fast", r"overwrite"),
        (dict(path=tmp_path / "afile" / "m.onnx"), r"is a file", r"choose another path"),
        (dict(path=tmp_path / "j.onnx"), r"j.onnx.json", r"folder"),
        (dict(path=tmp_path / "m.onnx", opset=99), r"opset 99 is newer", r"--opset 23 or lower"),
        (dict(path=tmp_path / "m.onnx", opset=11), r"opset 11 is too old", r">= 17"),
        (dict(path=tmp_path / "m.onnx", batch=(4, 1)), r"min 4 > max 1", r"min <= max"),
        (dict(path=tmp_path / "m.onnx", dtype="int8"), r"'int8'", r"fp32, fp16 or bf16"),
        (
            dict(path=tmp_path / "m.onnx", exporter="torchscript", attention="fused"),
            r"needs exporter='dynamo'",
            r"dynamo",
        ),
        (dict(path=tmp_path / "m.onnx", report=tmp_path / "afile" / "r.json"), r"is a file", r"choose another path"),
    ]
    for kwargs, problem, fix in cases:
        with pytest.raises(ValueError) as info:
            export.to_onnx(model, **kwargs)
        assert re.search(problem, str(info.value)) and re.search(fix, str(info.value)), (kwargs, str(info.value))
        assert _snapshot(tmp_path) == before, kwargs
    with pytest.raises(TypeError, match=r"got Linear.*vit_fast.optimize"):
        export.to_onnx(torch.nn.Linear(2, 2), tmp_path / "m.onnx")
    assert _snapshot(tmp_path) == before


# --------------------------------------------------------------------------- CLI
# id -> (argv, exit code, regex that must name the problem and the fix)
CLI: dict[str, tuple[list[str], int, str]] = {
    "unknown flag": (["info", "--bogus"], 2, r"unrecognized arguments: --bogus"),
    "export without target": (["export"], 2, r"required: TARGET"),
    "export wrong suffix": (
        ["export", "onnx", "default", "--out", "notes.txt"],
        1,
        r"'notes.txt' has the wrong suffix.*\.onnx",
    ),
    "export foreign file": (
        ["export", "onnx", "default", "--out", "mine.onnx"],
        1,
        r"not written by vit-fast.*--overwrite",
    ),
    "export under a file": (
        ["export", "onnx", "default", "--out", "afile/x.onnx"],
        1,
        r"'afile' is a file.*choose another",
    ),
    "export metadata folder": (["export", "onnx", "default", "--out", "j.onnx"], 1, r"j\.onnx\.json.*folder"),
    "export report under a file": (
        ["export", "onnx", "default", "--out", "k.onnx", "--json", "afile/r.json"],
        1,
        r"--json 'afile/r.json': 'afile' is a file",
    ),
    "export opset too new": (
        ["export", "onnx", "default", "--out", "o.onnx", "--opset", "99"],
        1,
        r"opset 99.*--opset 23",
    ),
    "export opset too old": (
        ["export", "onnx", "default", "--out", "o.onnx", "--opset", "11"],
        2,  # refused while parsing (vit_fast.cli._args.opset); the exporter's own check says the same to the API
        r"--opset: must be >= 17, got 11",
    ),
    "export batch zero": (
        ["export", "onnx", "default", "--out", "o.onnx", "--batch", "0,4"],
        2,
        r"batch size 0 .*>= 1",
    ),
    "export batch order": (
        ["export", "onnx", "default", "--out", "o.onnx", "--batch", "4,1"],
        2,  # refused while parsing, as every argument error is
        r"'4,1' is out of order.*MIN <= MAX, e\.g\. 1,4",
    ),
    "export batch text": (
        ["export", "onnx", "default", "--out", "o.onnx", "--batch", "a"],
        2,
        r"'a' .*not an int.*e\.g\.",
    ),
    "export batch count": (["export", "onnx", "default", "--out", "o.onnx", "--batch", "1,2,3"], 2, r"MIN,MAX"),
    "export dtype": (
        ["export", "onnx", "default", "--out", "o.onnx", "--dtype", "int8"],
        2,
        r"unknown dtype 'int8'.*fp32",
    ),
    "export bf16 verified": (
        ["export", "onnx", "default", "--out", "o.onnx", "--dtype", "bf16"],
        1,
        r"bf16.*--no-verify",
    ),
    "export unknown model": (
        ["export", "onnx", "nope_model", "--out", "o.onnx"],
        1,
        r"cannot resolve model 'nope_model'.*timm:NAME",
    ),
    "export empty model": (["export", "onnx", "", "--out", "o.onnx"], 1, r"model name is empty: give 'default'"),
    "export plain state dict": (
        ["export", "onnx", "plain.safetensors", "--out", "o.onnx"],
        1,
        r"no vit-fast config.*--config",
    ),
    "export preprocess without stats": (
        ["export", "onnx", "default", "--out", "o.onnx", "--preprocess", "NHWC"],
        1,
        r"--preprocess needs --mean and --std",
    ),
    "export stats without preprocess": (
        ["export", "onnx", "default", "--out", "o.onnx", "--mean", "0.5"],
        1,
        r"give --preprocess NCHW\|NHWC too",
    ),
    "export bad mean": (
        ["export", "onnx", "default", "--out", "o.onnx", "--mean", "a,b"],
        2,
        r"'a' in 'a,b' is not a number",
    ),
    "export verify batch outside the range": (
        ["export", "onnx", "default", "--out", "o.onnx", "--batch", "1,4", "--verify-batch", "1,8"],
        1,
        r"--verify-batch 1,8: batch 8 is outside the artifact's batch range 1\.\.4: verify batches within it",
    ),
    "export verify batch unverified": (
        ["export", "onnx", "default", "--out", "o.onnx", "--verify-batch", "1", "--no-verify"],
        1,
        r"--verify-batch names batches to verify: drop it or --no-verify",
    ),
    "tensorrt verify batch outside the profile": (
        ["export", "tensorrt", "x.onnx", "--out", "m.plan", "--batch", "1,8,64", "--verify-batch", "128"],
        1,
        r"batch 128 is outside the artifact's batch range 1\.\.64",
    ),
    "tritonserver verify batch outside the range": (
        ["export", "tritonserver", "default", "--out", "repo", "--batch", "1,8", "--verify-batch", "16"],
        1,
        r"batch 16 is outside the artifact's batch range 1\.\.8",
    ),
    "export outputs repeat": (
        ["export", "onnx", "default", "--out", "o.onnx", "--outputs", "logits,logits"],
        2,
        r"twice",
    ),
    "tensorrt missing onnx": (
        ["export", "tensorrt", "missing.onnx", "--out", "m.plan"],
        1,
        r"'missing.onnx' does not exist",
    ),
    "tensorrt wrong suffix": (["export", "tensorrt", "notes.txt", "--out", "m.plan"], 1, r"notes.txt"),
    "tensorrt workspace": (
        ["export", "tensorrt", "x.onnx", "--out", "m.plan", "--workspace-gib", "0"],
        2,
        r"must be > 0",
    ),
    "verify missing artifact": (["verify", "default", "missing.onnx"], 1, r"artifact 'missing.onnx' does not exist"),
    "verify unknown suffix": (["verify", "default", "notes.txt"], 1, r"cannot tell what 'notes.txt' is.*\.onnx"),
    "verify limit": (["verify", "default", "triton", "--limit", "0"], 2, r"--limit: must be >= 1"),
    "verify batch twice": (["verify", "default", "x.onnx", "--batch", "1,1"], 2, r"batch size 1 appears twice"),
    "verify missing model": (
        ["verify", "missing.safetensors", "triton"],
        1,
        r"checkpoint 'missing.safetensors' does not exist",
    ),
    "bench empty model": (["bench", "", "--out", "b"], 1, r"model name is empty"),
    "bench out is a file": (
        ["bench", "default", "--out", "afile"],
        1,
        r"--out 'afile': 'afile' is a file.*choose another",
    ),
    "bench backend": (
        ["bench", "default", "--backends", "nope", "--out", "b"],
        2,
        r"unknown backend 'nope'.*choose from",
    ),
    "bench batch": (["bench", "default", "--batch", "-1", "--out", "b"], 2, r"batch size -1 .*>= 1"),
    "bench dtype": (["bench", "default", "--dtype", "fp8", "--out", "b"], 2, r"unknown dtype 'fp8'.*choose from"),
    "bench samples": (["bench", "default", "--min-samples", "0", "--out", "b"], 2, r"must be >= 1"),
    "bench json under a file": (["bench", "default", "--out", "b", "--json", "afile/r.json"], 1, r"'afile' is a file"),
    "demo out is a file": (["demo", "--out", "afile"], 1, r"--out 'afile': 'afile' is a file"),
    "demo threads": (["demo", "--threads", "-3"], 2, r"--threads: must be >= 1, got -3"),
    "demo subset": (["demo", "--subset", "0"], 2, r"--subset: must be >= 1"),
    "demo timeout": (["demo", "--triton-timeout", "-1"], 2, r"must be > 0"),
    "json not a .json file": (
        ["bench", "default", "--out", "b", "--json", "notes.txt"],
        2,  # refused while parsing: a .json file or - (standard output)
        r"--json: 'notes.txt' is not a \.json file: give a path such as notes\.json, or - for standard output",
    ),
    "json empty": (["verify", "default", "triton", "--json", ""], 2, r"--json: got an empty path.*- for standard out"),
    "json a folder": (["info", "--json", "j.onnx.json"], 1, r"--json 'j.onnx.json' is a folder; give a file path"),
    "export json without verification": (
        ["export", "onnx", "default", "--out", "o.onnx", "--no-verify", "--json", "-"],
        1,
        r"--json is the verification report: drop --no-verify, or drop --json",
    ),
    "tritonserver instances": (
        ["export", "tritonserver", "default", "--out", "repo", "--instances", "0"],
        2,
        r"--instances: must be >= 1, got 0",
    ),
    "predict no path": (["predict", "default"], 2, r"required: PATH"),
    "predict top-k zero": (["predict", "default", "notes.txt", "--top-k", "0"], 2, r"--top-k: must be >= 1, got 0"),
    "predict missing image": (
        ["predict", "default", "nowhere.png"],
        1,
        r"image path 'nowhere.png' does not exist: give image files or folders of them",
    ),
    "predict folder without images": (
        ["predict", "default", "j.onnx.json"],
        1,
        r"folder 'j.onnx.json' holds no image \(.png.*\) in it or its subfolders",
    ),
    "predict features suffix": (
        ["predict", "default", "notes.txt", "--features", "f.txt"],
        1,
        r"--features 'f.txt' has the wrong suffix.*\.safetensors/\.npy",
    ),
    "predict features foreign file": (
        ["predict", "default", "notes.txt", "--features", "notes.npy"],
        1,
        r"not written by vit-fast.*--overwrite",
    ),
    "predict backend unknown": (["predict", "default", "notes.txt", "--backend", "cuda"], 2, r"invalid choice: 'cuda'"),
    "predict mean in 0..255": (
        ["predict", "default", "notes.txt", "--mean", "123.675,116.28,103.53"],
        1,
        r"--mean is in 0\.\.1 pixel units; 123\.675,116\.28,103\.53 looks like 0\.\.255: 0\.485,0\.456,0\.406",
    ),
    "predict std count": (["predict", "default", "notes.txt", "--std", "0.2,0.2"], 1, r"--std takes 1 or 3 numbers"),
    "predict std zero": (["predict", "default", "notes.txt", "--std", "0"], 1, r"--std must be positive, got 0"),
    "predict crop-pct": (
        ["predict", "default", "notes.txt", "--crop-pct", "1.5"],
        2,
        r"argument --crop-pct: must be a number above 0, up to 1, got 1\.5",
    ),
    "predict input size text": (["predict", "default", "notes.txt", "--input-size", "big"], 2, r"expected S or HxW"),
    "predict input size not the model's": (
        ["predict", "default", "notes.txt", "--input-size", "24"],
        1,
        r"--input-size 24x24: model 'default' takes 32x32 images \(it has no dynamic_img_size\)",
    ),
    "predict crop-pct over a record": (
        ["predict", "default", "notes.txt", "--crop-pct", "0.9"],
        1,
        r"crop_pct set timm's data config, but this model's preprocessing is read from vit-fast digits_vit.json",
    ),
}


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A folder with files the user owns; commands run inside it."""
    from safetensors.torch import save_file

    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "notes.npy").write_bytes(b"my array")
    (tmp_path / "mine.onnx").write_text("an ONNX file of my own")
    (tmp_path / "afile").write_text("a file, not a folder")
    (tmp_path / "j.onnx.json").mkdir()
    (tmp_path / "x.onnx").write_text("not really ONNX")
    save_file({k: v.contiguous() for k, v in _tiny().state_dict().items()}, str(tmp_path / "plain.safetensors"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("case", sorted(CLI))
def test_cli_refuses_with_one_line_and_leaves_the_folder_alone(case, user_folder, capsys):
    argv, code, message = CLI[case]
    before = _snapshot(user_folder)
    try:
        rc = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == code, f"{case}: exit {rc}, expected {code}; stderr: {err}"
    assert "Traceback" not in err
    assert re.search(message, err), f"{case}: {message!r} not in: {err}"
    if code == 1:  # the policy's one line: vit-fast <command>: error: <problem and fix>
        assert re.search(r"^vit-fast [a-z ]+: error: ", err.strip().splitlines()[-1]), err
    assert _snapshot(user_folder) == before, f"{case}: the folder changed"


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("pytriton") is not None, reason="the serve extra is installed here"
)
def test_serve_without_its_extra_says_how_to_install_it(user_folder, capsys):
    before = _snapshot(user_folder)
    assert main(["serve", "default"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "pip install -e '.[serve]' in a vit-fast checkout" in err and "numpy < 2" in err
    assert _snapshot(user_folder) == before


def test_the_catalogue_is_large_enough():
    # the trust issue asks for at least 60 kinds of bad input and fault (kill/disk faults: test_export_faults.py)
    assert len(API) + len(CLI) + 10 >= 60, len(API) + len(CLI)


def test_no_cli_case_needs_more_than_its_own_folder():
    assert all(not os.path.isabs(a) for argv, _, _ in CLI.values() for a in argv)


# --------------------------------------------------------------------------- one output policy for every writer
# Issue 20: each writer's --json / --out refused before any work, with the problem and the fix, when the path is
# a FIFO or device (never opened: these hung or were replaced before), a file vit-fast cannot prove it wrote
# (these were replaced before), or an artifact's own metadata (published over it before).
POLICY_CLI: dict[str, tuple[list[str], int, str]] = {
    "bench json foreign": (
        ["bench", "default", "--out", "b", "--json", "theirs.json"],
        1,
        r"--json 'theirs.json' exists and was not written by vit-fast.*--overwrite",
    ),
    "bench json fifo": (
        ["bench", "default", "--out", "b", "--json", "pipe.json"],
        1,
        r"--json 'pipe.json' is a FIFO \(named pipe\), not a regular file.*choose a file path",
    ),
    "bench json device": (
        ["bench", "default", "--out", "b", "--json", "/dev/null"],
        1,
        r"--json '/dev/null' is a character device, not a regular file.*choose a file path",
    ),
    "demo json foreign": (
        ["demo", "--out", "d", "--json", "theirs.json"],
        1,
        r"--json 'theirs.json' exists and was not written by vit-fast.*--overwrite",
    ),
    "demo out foreign report.md": (
        ["demo", "--out", "userdemo"],
        1,
        r"demo --out file 'userdemo/report.md' exists and was not written by vit-fast.*--overwrite",
    ),
    "demo out foreign patches.png": (
        ["demo", "--out", "pngdemo"],
        1,
        r"demo --out file 'pngdemo/patches.png' exists and was not written by vit-fast.*--overwrite",
    ),
    "demo out fifo": (["demo", "--out", "fifodemo"], 1, r"'fifodemo/report.json' is a FIFO.*choose a file path"),
    "demo json onto the onnx metadata": (
        ["demo", "--out", "d", "--json", "d/digits_vit.onnx.json"],
        1,
        r"is the metadata of an artifact.*choose another path",
    ),
    "serve json foreign": (
        ["serve", "default", "--json", "theirs.json"],
        1,
        r"--json 'theirs.json' exists and was not written by vit-fast.*--overwrite",
    ),
    "serve json fifo": (["serve", "default", "--json", "pipe.json"], 1, r"'pipe.json' is a FIFO.*choose a file path"),
    "export json fifo": (
        ["export", "onnx", "default", "--out", "o.onnx", "--json", "pipe.json"],
        1,
        r"--json 'pipe.json' is a FIFO.*choose a file path",
    ),
    "export out fifo": (["export", "onnx", "default", "--out", "pipe.onnx"], 1, r"'pipe.onnx' is a FIFO"),
    "export json onto its metadata": (
        ["export", "onnx", "default", "--out", "o.onnx", "--json", "o.onnx.json"],
        1,
        r"--json 'o.onnx.json' is the metadata of an artifact.*choose another path, e.g. 'o.onnx.report.json'",
    ),
    "export foreign onnx with our metadata beside": (
        ["export", "onnx", "default", "--out", "user.onnx"],
        1,
        r"ONNX file 'user.onnx' exists and was not written by vit-fast.*--overwrite",
    ),
    "verify json fifo": (
        ["verify", "default", "triton", "--json", "pipe.json"],
        1,
        r"--json 'pipe.json' is a FIFO.*choose a file path",
    ),
    "verify json onto the artifact's metadata": (
        ["verify", "default", "x.onnx", "--json", "x.onnx.json"],
        1,
        r"--json 'x.onnx.json' is the metadata of an artifact.*choose another path",
    ),
    "tritonserver json foreign": (
        ["export", "tritonserver", "default", "--out", "repo", "--json", "theirs.json"],
        1,
        r"--json 'theirs.json' exists and was not written by vit-fast.*--overwrite",
    ),
    "doctor json foreign": (
        ["doctor", "--out", "dd", "--json", "theirs.json"],
        1,
        r"--json 'theirs.json' exists and was not written by vit-fast.*--overwrite",
    ),
    "doctor out foreign report.md": (
        ["doctor", "--out", "userdemo"],
        1,
        r"doctor --out file 'userdemo/report.md' exists and was not written by vit-fast.*--overwrite",
    ),
    "info json fifo": (["info", "--json", "pipe.json"], 1, r"'pipe.json' is a FIFO.*choose a file path"),
}


def _snapshot_any(folder: Path) -> dict[str, str]:
    """Like _snapshot, but a FIFO is recorded as such and never opened (reading one would block)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        mode = p.lstat().st_mode
        if stat.S_ISDIR(mode):
            kind = "dir"
        elif stat.S_ISREG(mode):
            kind = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            kind = f"special {stat.S_IFMT(mode):o}"
        out[str(p.relative_to(folder))] = kind
    return out


@pytest.fixture
def policy_folder(tmp_path, monkeypatch):
    """A folder with the user's own files where vit-fast's writers would go, and FIFOs."""
    (tmp_path / "theirs.json").write_text('{"theirs": 1}\n')
    os.mkfifo(tmp_path / "pipe.json")
    os.mkfifo(tmp_path / "pipe.onnx")
    (tmp_path / "user.onnx").write_bytes(b"my own ONNX file")
    # an old vit-fast metadata file beside it proves nothing about user.onnx itself
    (tmp_path / "user.onnx.json").write_text('{"vit_fast_version": "0.1.0", "format": "onnx"}\n')
    (tmp_path / "x.onnx").write_text("not really ONNX")
    for name in ("userdemo", "pngdemo", "fifodemo"):
        (tmp_path / name).mkdir()
    (tmp_path / "userdemo" / "report.md").write_text("# my report\n")
    (tmp_path / "pngdemo" / "patches.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\0IEND\xaeB`\x82")
    os.mkfifo(tmp_path / "fifodemo" / "report.json")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run_cli_bounded(argv: list[str], folder: Path, seconds: float = 120.0) -> int:
    """``main(argv)``, failing (not hanging) if it blocks: a FIFO opened for reading would wait for a writer."""
    result: dict[str, object] = {}

    def target() -> None:
        try:
            result["rc"] = main(argv)
        except SystemExit as exit_:
            result["rc"] = exit_.code

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in folder.rglob("*"):  # release a blocked reader so the thread can end
            if stat.S_ISFIFO(fifo.lstat().st_mode):
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"{argv} blocked for {seconds:g} s")
    return result["rc"]  # type: ignore[return-value]


@pytest.mark.parametrize("case", sorted(POLICY_CLI))
def test_every_writer_refuses_up_front_and_leaves_the_folder_alone(case, policy_folder, capsys):
    argv, code, message = POLICY_CLI[case]
    before = _snapshot_any(policy_folder)
    rc = _run_cli_bounded(argv, policy_folder)
    err = capsys.readouterr().err
    assert rc == code, f"{case}: exit {rc}, expected {code}; stderr: {err}"
    assert "Traceback" not in err
    assert re.search(message, err), f"{case}: {message!r} not in: {err}"
    assert re.search(r"^vit-fast [a-z ]+: error: ", err.strip().splitlines()[-1]), err
    assert _snapshot_any(policy_folder) == before, f"{case}: the folder changed"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_checkpoints_follow_the_same_policy(tmp_path):
    """save_checkpoint replaces only a checkpoint it wrote; anything else needs overwrite=True; FIFOs never."""
    (tmp_path / "theirs.safetensors").write_bytes(b"someone's weights")
    (tmp_path / "theirs.pth").write_bytes(b"not even a zip")
    os.mkfifo(tmp_path / "pipe.pth")
    ours = vit_fast.save_checkpoint(_tiny(), tmp_path / "ours.pth")
    before = _snapshot_any(tmp_path)
    for name, problem in [
        ("theirs.safetensors", r"checkpoint '.*theirs.safetensors' exists and was not written by vit-fast"),
        ("theirs.pth", r"checkpoint '.*theirs.pth' exists and was not written by vit-fast"),
        ("pipe.pth", r"checkpoint '.*pipe.pth' is a FIFO \(named pipe\), not a regular file"),
    ]:
        with pytest.raises(ValueError, match=problem) as info:
            vit_fast.save_checkpoint(_tiny(), tmp_path / name)
        assert re.search(r"overwrite=True|choose a file path", str(info.value)), str(info.value)
        assert _snapshot_any(tmp_path) == before, name
    vit_fast.save_checkpoint(_tiny(), ours)  # its own file: replaced without asking
    vit_fast.save_checkpoint(_tiny(), tmp_path / "theirs.pth", overwrite=True)
    assert vit_fast.load_checkpoint(tmp_path / "theirs.pth").cfg == _tiny().cfg


def test_reports_never_land_on_an_artifacts_metadata(tmp_path):
    from vit_fast import export
    from vit_fast.util import files

    (tmp_path / "m.onnx").write_bytes(b"an artifact")
    files.write_json_atomic({files.MARKER_KEY: "0.1", "format": "onnx"}, tmp_path / "other.json")
    before = _snapshot_any(tmp_path)
    for path, artifact in [
        (tmp_path / "m.onnx.json", None),  # beside an existing artifact
        (tmp_path / "new.onnx.json", tmp_path / "new.onnx"),  # the artifact about to be written
        (tmp_path / "other.json", None),  # its content is some artifact's metadata
    ]:
        with pytest.raises(ValueError, match=r"is the metadata of an artifact.*choose another path"):
            export.check_report_path(path, overwrite=True, artifact=artifact)
    with pytest.raises(ValueError, match=r"is the metadata of an artifact"):
        export.verify(_tiny(), tmp_path / "m.onnx", json_path=tmp_path / "m.onnx.json")
    assert _snapshot_any(tmp_path) == before


def test_export_keeps_folders_that_only_look_like_staging_and_takes_a_250_character_name(tmp_path):
    """The cleaner removed a user's `.m.onnx.tmp-backup/` older than an hour and any `.*.tmp-*` folder with an
    unlocked `.owner`; a legal 250-character name was refused ("folder cannot be written": the probe's name
    was too long). Now both folders stay and the long name is written, with its metadata."""
    from vit_fast import export

    backup = tmp_path / ".m.onnx.tmp-backup"
    backup.mkdir()
    (backup / "old.onnx").write_bytes(b"my backup")
    os.utime(backup, (0, 0))
    owner = tmp_path / ".notes.tmp-1234"
    owner.mkdir()
    (owner / ".owner").write_text("unlocked, but mine")
    before = _snapshot(tmp_path)
    long_name = "n" * 245 + ".onnx"  # 250 characters; its metadata's name is 255
    for name in ("m.onnx", long_name):
        export.to_onnx(_tiny(), tmp_path / name, batch=(1, 2), exporter="torchscript", progress=False, verify=False)
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert sorted(set(after) - set(before)) == sorted(["m.onnx", "m.onnx.json", long_name, long_name + ".json"])


# --------------------------------------------------------------------------- issue 20: odd inputs (part B)
# Switches are tested in tests/kernels/test_switches.py. Each case here runs in one shared folder of odd files (built
# once: an ONNX export takes seconds), which must be byte-identical afterwards; a FIFO there is never opened.


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory) -> Path:
    import json

    from safetensors.torch import save_file

    from vit_fast import export

    folder = tmp_path_factory.mktemp("odd")
    model = _tiny()
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(folder / "plain.safetensors"))
    save_file(tensors, str(folder / "st.ckpt"))  # safetensors bytes under a torch suffix
    # fixed bytes that start like neither format (random ones may start with 0x80, a pickle's first byte)
    (folder / "rand.pth").write_bytes(bytes(range(7, 250)) * 3)
    (folder / "empty.pth").write_bytes(b"")
    torch.save({"model": torch.nn.Linear(2, 2)}, folder / "pickled.pth")  # a whole module: refused unloaded
    (folder / "partial.json").write_text(json.dumps({"img_size": 16, "patch_size": 8}))
    (folder / "hfstr.json").write_text(json.dumps({"model_type": "vit", "hidden_size": "768"}))
    os.mkfifo(folder / "fifo.json")
    bad = {**ViTConfig(**TINY).to_dict(), "depth": 0}
    save_file(tensors, str(folder / "badcfg.safetensors"), {"vit_fast_config": json.dumps(bad)})
    hf = {
        "model_type": "vit",
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "image_size": 16,
        "patch_size": 8,
        "architectures": ["ViTModel"],
    }
    (folder / "hfpickled").mkdir()
    (folder / "hfpickled" / "config.json").write_text(json.dumps(hf))
    torch.save({"x": torch.nn.Linear(2, 2)}, folder / "hfpickled" / "pytorch_model.bin")
    (folder / "hfstrdir").mkdir()
    (folder / "hfstrdir" / "config.json").write_text(json.dumps({**hf, "hidden_size": "16"}))
    (folder / "x.onnx").write_text("not really ONNX")
    (folder / "x.onnx.json").write_text(json.dumps({"verification": "passed"}))
    export.to_onnx(model, folder / "t16.onnx", verify=False)
    (folder / "t16.onnx.json").unlink()  # an artifact whose metadata is gone: only its input dims tell its size
    vit_fast.save_checkpoint(VisionTransformer(ViTConfig(**{**TINY, "img_size": 24})), folder / "t24.safetensors")
    return folder


LONG_NAME = "n" * 300  # over NAME_MAX (255 bytes) on every common file system

# id -> (argv, exit code, regex naming the problem and the fix, in stdout + stderr)
ODD_CLI: dict[str, tuple[list[str], int, str]] = {
    "metadata verification a string": (
        ["verify", "default", "x.onnx"],
        1,
        r"recorded verification is unreadable \(a str, not an object\).*run vit-fast verify MODEL ARTIFACT",
    ),
    "pickled checkpoint": (
        ["verify", "pickled.pth", "triton"],
        1,
        r"'pickled.pth' holds Python objects besides tensors \(torch.nn.modules.linear.Linear\).*"
        r"weights_only=True.*save the weights alone",
    ),
    "pickled HF pytorch_model.bin": (
        ["verify", "hfpickled", "triton"],
        1,
        r"'hfpickled/pytorch_model.bin' holds Python objects besides tensors.*save the weights alone",
    ),
    "batch beyond range": (
        ["bench", "default", "--batch", "1,99999999999999999999", "--out", "b"],
        2,
        r"batch size 99999999999999999999 .*too large: give sizes from 1 to 2147483647",
    ),
    "export batch beyond range": (
        ["export", "onnx", "default", "--out", "o.onnx", "--batch", "1,99999999999999999999"],
        2,
        r"too large: give sizes from 1 to",
    ),
    "seed beyond 64 bits": (
        ["bench", "default", "--seed", "99999999999999999999", "--out", "b"],
        2,
        r"--seed: must be an int from 0 to 4294967295, got 99999999999999999999",
    ),
    "verify seed beyond 64 bits": (
        ["verify", "default", "triton", "--seed", "18446744073709551616"],
        2,
        r"--seed: must be an int from 0 to 4294967295",
    ),
    "config is a FIFO": (
        ["verify", "plain.safetensors", "triton", "--config", "fifo.json"],
        1,
        r"config 'fifo.json' is not a regular file: give a config.json file or a preset name",
    ),
    "model is a FIFO": (["verify", "fifo.json", "triton"], 1, r"'fifo.json' is not a regular file: give a checkpoint"),
    "random bytes in a .pth": (
        ["verify", "rand.pth", "triton"],
        1,
        r"'rand.pth' is not a PyTorch checkpoint: .*write it again or give another file",
    ),
    "empty .pth": (["verify", "empty.pth", "triton"], 1, r"'empty.pth' is an empty file .*write it again or give"),
    "safetensors named .ckpt": (
        ["verify", "st.ckpt", "triton"],
        1,
        r"'st.ckpt' is a safetensors file with a .ckpt suffix: rename it to st.safetensors",
    ),
    "HF config hidden_size a string": (
        ["verify", "plain.safetensors", "triton", "--config", "hfstr.json"],
        1,
        r"config 'hfstr.json': field 'hidden_size' is '768' \(str\), expected an integer: fix that field",
    ),
    "HF folder hidden_size a string": (
        ["verify", "hfstrdir", "triton"],
        1,
        r"config 'hfstrdir/config.json': field 'hidden_size' is '16' \(str\).*fix that field",
    ),
    "config file missing fields": (
        ["verify", "plain.safetensors", "triton", "--config", "partial.json"],
        1,
        r"config file 'partial.json' lacks the field\(s\) embed_dim, depth, num_heads, mlp_ratio, num_classes: "
        r"vit-fast does not guess.*fix the file, or give a preset name",
    ),
    "checkpoint's embedded config bad": (
        ["verify", "badcfg.safetensors", "triton"],
        1,
        r"the config embedded in checkpoint 'badcfg.safetensors' \(not a --config file\): ViTConfig.depth must be "
        r"an int >= 1, got 0.*give the right config with --config",
    ),
    "path too long": (
        ["bench", "default", "--out", LONG_NAME],
        1,
        rf"cannot write '{LONG_NAME}': the path is too long .*choose a shorter file or folder name",
    ),
    "artifact for another input size": (
        ["verify", "t24.safetensors", "t16.onnx"],
        1,
        r"'t16.onnx' was exported for 16x16 images \(input dims \[3, 16, 16\]\), but the model takes 24x24 images.*"
        r"verify it against the model it was exported from, or export this model again",
    ),
}


def _run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        rc = exit_.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", sorted(ODD_CLI))
def test_odd_inputs_get_one_line_with_problem_and_fix(case, odd_folder, capsys, monkeypatch):
    monkeypatch.chdir(odd_folder)
    argv, code, message = ODD_CLI[case]
    before = _snapshot_any(odd_folder)
    rc, out, err = _run_cli(argv, capsys)
    assert rc == code, f"{case}: exit {rc}, expected {code}; stderr: {err}"
    assert "Traceback" not in out + err
    assert re.search(message, out + err), f"{case}: {message!r} not in: {out + err}"
    if code == 1:  # the policy's one line: vit-fast <command>: error: <problem and fix>
        assert re.search(r"^vit-fast [a-z ]+: error: ", err.strip().splitlines()[-1]), err
    assert _snapshot_any(odd_folder) == before, f"{case}: the folder changed"


def test_a_full_disk_is_named_with_the_path_and_the_fix(user_folder, capsys, monkeypatch):
    """ENOSPC (and a quota, a read-only disk) wherever a command meets it: the CLI's one error layer names the
    path and the fix instead of errno's text. The disk is faked: the command raises what a full one would."""
    import errno

    from vit_fast.cli import info

    def full(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "out/report.json")

    monkeypatch.setattr(info, "run", full)
    before = _snapshot(user_folder)
    rc, out, err = _run_cli(["info"], capsys)
    assert rc == 1 and "Traceback" not in err and "Errno" not in err
    assert re.search(
        r"^vit-fast info: error: cannot write 'out/report.json': no space left on its device; free space there, or "
        r"choose a path on another disk$",
        err.strip(),
    ), err
    assert _snapshot(user_folder) == before


@pytest.mark.parametrize(
    "record",
    ["passed", ["PASSED"], 3, True, {"worst": "x"}, {"worst": {"max_abs_err": "big"}}, {"batches": 5}],
    ids=repr,
)
def test_odd_verification_records_never_raise(record):
    from vit_fast.export import format_verification

    text = format_verification(record)
    assert text.startswith("verification: the recorded verification is unreadable (")
    assert "run vit-fast verify MODEL ARTIFACT" in text


def test_checkpoint_format_checks_through_the_api(odd_folder):
    """load_checkpoint / load_model refuse the same files with the same words, before any loader reads them."""
    cases = [
        ("rand.pth", r"is not a PyTorch checkpoint"),
        ("empty.pth", r"is an empty file"),
        ("st.ckpt", r"a safetensors file with a .ckpt suffix"),
        ("pickled.pth", r"holds Python objects besides tensors.*weights_only=True"),
    ]
    for name, problem in cases:
        with pytest.raises(ValueError, match=problem):
            vit_fast.load_checkpoint(odd_folder / name)
    with pytest.raises(ValueError, match=r"config file .*partial.json' lacks the field\(s\) embed_dim"):
        vit_fast.load_model(str(odd_folder / "plain.safetensors"), config=str(odd_folder / "partial.json"))


def test_batches_beyond_range_are_refused_through_the_api(tmp_path, odd_folder):
    """The export, verify and Triton repository APIs refuse what the CLI's parser refuses, before any tracing
    (torch would fail on it with C++ frames)."""
    from vit_fast import export
    from vit_fast.export.tritonserver import batch_plan

    model, before = _tiny(), _snapshot(tmp_path)
    with pytest.raises(ValueError, match=r"max 100000000000000000000 is too large: give sizes from 1 to 2147483647"):
        export.to_onnx(model, tmp_path / "m.onnx", batch=(1, 10**20))
    with pytest.raises(ValueError, match=r"batches must be ints >= 1 \(at most 2147483647\)"):
        export.verify(model, odd_folder / "t16.onnx", batches=[1, 2**31])
    with pytest.raises(ValueError, match=r"at most 2147483647"):
        batch_plan([1, 2**40])
    assert _snapshot(tmp_path) == before


# --------------------------------------------------------------------------- issue 31: loading rules, remote code
# A model folder's own Python never runs and transformers never prompts (trust_remote_code=False; an auto_map is
# refused before transformers reads the folder); weights load as they are or are refused by file, tensor and fix
# (never cast to one tensor's dtype, never NaN into a verification); HF_HUB_OFFLINE means no network at all.

_HF_TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "image_size": 16,
    "patch_size": 8,
}


def _plant_remote_code(folder: Path, marker: Path, model_type: str) -> None:
    """A save_pretrained-looking folder whose config.json maps the Auto classes to its own module, which writes
    ``marker`` (outside the folder: transformers imports remote code from a copy in its modules cache) when it is
    imported."""
    import json

    folder.mkdir()
    config = {**_HF_TINY, "model_type": model_type, "architectures": ["EvilViTModel"]}
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilViTModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('the folder ran its code')\n"
        "from transformers import PretrainedConfig, PreTrainedModel\n"
        f"class EvilConfig(PretrainedConfig):\n    model_type = {model_type!r}\n"
        "class EvilViTModel(PreTrainedModel):\n    config_class = EvilConfig\n"
    )


@pytest.fixture(scope="module")
def load_folder(tmp_path_factory) -> Path:
    import argparse
    import json

    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("loading")
    _plant_remote_code(folder / "hf_automap", folder.parent / f"{folder.name}-MARKER", "evil-vit")
    _plant_remote_code(folder / "hf_automap_vit", folder.parent / f"{folder.name}-MARKER-vit", "vit")
    model = _tiny()
    meta = {"vit_fast_config": json.dumps(model.cfg.to_dict())}
    state = {k: v.contiguous() for k, v in model.state_dict().items()}

    def save(name: str, **changed: torch.Tensor) -> None:
        save_file({**state, **changed}, str(folder / name), meta)

    save("mixed.safetensors", pos_embed=state["pos_embed"].half())  # loaded entirely as fp16 before
    save("mixed_up.safetensors", **{"blocks.0.mlp.fc1.weight": state["blocks.0.mlp.fc1.weight"].half()})
    nan = state["blocks.0.attn.qkv.weight"].clone()
    nan[0, 0] = float("nan")
    save("nan.safetensors", **{"blocks.0.attn.qkv.weight": nan})
    inf = state["norm.weight"].clone()
    inf[1] = float("inf")
    save("inf.safetensors", **{"norm.weight": inf})
    save("int8.safetensors", **{"head.weight": state["head.weight"].to(torch.int8)})
    save("bool.safetensors", **{k: v != 0 for k, v in state.items()})
    save("fp8.safetensors", **{"head.weight": state["head.weight"].to(torch.float8_e4m3fn)})
    save("half.safetensors", **{k: v.half() for k, v in state.items()})  # one dtype: loads as it is
    torch.save({"model": model}, folder / "pickled.pth")  # a whole module: what timm's refusal met
    torch.save({"state_dict": state, "args": argparse.Namespace(lr=0.1)}, folder / "train.pth")  # timm's trainer
    (folder / "cfg.json").write_text(json.dumps(model.cfg.to_dict()))
    return folder


def _markers(folder: Path) -> list[Path]:
    return sorted(folder.parent.glob(f"{folder.name}-MARKER*"))


LOAD_CLI: dict[str, tuple[list[str], int, str]] = {
    "HF folder whose auto_map names its code": (
        ["verify", "hf_automap", "triton"],
        1,
        r"Hugging Face folder 'hf_automap' names its own Python code in config.json's auto_map \(AutoConfig: "
        r"evil.EvilConfig, AutoModel: evil.EvilViTModel\): vit-fast never runs a model's code \(transformers is "
        r"called with trust_remote_code=False\).*remove auto_map from its config.json",
    ),
    "HF ViT folder with an auto_map": (
        ["verify", "hf_automap_vit", "triton"],
        1,
        r"Hugging Face folder 'hf_automap_vit' names its own Python code in config.json's auto_map",
    ),
    "fp16 pos_embed beside fp32 weights": (
        ["verify", "mixed.safetensors", "triton"],
        1,
        r"weights from 'mixed.safetensors' mix dtypes: pos_embed is float16, the other 19 tensors are float32\. "
        r"vit-fast builds a model in one dtype and does not pick one for you: cast every tensor to one dtype",
    ),
    "one fp16 weight among fp32": (
        ["verify", "mixed_up.safetensors", "triton"],
        1,
        r"'mixed_up.safetensors' mix dtypes: blocks.0.mlp.fc1.weight is float16, the other 19 tensors are float32",
    ),
    "NaN weight": (
        ["verify", "nan.safetensors", "triton"],
        1,
        r"weights from 'nan.safetensors': blocks.0.attn.qkv.weight holds 1 NaN value\(s\) of 768: .*vit-fast loads "
        r"only finite weights: give another checkpoint",
    ),
    "infinite weight": (
        ["verify", "inf.safetensors", "triton"],
        1,
        r"weights from 'inf.safetensors': norm.weight holds 1 infinite value\(s\) of 16",
    ),
    "int8 weight": (
        ["verify", "int8.safetensors", "triton"],
        1,
        r"weights from 'int8.safetensors': head.weight is int8, not a floating-point dtype.*dequantise it",
    ),
    "bool weights": (
        ["verify", "bool.safetensors", "triton"],
        1,
        r"weights from 'bool.safetensors': blocks.0.attn.proj.bias is bool \(and 19 more tensors\), not a "
        r"floating-point dtype",
    ),
    "float8 weight": (
        ["verify", "fp8.safetensors", "triton"],
        1,
        r"weights from 'fp8.safetensors': head.weight is float8_e4m3fn, not a floating-point dtype vit-fast builds",
    ),
    "pickled timm weights": (
        ["verify", "timm:vit_tiny_patch16_224", "triton", "--weights", "pickled.pth"],
        1,
        r"'pickled.pth' holds Python objects besides tensors \(vit_fast.model.vit.VisionTransformer\).*"
        r"If you trust the "
        r"file, convert it once yourself \(this runs the code it holds\) and give 'pickled.safetensors' instead: "
        r"python -c .*save_file",
    ),
}


@pytest.mark.parametrize("case", sorted(LOAD_CLI))
def test_loading_refusals_name_the_file_the_tensor_and_the_fix(case, load_folder, capsys, monkeypatch):
    import builtins

    monkeypatch.chdir(load_folder)
    monkeypatch.setattr(builtins, "input", lambda *a: "y")  # any prompt would be answered yes, as the attacker hopes
    argv, code, message = LOAD_CLI[case]
    before = _snapshot_any(load_folder)
    rc, out, err = _run_cli(argv, capsys)
    assert rc == code, f"{case}: exit {rc}, expected {code}; stderr: {err}"
    assert "Traceback" not in out + err and "[y/N]" not in out + err
    assert re.search(message, out + err), f"{case}: {message!r} not in: {out + err}"
    assert "retry with weights_only=False" not in err  # timm's and torch's advice, which vit-fast never follows
    assert re.search(r"^vit-fast [a-z ]+: error: ", err.strip().splitlines()[-1]), err
    assert _snapshot_any(load_folder) == before, f"{case}: the folder changed"
    assert _markers(load_folder) == [], "a model folder's Python ran"


def test_planted_remote_code_never_runs_from_a_terminal(load_folder):
    """The attack as a user meets it: `vit-fast verify FOLDER triton` on a terminal (a pty as stdin, "y" typed
    ahead). transformers asked `[y/N]`, waited 15 s, and on "y" ran the folder's Python; now it is refused at once
    and the module that would write the marker is never imported."""
    import pty
    import subprocess
    import sys

    for name in ("hf_automap", "hf_automap_vit"):
        leader, follower = pty.openpty()
        try:
            os.write(leader, b"y\ny\n")
            done = subprocess.run(
                [sys.executable, "-m", "vit_fast", "verify", name, "triton"],
                cwd=load_folder,
                stdin=follower,
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"},
            )
        finally:
            os.close(leader)
            os.close(follower)
        text = done.stdout + done.stderr
        assert done.returncode == 1, text
        assert "[y/N]" not in text and "Traceback" not in text, text
        assert f"Hugging Face folder {name!r} names its own Python code" in text, text
        assert _markers(load_folder) == [], f"{name}: the folder's Python ran"
        assert not (load_folder / name / "__pycache__").exists()


@pytest.fixture
def socket_guard(monkeypatch) -> list:
    """Every connect and name lookup is refused and recorded: the test asserts the list stays empty."""
    import errno
    import socket

    attempts: list = []

    def refuse(*args, **kwargs):
        attempts.append(args[:2])
        raise OSError(errno.ENETUNREACH, "this test allows no network")

    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "create_connection"):
        monkeypatch.setattr(socket, name, refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["verify", "timm:vit_tiny_patch16_224", "triton"],
            r"cannot download pretrained weights for timm model 'vit_tiny_patch16_224': HF_HUB_OFFLINE is set and "
            r"they are not in the local Hugging Face cache\. Pass a local weights file .*--weights FILE",
        ),
        (
            ["verify", "vit_tiny_patch16_224.augreg_in21k", "triton"],
            r"timm model 'vit_tiny_patch16_224.augreg_in21k': HF_HUB_OFFLINE is set",
        ),
        (
            ["verify", "hf:org/none-such", "triton"],
            r"cannot download Hugging Face model 'org/none-such': HF_HUB_OFFLINE is set",
        ),
    ],
    ids=["timm name", "timm name with a tag", "hf name"],
)
def test_offline_hub_names_touch_no_network(argv, message, load_folder, socket_guard, capsys, monkeypatch, tmp_path):
    """HF_HUB_OFFLINE=1: a timm: name looked huggingface.co up in DNS (the probe honoured the switch for hf: names
    only); now no name reaches for a socket, and the refusal says what to do."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(load_folder)
    rc, out, err = _run_cli(argv, capsys)
    assert rc == 1 and "Traceback" not in err, err
    assert re.search(message, err), err
    assert socket_guard == [], err


# --------------------------------------------------------------------------- names that other files record
# A file name read from an artifact's metadata, an ONNX graph (its external data) or a Hugging Face weights index
# is followed only inside that file's folder (vit_fast.util.files.contained_path). The planted bundle wrote PLANTED.txt
# outside the repository before (and left it there when the export failed): each case here is refused before any
# work, names the file, the field and the name, and leaves the folder byte-identical (no PLANTED.txt beside it).


def _with_locations(proto, location: str):
    """``proto`` (loaded without its external data) with every external tensor's location set to ``location``."""
    from onnx.external_data_helper import uses_external_data

    for tensor in proto.graph.initializer:
        if uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location
    return proto


@pytest.fixture(scope="module")
def planted_folder(tmp_path_factory) -> Path:
    import json

    import onnx
    from safetensors.torch import save_file

    from vit_fast import export

    folder = tmp_path_factory.mktemp("planted")
    bundle = folder / "a" / "b" / "c" / "d" / "e"
    bundle.mkdir(parents=True)
    export.to_onnx(_tiny(), bundle / "m.onnx", batch=(1, 2), exporter="torchscript", progress=False, verify=False)
    (folder / "a" / "PLANTED.txt").write_text("the attacker's file\n")
    meta = json.loads((bundle / "m.onnx.json").read_text())

    def bundle_with(name: str, external_data: str) -> None:
        (folder / name).mkdir()
        (folder / name / "m.onnx").write_bytes((bundle / "m.onnx").read_bytes())
        (folder / name / "m.onnx.json").write_text(json.dumps({**meta, "external_data": external_data}))

    (bundle / "m.onnx.json").write_text(json.dumps({**meta, "external_data": "../../../../PLANTED.txt"}))
    bundle_with("abs", str(folder / "a" / "PLANTED.txt"))
    bundle_with("lnk", "w.data")
    (folder / "lnk" / "w.data").symlink_to(Path("..") / "a" / "PLANTED.txt")
    # ONNX graphs whose tensors name their external data outside their folder
    proto = onnx.load(str(bundle / "m.onnx"))
    (folder / "ext").mkdir()
    onnx.save_model(proto, str(folder / "ext" / "t.onnx"), save_as_external_data=True, location="t.onnx.data")
    graph = onnx.load(str(folder / "ext" / "t.onnx"), load_external_data=False)
    data = (folder / "ext" / "t.onnx.data").read_bytes()
    (folder / "trav" / "x").mkdir(parents=True)
    (folder / "trav" / "outside.data").write_bytes(data)
    onnx.save_model(_with_locations(graph, "../outside.data"), str(folder / "trav" / "x" / "t.onnx"))
    (folder / "absloc").mkdir()
    onnx.save_model(_with_locations(graph, str(folder / "trav" / "outside.data")), str(folder / "absloc" / "t.onnx"))
    (folder / "linkloc").mkdir()
    (folder / "linkloc" / "w.data").symlink_to(Path("..") / "trav" / "outside.data")
    onnx.save_model(_with_locations(graph, "w.data"), str(folder / "linkloc" / "t.onnx"))
    (folder / "nodata").mkdir()
    onnx.save_model(_with_locations(graph, "t.onnx.data"), str(folder / "nodata" / "t.onnx"))
    # Hugging Face folders whose weights index names shards outside them
    hf = {
        "model_type": "vit",
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "image_size": 16,
        "patch_size": 8,
        "architectures": ["ViTModel"],
    }
    (folder / "elsewhere").mkdir()
    save_file({"embeddings.cls_token": torch.zeros(1, 1, 16)}, str(folder / "elsewhere" / "model.safetensors"))
    for name, shard in [("hfdotdot", "../elsewhere/model.safetensors"), ("hfabs", str(folder / "elsewhere"))]:
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps(hf))
        index = {"metadata": {"total_size": 64}, "weight_map": {"embeddings.cls_token": shard}}
        (folder / name / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


# id -> (argv, regex naming the file, the field, the name and the fix); every one exits 1
PLANTED_CLI: dict[str, tuple[list[str], str]] = {
    "metadata external_data climbs out (unverified)": (
        ["export", "tritonserver", "a/b/c/d/e/m.onnx", "--out", "repo", "--no-verify"],
        r"'a/b/c/d/e/m.onnx.json': field 'external_data' is '../../../../PLANTED.txt', which climbs out of its "
        r"folder through '..'; vit-fast follows only names of files inside 'a/b/c/d/e': put the file there",
    ),
    "metadata external_data climbs out (a failing export)": (
        ["export", "tritonserver", "a/b/c/d/e/m.onnx", "--out", "repo"],  # its metadata names no source to verify by
        r"'a/b/c/d/e/m.onnx.json': field 'external_data' is '../../../../PLANTED.txt', which climbs out",
    ),
    "metadata external_data climbs out (verify)": (
        ["verify", "default", "a/b/c/d/e/m.onnx"],
        r"'a/b/c/d/e/m.onnx.json': field 'external_data' is '../../../../PLANTED.txt', which climbs out",
    ),
    "metadata external_data absolute": (
        ["export", "tritonserver", "abs/m.onnx", "--out", "repo", "--no-verify"],
        r"'abs/m.onnx.json': field 'external_data' is '/.*/a/PLANTED.txt', which is an absolute path",
    ),
    "metadata external_data a link out": (
        ["export", "tritonserver", "lnk/m.onnx", "--out", "repo", "--no-verify"],
        r"'lnk/m.onnx.json': field 'external_data' is 'w.data', which leads out of its folder through a link "
        r"\(to '/.*/a/PLANTED.txt'\)",
    ),
    "graph location climbs out": (
        ["export", "tritonserver", "trav/x/t.onnx", "--out", "repo", "--no-verify"],
        r"'trav/x/t.onnx': the external data location of tensor '.+' is '../outside.data', which climbs out of "
        r"its folder through '..'; vit-fast follows only names of files inside 'trav/x'",
    ),
    "graph location climbs out (verify)": (
        ["verify", "default", "trav/x/t.onnx"],
        r"'trav/x/t.onnx': the external data location of tensor '.+' is '../outside.data', which climbs out",
    ),
    "graph location climbs out (tensorrt)": (
        ["export", "tensorrt", "trav/x/t.onnx", "--out", "m.plan"],
        r"'trav/x/t.onnx': the external data location of tensor '.+' is '../outside.data', which climbs out",
    ),
    "graph location climbs out (bench)": (
        ["bench", "trav/x/t.onnx", "--out", "b"],
        r"'trav/x/t.onnx': the external data location of tensor '.+' is '../outside.data', which climbs out",
    ),
    "graph location absolute": (
        ["export", "tritonserver", "absloc/t.onnx", "--out", "repo", "--no-verify"],
        r"'absloc/t.onnx': the external data location of tensor '.+' is '/.*/trav/outside.data', which is an "
        r"absolute path",
    ),
    "graph location a link out": (
        ["verify", "default", "linkloc/t.onnx"],
        r"'linkloc/t.onnx': the external data location of tensor '.+' is 'w.data', which leads out of its folder "
        r"through a link",
    ),
    "graph external data missing": (
        ["export", "tritonserver", "nodata/t.onnx", "--out", "repo", "--no-verify"],
        r"'nodata/t.onnx' keeps tensor '.+' in external data 't.onnx.data', which is not a file in 'nodata': copy "
        r"it there beside the ONNX file",
    ),
    "HF weights index climbs out": (
        ["verify", "hfdotdot", "triton"],
        r"'hfdotdot/model.safetensors.index.json': weight_map\['embeddings.cls_token'\] is "
        r"'../elsewhere/model.safetensors', which climbs out of its folder through '..'",
    ),
    "HF weights index absolute": (
        ["verify", "hfabs", "triton"],
        r"'hfabs/model.safetensors.index.json': weight_map\['embeddings.cls_token'\] is '/.*/elsewhere', which is "
        r"an absolute path",
    ),
}


@pytest.mark.parametrize("case", sorted(PLANTED_CLI))
def test_names_other_files_record_stay_inside_their_folder(case, planted_folder, capsys, monkeypatch):
    monkeypatch.chdir(planted_folder)
    argv, message = PLANTED_CLI[case]
    before = _snapshot_any(planted_folder)
    rc, out, err = _run_cli(argv, capsys)
    assert rc == 1, f"{case}: exit {rc}; stderr: {err}"
    assert "Traceback" not in out + err
    assert re.search(message, err), f"{case}: {message!r} not in: {err}"
    assert re.search(r"^vit-fast [a-z ]+: error: ", err.strip().splitlines()[-1]), err
    assert _snapshot_any(planted_folder) == before, f"{case}: the folder changed"
    assert not (planted_folder / "PLANTED.txt").exists()


# --------------------------------------------------------------------------- artifacts that take uint8 pixels
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_uint8_artifacts_are_verified_with_pixels_and_served(layout, tmp_path, capsys, monkeypatch):
    """An artifact exported with --preprocess failed `vit-fast verify default` every time (the labelled set went in
    as normalised floats) and `export tritonserver` refused it ("ONNX element type 2"). Now the labelled set goes in
    as uint8 pixels in the artifact's layout, and the repository serves a TYPE_UINT8 input in that layout."""
    pytest.importorskip("sklearn", reason="scikit-learn rebuilds the held-out set (pip install -e '.[demo]')")
    from vit_fast.assets import DIGITS_MEAN, DIGITS_STD

    monkeypatch.chdir(tmp_path)
    stats = ["--mean", str(DIGITS_MEAN), "--std", str(DIGITS_STD)]
    argv = ["export", "onnx", "default", "--out", "pp/m.onnx", "--batch", "1,4", "--preprocess", layout, *stats]
    rc, _, err = _run_cli(argv, capsys)
    assert rc == 0, err
    rc, out, err = _run_cli(["verify", "default", "pp/m.onnx", "--batch", "1,3", "--seed", "0"], capsys)
    assert rc == 0 and "Traceback" not in err, err
    accuracy = re.search(r"labelled data \(360 images\): eager accuracy ([\d.]+)%, artifact accuracy ([\d.]+)%", out)
    assert accuracy, out
    # the pixels are the held-out set itself: through the artifact's own normalisation (training's constants) the
    # model scores what it scored on the float set, up to the pixels' rounding (at most 2 of 360 images apart)
    floats, labels = __import__("vit_fast.assets", fromlist=["x"]).load_default_eval_set()
    with torch.no_grad():
        recorded = (vit_fast.load_model("default", backend="torch")(floats).argmax(-1) == labels).double().mean()
    assert abs(float(accuracy.group(1)) / 100 - recorded.item()) <= 2 / 360 + 1e-9, (accuracy.group(0), recorded)
    assert float(accuracy.group(2)) == float(accuracy.group(1))
    rc, _, err = _run_cli(["export", "tritonserver", "pp/m.onnx", "--out", "repo", "--seed", "0", "--quiet"], capsys)
    assert rc == 0, err
    config = (tmp_path / "repo" / "m" / "config.pbtxt").read_text()
    dims = "32, 32, 1" if layout == "NHWC" else "1, 32, 32"
    assert f'name: "images"\n    data_type: TYPE_UINT8\n    format: FORMAT_{layout}\n    dims: [ {dims} ]' in config
    assert 'name: "logits"\n    data_type: TYPE_FP32\n    dims: [ 10 ]' in config
    assert "verification: PASSED" in config


def test_contained_path_refuses_every_way_out(tmp_path):
    """The one containment check: each way a recorded name can lead out of its folder is refused, naming the file,
    the field and the name; names inside (a subfolder, a link that stays inside, a folder reached through a link)
    pass, and links leading out pass only where the folder's files are links by design."""
    from vit_fast.util.files import contained_path

    folder = tmp_path / "art"
    (folder / "sub").mkdir(parents=True)
    (tmp_path / "outside.data").write_bytes(b"x")
    (folder / "in.data").write_bytes(b"x")
    (folder / "inner.data").symlink_to("sub")
    (folder / "out.data").symlink_to(Path("..") / "outside.data")
    (tmp_path / "via").symlink_to("art")
    refused = [
        ("", "is not a file name"),
        (None, "is not a file name"),
        (3, "is not a file name"),
        ("a\0b", "holds a NUL character"),
        (str(tmp_path / "outside.data"), "is an absolute path"),
        ("../outside.data", "climbs out of its folder through '..'"),
        ("sub/../../outside.data", "climbs out of its folder through '..'"),
        ("sub/..", "climbs out of its folder through '..'"),
        ("..\\outside.data", "climbs out of its folder through '..'"),
        ("out.data", "leads out of its folder through a link"),
    ]
    for name, why in refused:
        with pytest.raises(ValueError) as info:
            contained_path(folder, name, source=folder / "m.onnx.json", field="field 'external_data'")
        text = str(info.value)
        assert f"m.onnx.json': field 'external_data' is {name!r}, which {why}" in text, text
        assert "put the file there and name it relative to that folder" in text, text
    for name in ("in.data", "sub/w.data", "inner.data", "./in.data"):
        assert contained_path(folder, name, source="s", field="f") == folder / name
    assert contained_path(tmp_path / "via", "in.data", source="s", field="f") == tmp_path / "via" / "in.data"
    assert contained_path(folder, "out.data", source="s", field="f", links_may_leave=True) == folder / "out.data"
    with pytest.raises(ValueError, match=r"climbs out"):
        contained_path(folder, "../outside.data", source="s", field="f", links_may_leave=True)


def test_a_sharded_hugging_face_folder_loads_and_its_index_stays_inside(tmp_path):
    """A sharded save_pretrained folder loads, also when its files are links into a cache as in a hub snapshot
    (there links may lead out: only the names the index records are judged); the same index naming a shard by
    '..' is refused before transformers reads anything (it joined the name to the folder and loaded it)."""
    import json

    transformers = pytest.importorskip("transformers", reason="Hugging Face folders need transformers")
    cfg = transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=16, patch_size=8
    )
    torch.manual_seed(0)
    snapshot, blobs = tmp_path / "snapshot", tmp_path / "blobs"
    transformers.ViTModel(cfg).save_pretrained(snapshot, max_shard_size="4KB")
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1, shards
    blobs.mkdir()
    for shard in shards:  # as a hub snapshot keeps them: links into ../blobs
        (snapshot / shard).rename(blobs / shard)
        (snapshot / shard).symlink_to(Path("..") / "blobs" / shard)
    model = vit_fast.load_model(str(snapshot), backend="torch")
    assert model.cfg.depth == 2
    planted = {**index, "weight_map": {k: f"../blobs/{v}" for k, v in index["weight_map"].items()}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(planted))
    with pytest.raises(ValueError, match=r"model.safetensors.index.json': weight_map\['.+'\] is '../blobs/.+', which "
                       r"climbs out of its folder through '..'"):  # fmt: skip
        vit_fast.load_model(str(snapshot), backend="torch")


# --------------------------------------------------------------------------- links that lead nowhere, bare suffixes
# With `dang -> /nonexistent/results` (a drive not mounted) or a looping link on the way, each --out / --json below
# ran the whole command, then failed with "[Errno 17] File exists: 'dang'" and the results were lost; `--out .onnx`
# passed the suffix check and failed after the export, naming a staging path. Each is now refused before any work,
# by name, with the fix; the folder (its links included) is as it was.
DANGLING = (
    r"'dang' is a symbolic link to '/nonexistent/results', which does not exist \(a drive not mounted, or a folder "
    r"moved\?\); mount or create it, fix the link, or choose another path"
)
LOOPING = r"'loop' is a symbolic link that loops \(it leads back to itself\); fix the link, or choose another path"
NO_NAME = r"has no name before its suffix"
# id -> (argv, regex naming the problem and the fix); each exits 1 with the policy's one line
LINK_CLI: dict[str, tuple[list[str], str]] = {
    "bench out under a dangling link": (["bench", "default", "--out", "dang/b"], rf"--out 'dang/b': {DANGLING}"),
    "bench out is a dangling link": (["bench", "default", "--out", "dang"], rf"--out 'dang': {DANGLING}"),
    "bench json under a dangling link": (
        ["bench", "default", "--out", "b", "--json", "dang/b.json"],
        rf"--json 'dang/b.json': {DANGLING}",
    ),
    "verify json under a dangling link": (
        ["verify", "default", "triton", "--json", "dang/v.json"],
        rf"--json 'dang/v.json': {DANGLING}",
    ),
    "doctor out under a dangling link": (["doctor", "--out", "dang/doc"], rf"--out 'dang/doc': {DANGLING}"),
    "doctor out is a dangling link": (["doctor", "--out", "dang"], rf"--out 'dang': {DANGLING}"),
    "demo out under a dangling link": (["demo", "--out", "dang/d"], rf"--out 'dang/d': {DANGLING}"),
    "info json under a dangling link": (["info", "--json", "dang/i.json"], rf"--json 'dang/i.json': {DANGLING}"),
    "serve json under a dangling link": (
        ["serve", "default", "--json", "dang/s.json"],
        rf"--json 'dang/s.json': {DANGLING}",
    ),
    "export out under a dangling link": (
        ["export", "onnx", "default", "--out", "dang/m.onnx"],
        rf"--out 'dang/m.onnx': {DANGLING}",
    ),
    "export json under a dangling link": (
        ["export", "onnx", "default", "--out", "m.onnx", "--json", "dang/r.json"],
        rf"--json 'dang/r.json': {DANGLING}",
    ),
    "export out under a chain of links": (
        ["export", "onnx", "default", "--out", "chain/m.onnx"],
        r"'chain' is a symbolic link to 'dang', then '/nonexistent/results', which does not exist",
    ),
    "tritonserver out is a dangling link": (
        ["export", "tritonserver", "default", "--out", "dang"],
        rf"model repository 'dang': {DANGLING}",
    ),
    "tritonserver out under a dangling link": (
        ["export", "tritonserver", "default", "--out", "dang/repo"],
        rf"model repository 'dang/repo': {DANGLING}",
    ),
    "bench out under a looping link": (["bench", "default", "--out", "loop/b"], rf"--out 'loop/b': {LOOPING}"),
    "verify json under a looping link": (
        ["verify", "default", "triton", "--json", "loop/v.json"],
        rf"--json 'loop/v.json': {LOOPING}",
    ),
    "doctor out under a looping link": (["doctor", "--out", "loop/doc"], rf"--out 'loop/doc': {LOOPING}"),
    "export out under a looping link": (
        ["export", "onnx", "default", "--out", "loop/m.onnx"],
        rf"--out 'loop/m.onnx': {LOOPING}",
    ),
    "export out only a suffix": (
        ["export", "onnx", "default", "--out", ".onnx"],
        rf"--out '.onnx' {NO_NAME} '.onnx' .*give it a name, e.g. 'model.onnx'",
    ),
    "export out only a suffix, in a new folder": (
        ["export", "onnx", "default", "--out", "new/.ONNX"],
        rf"--out 'new/.ONNX' {NO_NAME} '.onnx' .*e.g. 'new/model.onnx'",
    ),
    "export out dots and a suffix": (["export", "onnx", "default", "--out", "..onnx"], rf"'..onnx' {NO_NAME}"),
    "export json only a suffix": (
        ["export", "onnx", "default", "--out", "o.onnx", "--json", ".json"],
        rf"--json '.json' {NO_NAME} '.json'",
    ),
    "verify json only a suffix": (["verify", "default", "triton", "--json", ".json"], rf"--json '.json' {NO_NAME}"),
    "tensorrt out only a suffix": (
        ["export", "tensorrt", "x.onnx", "--out", ".plan"],
        rf"--out '.plan' {NO_NAME} '.plan' .*e.g. 'model.plan'",
    ),
}


@pytest.fixture
def link_folder(tmp_path, monkeypatch):
    """A folder with a dangling link (an unmounted drive behind it), a chain ending in it, and a looping link."""
    (tmp_path / "dang").symlink_to("/nonexistent/results")
    (tmp_path / "chain").symlink_to("dang")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "x.onnx").write_text("not really ONNX")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _links(folder: Path) -> dict[str, str]:
    """Every entry below ``folder`` (links not followed: a link as its target text) with a hash of its bytes."""
    out = {}
    for p in sorted(folder.rglob("*")):
        mode = p.lstat().st_mode
        kind = os.readlink(p) if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else p.read_bytes().hex()
        out[str(p.relative_to(folder))] = kind
    return out


@pytest.mark.parametrize("case", sorted(LINK_CLI))
def test_links_and_bare_suffixes_are_refused_before_any_work(case, link_folder, capsys):
    argv, message = LINK_CLI[case]
    before = _links(link_folder)
    rc, out, err = _run_cli(argv, capsys)
    assert rc == 1, f"{case}: exit {rc}; stderr: {err}"
    assert "Traceback" not in out + err and "Errno" not in err
    assert re.search(message, err), f"{case}: {message!r} not in: {err}"
    assert re.search(r"^vit-fast [a-z ]+: error: ", err.strip().splitlines()[-1]), err
    assert _links(link_folder) == before, f"{case}: the folder changed"


def test_links_that_lead_somewhere_are_followed(link_folder):
    """The neighbours: a link to a folder is a folder to write into; a link made good again is written through."""
    from vit_fast.util import files

    (link_folder / "real").mkdir()
    (link_folder / "good").symlink_to("real")
    files.write_json_atomic({files.MARKER_KEY: "t"}, files.check_report_file("good/sub/r.json"))
    assert files.written_by_vit_fast(link_folder / "real" / "sub" / "r.json")
    assert files.check_output_dir("good/deeper") == Path("good/deeper")
    with pytest.raises(ValueError, match=DANGLING):
        files.make_folders("dang/x")
    (link_folder / "dang").unlink()
    (link_folder / "dang").symlink_to("real")  # the drive is back
    assert files.make_folders("dang/x").is_dir() and (link_folder / "real" / "x").is_dir()


def test_checkpoints_and_the_api_see_the_final_name(tmp_path):
    from vit_fast import export
    from vit_fast.util import files

    with pytest.raises(ValueError, match=r"cannot tell the format of '.*\.safetensors' from its suffix ''"):
        vit_fast.save_checkpoint(_tiny(), tmp_path / ".safetensors")
    with pytest.raises(ValueError, match=rf"ONNX file '.*/\.onnx' {NO_NAME} '\.onnx'"):
        export.to_onnx(_tiny(), tmp_path / ".onnx")
    with pytest.raises(ValueError, match=rf"report '.*/\.\.json' {NO_NAME}"):
        files.check_report_file(tmp_path / "..json")
    for fine in ("m.onnx", "M.ONNX", ".m.onnx", "m..onnx"):  # a hidden name is still a name
        files.check_output_file(tmp_path / fine, (".onnx",), "ONNX file")
    assert os.listdir(tmp_path) == []


def _immutable(folder: Path, on: bool) -> None:
    proc = subprocess.run(["chattr", "+i" if on else "-i", str(folder)], capture_output=True, text=True)
    if on and proc.returncode != 0:
        pytest.skip(f"chattr +i is not permitted here (needs root and ext4/xfs): {proc.stderr.strip()}")


def test_an_unwritable_repository_is_named_with_the_fix(tmp_path, monkeypatch, capsys):
    """It gave a raw "[Errno 1] Operation not permitted"; root writes through chmod, so the folder is made immutable."""
    import shutil as _shutil

    if _shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.chdir(tmp_path)
    _immutable(ro, True)
    try:
        for out in ("ro", "ro/sub"):
            rc, _, err = _run_cli(["export", "tritonserver", "default", "--out", out, "--no-verify", "--quiet"], capsys)
            assert rc == 1 and "Errno" not in err and "Traceback" not in err, err
            assert re.search(
                rf"^vit-fast export tritonserver: error: output folder 'ro' for model repository '{out}' cannot be "
                r"written: Operation not permitted; choose a folder you can write to$",
                err.strip(),
            ), err
        from vit_fast.util import files

        with pytest.raises(files.OutputNotWritable, match=r"cannot write in folder 'ro': Operation not permitted"):
            files.make_staging(Path("ro"), "x")  # met in the middle of a run: the same words
    finally:
        _immutable(ro, False)
    assert os.listdir(ro) == []


# --------------------------------------------------------------------------- bounded input
# Issue 31, class 7. Before: a config, an HF config.json, an artifact's metadata or a checkpoint's embedded config
# nested 100,000 deep ended in a RecursionError traceback; an 8 GiB one was read whole (MemoryError); a 5000-digit
# integer gave Python's digit-limit text without the file's name; depth 20000 beside a 4-block checkpoint took 18 s
# and printed a 7 MB line; an HF config with 100000 layers built for minutes (std::bad_alloc); embed_dim or
# hidden_size 10^9: "Storage size calculation overflowed"; metadata batch [1, 10**7] tried to allocate 40 GB.
# Now each is refused before anything is read whole, built or allocated, naming the file and the field.

#: the memory these cases see as available (vit_fast.util.limits.available_bytes), so no answer depends on the machine
AVAILABLE = 8 * 10**9
DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "9" * 5000
SPARSE = 8 * 2**30  # made with truncate: nothing is written


def _sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(SPARSE)


@pytest.fixture(scope="module")
def bounded_folder(tmp_path_factory) -> Path:
    import json

    from safetensors.torch import save_file

    from vit_fast import export

    folder = tmp_path_factory.mktemp("bounded")
    model = _tiny()
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(folder / "plain.safetensors"))
    four = VisionTransformer(ViTConfig(**{**TINY, "depth": 4}), backend="torch")
    save_file({k: v.contiguous() for k, v in four.state_dict().items()}, str(folder / "plain4.safetensors"))
    vit_fast.save_checkpoint(model, folder / "tiny.safetensors")
    fields = {**TINY, "mlp_ratio": 4.0}
    configs = {
        "deep.json": DEEP,
        "deepobj.json": '{"a": ' * 100_000 + "1" + "}" * 100_000,
        "bigint.json": json.dumps({**fields, "depth": 1}).replace('"depth": 1', f'"depth": {HUGE_INT}'),
        "depth20000.json": json.dumps({**fields, "depth": 20000}),
        "depth1000.json": json.dumps({**fields, "depth": 1000}),
        "embed1e9.json": json.dumps({**fields, "embed_dim": 10**9, "num_heads": 1}),
        "wide.json": json.dumps({**fields, "embed_dim": 60000, "num_heads": 2}),
    }
    for name, text in configs.items():
        (folder / name).write_text(text)
    _sparse(folder / "sparse.json")
    hf = {
        "model_type": "vit",
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "image_size": 16,
        "patch_size": 8,
        "architectures": ["ViTModel"],
    }
    hf_cases = {
        "hflayers": {"num_hidden_layers": 100_000},
        "hfhidden": {"hidden_size": 10**9, "num_attention_heads": 1},
        "hfwide": {"hidden_size": 60000, "intermediate_size": 240000},
    }
    for name, change in hf_cases.items():
        (folder / f"{name}.json").write_text(json.dumps({**hf, **change}))
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps({**hf, **change}))
    (folder / "hfdeep").mkdir()
    (folder / "hfdeep" / "config.json").write_text(DEEP)
    (folder / "hfsparse").mkdir()
    _sparse(folder / "hfsparse" / "config.json")
    for name, text in [("deepcfg", DEEP), ("bigintcfg", configs["bigint.json"])]:
        save_file(tensors, str(folder / f"{name}.safetensors"), {"vit_fast_config": text})
    _deep_config_pth(folder / "deepcfg.pth")
    # an artifact, and copies of it whose metadata is too deep, too large, too long, or asks for too large a batch
    export.to_onnx(model, folder / "m.onnx", batch=(1, 2), exporter="torchscript", progress=False, verify=False)
    meta = json.loads((folder / "m.onnx.json").read_text())
    variants = {
        "deepmeta": DEEP,
        "longbatch": json.dumps({**meta, "batch": [1, 2]}).replace('"batch": [1, 2]', f'"batch": [1, {HUGE_INT}]'),
        "bigbatch": json.dumps({**meta, "batch": [1, 10**7]}),
        "textbatch": json.dumps({**meta, "batch": [1, "x"]}),
    }
    for name, text in variants.items():
        (folder / f"{name}.onnx").write_bytes((folder / "m.onnx").read_bytes())
        (folder / f"{name}.onnx.json").write_text(text)
    (folder / "sparsemeta.onnx").write_bytes((folder / "m.onnx").read_bytes())
    _sparse(folder / "sparsemeta.onnx.json")
    # names that are not UTF-8 (class 8): ONNX, ONNX Runtime and safetensors cannot open them
    (folder / os.fsdecode(b"\xfe.onnx")).write_bytes((folder / "m.onnx").read_bytes())
    (folder / os.fsdecode(b"\xfe.onnx.json")).write_bytes((folder / "m.onnx.json").read_bytes())
    (folder / os.fsdecode(b"\xfd.safetensors")).write_bytes((folder / "tiny.safetensors").read_bytes())
    return folder


def _deep_config_pth(path: Path) -> None:
    """A torch.save archive whose ``config`` is a dict nested 100,000 deep, as a crafted file holds it (torch.save
    itself cannot write one; the unpickler builds it without recursion, json.dumps then recursed)."""
    import zipfile

    torch.save({"config": {}, "state_dict": {}}, path.with_suffix(".tmp"))

    def text(t: str) -> bytes:
        return b"X" + len(t).to_bytes(4, "little") + t.encode()

    pickled = b"\x80\x02}" + text("config") + b"}" + (text("a") + b"}") * 100_000 + b"s" * 100_001
    pickled += text("state_dict") + b"}s."
    with zipfile.ZipFile(path.with_suffix(".tmp")) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, pickled if item.filename.endswith("data.pkl") else src.read(item.filename))
    path.with_suffix(".tmp").unlink()


def _snapshot_sparse(folder: Path) -> dict[str, object]:
    """Like _snapshot_any, but a file over 1 MiB (a sparse 8 GiB one) is recorded by size and time, never read."""
    out: dict[str, object] = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode) and st.st_size > 2**20:
            out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
        elif stat.S_ISREG(st.st_mode):
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p.relative_to(folder))] = "dir" if stat.S_ISDIR(st.st_mode) else f"special {st.st_mode:o}"
    return out


VERIFY = ["verify", "plain.safetensors", "triton", "--config"]
BOUNDED_CLI: dict[str, tuple[list[str], int, str]] = {
    "config nested 100,000 deep": (
        [*VERIFY, "deep.json"],
        1,
        r"config 'deep.json' nests arrays and objects more than 64 levels deep .*give the right file",
    ),
    "config object nested 100,000 deep": ([*VERIFY, "deepobj.json"], 1, r"'deepobj.json' nests .* more than 64"),
    "config of 8 GiB": (
        [*VERIFY, "sparse.json"],
        1,
        r"config 'sparse.json' is 8.0 GiB, more than the 16.0 MiB vit-fast reads as JSON .*give the right file",
    ),
    "config with a 5000-digit integer": (
        [*VERIFY, "bigint.json"],
        1,
        r"config 'bigint.json': field 'depth' holds a 5000-digit integer; vit-fast reads integers of at most 40 "
        r"digits: fix that field",
    ),
    "config depth 20000": (
        ["verify", "plain4.safetensors", "triton", "--config", "depth20000.json"],
        1,
        r"config file 'depth20000.json': ViTConfig.depth is 20000, above the largest vit-fast builds \(1024;.*"
        r"fix the file",
    ),
    "config depth beside a 4-block checkpoint": (
        ["verify", "plain4.safetensors", "triton", "--config", "depth1000.json"],
        1,
        r"^vit-fast verify: error: config 'depth1000.json' says depth 1000, but the weights from 'plain4.safetensors' "
        r"hold 4 blocks \(blocks.0 to blocks.3\): fix the field 'depth'.{0,120}$",
    ),
    "config embed_dim 10^9": (
        [*VERIFY, "embed1e9.json"],
        1,
        r"config file 'embed1e9.json': ViTConfig.embed_dim is 1000000000, above the largest vit-fast builds \(65536",
    ),
    "config larger than the memory": (
        [*VERIFY, "wide.json"],
        1,
        r"config file 'wide.json': the model has 43,213,020,003 parameters, 86.4 GB at 2 bytes each, more than the "
        r"8.0 GB of memory available here; most are in its blocks \(depth=1, embed_dim=60000, mlp_ratio=4.0\): fix "
        r"depth, embed_dim or mlp_ratio",
    ),
    "HF config num_hidden_layers 100000": (
        [*VERIFY, "hflayers.json"],
        1,
        r"Hugging Face config 'hflayers.json': field 'num_hidden_layers' is 100000, above the largest vit-fast builds "
        r"\(1024;.*fix that field in the file",
    ),
    "HF config hidden_size 10^9": (
        [*VERIFY, "hfhidden.json"],
        1,
        r"Hugging Face config 'hfhidden.json': field 'hidden_size' is 1000000000, above .*fix that field in the file",
    ),
    "HF folder num_hidden_layers 100000": (
        ["verify", "hflayers", "triton"],
        1,
        r"Hugging Face config 'hflayers/config.json': field 'num_hidden_layers' is 100000, above",
    ),
    "HF folder hidden_size 10^9": (
        ["verify", "hfhidden", "triton"],
        1,
        r"Hugging Face config 'hfhidden/config.json': field 'hidden_size' is 1000000000",
    ),
    "HF folder larger than the memory": (
        ["verify", "hfwide", "triton"],
        1,
        r"Hugging Face config 'hfwide/config.json': the model has [\d,]+ parameters, .* more than the 8.0 GB of "
        r"memory available here; most are in its blocks \(num_hidden_layers=1, hidden_size=60000, "
        r"intermediate_size=240000\): fix num_hidden_layers, hidden_size or intermediate_size",
    ),
    "HF folder config nested deep": (
        ["verify", "hfdeep", "triton"],
        1,
        r"Hugging Face config 'hfdeep/config.json' nests arrays and objects more than 64 levels deep",
    ),
    "HF folder config of 8 GiB": (
        ["verify", "hfsparse", "triton"],
        1,
        r"Hugging Face config 'hfsparse/config.json' is 8.0 GiB, more than the 16.0 MiB",
    ),
    "checkpoint's embedded config nested deep": (
        ["verify", "deepcfg.safetensors", "triton"],
        1,
        r"the config embedded in checkpoint 'deepcfg.safetensors' \(not a --config file\) nests arrays and objects "
        r"more than 64 levels deep.*give the right config with --config",
    ),
    "checkpoint's embedded config with a 5000-digit integer": (
        ["verify", "bigintcfg.safetensors", "triton"],
        1,
        r"the config embedded in checkpoint 'bigintcfg.safetensors' \(not a --config file\): field 'depth' holds a "
        r"5000-digit integer",
    ),
    "a .pth checkpoint's config nested deep": (
        ["verify", "deepcfg.pth", "triton"],
        1,
        r"the config in checkpoint 'deepcfg.pth' cannot be read \(RecursionError: nested too deep, or not plain "
        r"data\): write the checkpoint again",
    ),
    "metadata nested deep": (
        ["verify", "tiny.safetensors", "deepmeta.onnx"],
        1,
        r"metadata 'deepmeta.onnx.json' beside 'deepmeta.onnx' nests arrays and objects more than 64 levels deep",
    ),
    "metadata of 8 GiB": (
        ["verify", "tiny.safetensors", "sparsemeta.onnx"],
        1,
        r"metadata 'sparsemeta.onnx.json' beside 'sparsemeta.onnx' is 8.0 GiB, more than the 16.0 MiB",
    ),
    "metadata batch with a 5000-digit integer": (
        ["verify", "tiny.safetensors", "longbatch.onnx"],
        1,
        r"metadata 'longbatch.onnx.json' beside 'longbatch.onnx': field 'batch\[1\]' holds a 5000-digit integer",
    ),
    "metadata batch [1, 10**7]": (
        ["verify", "tiny.safetensors", "bigbatch.onnx"],
        1,
        r"verifying 'bigbatch.onnx' \(batches from the field 'batch' \[1, 10000000\] of metadata "
        r"'bigbatch.onnx.json'\), whose float64 reference: batch 10000000 of 16x16 images needs at least [\d.]+ GB, "
        r"more than the 8.0 GB of memory available here: verify with smaller batches \(--batch 1,3",
    ),
    "metadata batch not ints": (
        ["verify", "tiny.safetensors", "textbatch.onnx"],
        1,
        r"metadata 'textbatch.onnx.json': field 'batch' is unusable \(batch \(min, max\): max must be an int, got "
        r"'x' \(str\)\): export the artifact again",
    ),
    "verify --batch larger than the memory": (
        ["verify", "tiny.safetensors", "m.onnx", "--batch", "1,10000000"],
        1,
        r"batches from --batch / batches=\), whose float64 reference: batch 10000000 .*more than the 8.0 GB",
    ),
    # class 8: names that are not UTF-8, refused before any work where a library cannot open them
    "export to a non-UTF-8 name": (
        ["export", "onnx", "tiny.safetensors", "--out", os.fsdecode(b"\xff.onnx")],
        1,
        r"ONNX file b'\\xff.onnx' is not a UTF-8 path \(byte 0xff at 0\), and onnx.checker or ONNX Runtime opens "
        r"only UTF-8 paths: rename it, e.g. '_.onnx'",
    ),
    "verify a non-UTF-8 ONNX name": (
        ["verify", "tiny.safetensors", os.fsdecode(b"\xfe.onnx")],
        1,
        r"artifact b'\\xfe.onnx' is not a UTF-8 path .*ONNX Runtime opens only UTF-8 paths: rename it",
    ),
    "verify a non-UTF-8 checkpoint name": (
        ["verify", os.fsdecode(b"\xfd.safetensors"), "triton"],
        1,
        r"checkpoint b'\\xfd.safetensors' is not a UTF-8 path .*safetensors opens only UTF-8 paths: rename it",
    ),
    "Triton repository with a non-UTF-8 name": (
        ["export", "tritonserver", "tiny.safetensors", "--out", os.fsdecode(b"repo\xff")],
        1,
        r"model repository b'repo\\xff' is not a UTF-8 path",
    ),
}


@pytest.mark.parametrize("case", sorted(BOUNDED_CLI))
def test_unbounded_input_is_refused_with_the_file_and_the_field(case, bounded_folder, capsys, monkeypatch):
    import time

    from vit_fast.util import limits

    monkeypatch.chdir(bounded_folder)
    monkeypatch.setattr(limits, "available_bytes", lambda: AVAILABLE)
    argv, code, message = BOUNDED_CLI[case]
    before = _snapshot_sparse(bounded_folder)
    started = time.process_time()  # CPU seconds of this process: what the refusal cost, however loaded the machine
    rc, out, err = _run_cli(argv, capsys)
    took = time.process_time() - started
    assert rc == code, f"{case}: exit {rc}, expected {code}; stderr: {err[-2000:]}"
    assert "Traceback" not in out + err
    assert re.search(message, err, re.MULTILINE), f"{case}: {message!r} not in: {err[-2000:]}"
    assert re.search(r"^vit-fast [a-z ]+: error: ", err.strip().splitlines()[-1]), err[-2000:]
    assert len(err.strip().splitlines()[-1]) < 1000, "the error line is not one readable line"
    assert took < 60, f"{case}: {took:.0f} CPU s before the refusal"
    assert _snapshot_sparse(bounded_folder) == before, f"{case}: the folder changed"


def test_a_non_utf8_report_name_works_and_prints_as_its_bytes(tmp_path):
    """Where nothing but vit-fast opens the file, a name that is not UTF-8 is written, and printed as its bytes."""
    import json

    name = b"r\xfc.json"
    proc = subprocess.run(
        [sys.executable, "-m", "vit_fast", "info", "--json", os.fsdecode(name)], cwd=tmp_path, capture_output=True
    )
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert os.listdir(os.fsencode(tmp_path)) == [name]
    assert json.loads((tmp_path / os.fsdecode(name)).read_text())[vit_fast.util.files.MARKER_KEY]


def test_bounded_json_reader_limits():
    from vit_fast.util.files import JSON_MAX_DEPTH, JSONInputError, loads_json

    ok = '{"a": [1, {"b": "[[[{{ not brackets ]", "c": "\\"[["}], "d": -' + "9" * 40 + ', "e": 1.' + "0" * 60 + "}"
    assert loads_json(ok, "x")["d"] == -int("9" * 40)
    assert loads_json("[" * JSON_MAX_DEPTH + "]" * JSON_MAX_DEPTH, "x") is not None
    cases = [
        ("[" * (JSON_MAX_DEPTH + 1) + "]" * (JSON_MAX_DEPTH + 1), r"^src nests arrays and objects more than 64"),
        ('{"a":' * 40 + "[" * 30 + "]" * 30 + "}" * 40, r"more than 64 levels deep"),
        ('{"x": {"y": [1, ' + HUGE_INT + "]}}", r"^src: field 'x.y\[1\]' holds a 5000-digit integer"),
        ('{"x": -' + "9" * 41 + "}", r"field 'x' holds a 41-digit integer"),
        (b'{"x": "\xff"}', r"^src is not UTF-8 text \(byte 7\)"),
        ("[1, }", r"^src cannot be read as JSON \(Expecting value"),
    ]
    for text, problem in cases:
        with pytest.raises(JSONInputError, match=problem):
            loads_json(text, "src")


def test_bounded_json_reader_never_opens_a_fifo_or_reads_a_large_file(tmp_path):
    from vit_fast.util import files

    os.mkfifo(tmp_path / "fifo.json")
    _sparse(tmp_path / "big.json")
    with pytest.raises(files.JSONInputError, match=r"config '.*fifo.json' is not a regular file"):
        files.read_json(tmp_path / "fifo.json", "config")
    with pytest.raises(files.JSONInputError, match=r"'.*big.json' is 8.0 GiB"):
        files.read_json(tmp_path / "big.json")
    with pytest.raises(FileNotFoundError, match=r"metadata '.*none.json' does not exist"):
        files.read_json(tmp_path / "none.json", "metadata")
    (tmp_path / "deep.json").write_text(DEEP)
    for name in ("fifo.json", "big.json", "deep.json"):  # the never-raising reader of proofs and reports
        assert files.read_json_object(tmp_path / name) is None
        assert files.written_by_vit_fast(tmp_path / name) is False


def test_a_foreign_checkpoint_with_a_deep_header_is_refused_not_a_recursion_error(tmp_path):
    """save_checkpoint's ownership check reads a safetensors header: 100,000 levels deep raised RecursionError."""
    header = DEEP.encode()
    (tmp_path / "w.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ValueError, match=r"exists and was not written by vit-fast"):
        vit_fast.save_checkpoint(_tiny(), tmp_path / "w.safetensors")


def test_sizes_beyond_any_model_are_refused_before_building(monkeypatch):
    """Through the API: each size field's ceiling, a value too long to print, and the memory the weights need,
    all before a parameter is made."""
    import time

    from vit_fast.util import limits

    monkeypatch.setattr(limits, "available_bytes", lambda: AVAILABLE)
    cases = [
        (dict(depth=20000), r"ViTConfig.depth is 20000, above the largest vit-fast builds \(1024"),
        (dict(embed_dim=10**9, num_heads=1), r"ViTConfig.embed_dim is 1000000000, above"),
        (
            dict(mlp_ratio=1e300),
            r"ViTConfig.mlp_ratio 1e\+300 gives an MLP whose size .* is an integer of about 302",
        ),
        (dict(depth=10**5000), r"ViTConfig.depth is an integer of about 5001 digits, above"),
        (dict(depth=-(10**5000)), r"ViTConfig.depth must be an int >= 1, got a negative integer of about 5001"),
        (dict(patch_size=10**5000), r"ViTConfig.patch_size is an integer of about 5001 digits"),
        (dict(mlp_ratio=10**5000), r"ViTConfig.mlp_ratio must be a number > 0, got an integer of about 5001"),
        (dict(img_size=2**17, patch_size=2**16), r"ViTConfig.img_size: its larger side is 131072, above"),
        (dict(num_classes=10**30), r"ViTConfig.num_classes is 1000000000000000000000000000000, above"),
        (dict(in_chans=5000), r"ViTConfig.in_chans is 5000, above"),
    ]
    for fields, problem in cases:
        with pytest.raises(ValueError, match=problem):
            ViTConfig(**{**TINY, **fields})
    ViTConfig(**{**TINY, "depth": 1024})  # the ceilings themselves are allowed
    started = time.process_time()  # CPU seconds, which a loaded machine does not stretch as it does wall time
    with pytest.raises(ValueError, match=r"^ViTConfig: the model has [\d,]+ parameters, .* at 4 bytes each, more than"):
        VisionTransformer(ViTConfig(**{**TINY, "embed_dim": 60000, "num_heads": 2}))
    assert time.process_time() - started < 1.0  # refused from the numbers, nothing allocated
    cfg = ViTConfig(**TINY)
    need = limits.parameter_count(cfg) * 4
    limits.check_model_fits(cfg, available=need)  # exactly enough: built
    with pytest.raises(ValueError, match=r"more than the"):
        limits.check_model_fits(cfg, available=need - 1)


def test_parameter_count_is_the_models(monkeypatch):
    from vit_fast.util.limits import parameter_count

    variants = [{}, dict(pre_norm=True), dict(qkv_bias=False, num_classes=0), dict(global_pool="avg")]
    variants += [dict(init_values=1e-5, reg_tokens=2, no_embed_class=True), dict(class_token=False, global_pool="avg")]
    for fields in variants:
        cfg = ViTConfig(**{**TINY, **fields})
        assert parameter_count(cfg) == sum(p.numel() for p in VisionTransformer(cfg).parameters()), fields
    for name in vit_fast.PRESETS:
        cfg = ViTConfig.from_name(name)
        with torch.device("meta"):
            model = VisionTransformer(cfg)
        assert parameter_count(cfg) == sum(p.numel() for p in model.parameters()), name


def test_available_memory_is_read_from_the_machine():
    from vit_fast.util.limits import available_bytes

    found = available_bytes()
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo: the memory check is skipped here by design (ceilings still apply)")
    assert found is not None and 0 < found < 2**50


# --------------------------------------------------------------------------- closed standard streams
# Issue 31, class 8. Before: `vit-fast info >&-`, `--version >&-` and `export ... >&-` ended with "'NoneType' object
# has no attribute 'flush'" and a traceback, exit 1, the export after writing its artifact. Now a closed (or
# read-only) stream points at the null device with a note on stderr, and the command's own status stands.
def _shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` in sh, ``vit-fast`` standing for this Python's ``-m vit_fast``; stderr captured as bytes."""
    import shlex

    script = command.replace("vit-fast", f"{shlex.quote(sys.executable)} -m vit_fast")
    return subprocess.run(["sh", "-c", script], cwd=cwd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)


@pytest.mark.parametrize(
    "command, note",
    [
        ("vit-fast info >&-", "stdout is closed"),
        ("vit-fast --version >&-", "stdout is closed"),
        ("vit-fast info 1</dev/null", "stdout is open for reading only"),
        ("vit-fast info >/dev/null 2>&-", None),  # nowhere to say it: quietly
        ("vit-fast info >&- 2>&-", None),
        ("vit-fast info >/dev/null <&-", None),  # stdin is not said: nothing is read from it
    ],
)
def test_closed_streams_are_not_failures(command, note, tmp_path):
    proc = _shell(command, tmp_path)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}: {err[-2000:]}"
    assert "Traceback" not in err and "NoneType" not in err
    if note is not None:
        assert re.search(rf"^vit-fast: note: {note}; it now points at /dev/null: what goes there is lost$", err, re.M)
    assert os.listdir(tmp_path) == []


def test_an_export_with_stdout_closed_writes_its_artifact_and_succeeds(bounded_folder, tmp_path):
    (tmp_path / "tiny.safetensors").write_bytes((bounded_folder / "tiny.safetensors").read_bytes())
    proc = _shell("vit-fast export onnx tiny.safetensors --out m.onnx --batch 1,2 >&-", tmp_path)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.json", "tiny.safetensors"]
    assert vit_fast.util.files.read_json(tmp_path / "m.onnx.json")["verification"]["passed"] is True


def test_main_without_a_stdout_object_does_not_fail(monkeypatch, capsys):
    """An embedding program (or pythonw) with sys.stdout None: main() neither flushes None nor loses the status."""
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0


# --------------------------------------------------------------------------- children and temp folders
# Issue 31, class 9. Before: SIGTERM to `vit-fast doctor` left its interpreter child running as an orphan that kept
# printing, and `$TMPDIR/vit-fast-doctor-*` stayed; SIGTERM or SIGKILL to `bench` during the ONNX Runtime case left
# `$TMPDIR/vit-fast-bench-*` with a partial export, never cleaned. Now every Python child is guarded
# (vit_fast.util.children: PR_SET_PDEATHSIG and a watch of its parent), every temp folder is a staging folder in $TMPDIR
# (vit_fast.util.files.temp_staging): removed on SIGTERM (the CLI turns it into an exception that unwinds), and a
# SIGKILLed run's is removed by the next run.
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")


def _children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _until(condition: Callable[[], object], seconds: float, what: str) -> object:
    import time

    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {seconds:g} s")
        time.sleep(0.05)
    return found


def _staging_in(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f".{name}.tmp-*"))


def _start(argv: list[str], cwd: Path, tmpdir: Path) -> subprocess.Popen:
    """``vit-fast ARGV`` in ``cwd`` with ``$TMPDIR`` at ``tmpdir``, as from a shell (without the suite's
    TRITON_INTERPRET, with which the doctor would run the interpreter in itself); its stderr goes to
    ``cwd/err.txt`` (a pipe nobody reads would stop it once full)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TMPDIR": str(tmpdir)}
    with open(cwd / "err.txt", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "vit_fast", *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err
        )


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@linux_only
@skip_if_interpreter_broken  # the child would end at once with the interpreter's fault, not live on
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_doctors_child_and_folder_end_with_it(sig, tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    parent = _start(["doctor", "--out", "dd"], tmp_path, tmpdir)
    try:
        (folder,) = _until(lambda: _staging_in(tmpdir, "vit-fast-doctor"), 120, "doctor's temp folder")
        interpreter = lambda: [c for c in _children_of(parent.pid) if "vit_fast.doctor" in _cmdline(c)]  # noqa: E731
        (child,) = _until(interpreter, 120, "interpreter child")
        parent.send_signal(sig)
        code = parent.wait(60)
        _until(lambda: not _alive(child), 15, "end of the child after its parent")
        _until(lambda: not folder.exists(), 15, "removal of the temp folder")
        err = (tmp_path / "err.txt").read_text(errors="replace")
        if sig == signal.SIGTERM:  # unwound: the child stopped, the folder removed, one line, 143
            assert code == 128 + signal.SIGTERM and err.rstrip().endswith("vit-fast doctor: terminated (SIGTERM)")
            assert "Traceback" not in err
        else:  # the child was told by the kernel (PR_SET_PDEATHSIG) and removed the folder of its dead parent
            assert code == -signal.SIGKILL
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_benchs_temp_folder_ends_with_it_or_with_the_next_run(sig, bounded_folder, tmp_path):
    """During the ONNX Runtime case (its export in the temp folder, the timing long): SIGTERM removes the folder;
    after SIGKILL nobody can, and the next run that makes one removes it."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    (tmp_path / "tiny.safetensors").write_bytes((bounded_folder / "tiny.safetensors").read_bytes())
    argv = ["bench", "tiny.safetensors", "--backends", "onnxruntime", "--batch", "1", "--out", "b"]
    parent = _start([*argv, "--min-time", "300", "--max-seconds", "600"], tmp_path, tmpdir)
    try:
        (folder,) = _until(lambda: _staging_in(tmpdir, "vit-fast-bench"), 120, "bench temp folder")
        _until(lambda: list(folder.glob("*.onnx")), 120, "ONNX export in the bench's temp folder")
        parent.send_signal(sig)
        code = parent.wait(60)
        err = (tmp_path / "err.txt").read_text(errors="replace")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    if sig == signal.SIGTERM:
        assert code == 128 + signal.SIGTERM and "vit-fast bench: terminated (SIGTERM)" in err and "Traceback" not in err
        assert not folder.exists()
        return
    assert code == -signal.SIGKILL and folder.is_dir()  # nothing can run in a SIGKILLed process
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from vit_fast.util.files import temp_staging\nwith temp_staging('vit-fast-bench'): pass",
        ],
        env=dict(os.environ, TMPDIR=str(tmpdir)),
        check=True,
        timeout=120,
    )
    assert not folder.exists() and _staging_in(tmpdir, "vit-fast-bench") == []  # torch's own folders may be there


SLEEPER = "import sys, time\nprint('child up', flush=True)\ntime.sleep(600)\n"
GUARDED_PARENT = (
    "import subprocess, sys, time\n"
    "from vit_fast.util.children import guarded_python\n"
    "child = subprocess.Popen(guarded_python(['sleeper'], cleanup=sys.argv[1]), stdout=subprocess.PIPE, text=True)\n"
    "child.stdout.readline()\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


@linux_only
def test_a_guarded_child_dies_with_its_parent_and_removes_its_folder(tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    folder = tmp_path / "work"
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    parent = subprocess.Popen(
        [sys.executable, "-c", GUARDED_PARENT, str(folder)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        child = int(parent.stdout.readline())
        assert _alive(child) and folder.is_dir()
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        _until(lambda: not _alive(child), 15, "end of the guarded child")
        assert not folder.exists()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


@linux_only
def test_a_guarded_child_whose_parent_is_already_gone_does_not_run(tmp_path):
    """The parent died before the child asked for PR_SET_PDEATHSIG: the child's check of its parent ends it."""
    from vit_fast.util.children import GUARD

    (tmp_path / "sleeper.py").write_text("open('ran', 'w').close()\n")
    folder = tmp_path / "work"
    folder.mkdir()
    not_its_parent = os.getppid()  # the child's parent is this process, not ours
    proc = subprocess.run(
        [sys.executable, "-c", GUARD, str(not_its_parent), str(folder), "sleeper"], cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 128 + signal.SIGTERM
    assert not (tmp_path / "ran").exists() and not folder.exists()


def test_temp_folders_of_live_runs_and_look_alikes_are_kept(tmp_path, monkeypatch):
    """The next run removes only a dead run's folder (its marker proves it vit-fast's, its lock is free)."""
    import tempfile

    from vit_fast.util import files

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    look_alike = tmp_path / ".vit-fast-bench.tmp-0123456789abcdef"
    look_alike.mkdir()
    with files.temp_staging("vit-fast-bench") as live:
        dead = subprocess.run(
            [sys.executable, "-c", KILLED_TEMP],
            env=dict(os.environ, TMPDIR=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        dead_folder = Path(dead.stdout.strip())
        assert dead.returncode == -signal.SIGKILL and dead_folder.is_dir()
        with files.temp_staging("vit-fast-bench") as mine:
            assert live.is_dir() and look_alike.is_dir() and not dead_folder.exists()
        assert not mine.exists()
    assert not live.exists() and look_alike.is_dir()


KILLED_TEMP = (
    "import os, signal\n"
    "from vit_fast.util.files import temp_staging\n"
    "with temp_staging('vit-fast-bench') as folder:\n"
    "    print(folder, flush=True)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
)


# ------------------------------------------------------------------- issue 46: what --force and --overwrite touch
# A model folder vit-fast wrote (with its manifest, vit-fast-files.json), and the user's files in and beside it.
@pytest.fixture(scope="module")
def written_repo(tmp_path_factory) -> Path:
    """``export tritonserver default --entries python --out repo`` once: repo/default_python, vit-fast's own."""
    folder = tmp_path_factory.mktemp("written")
    old = os.getcwd()
    os.chdir(folder)
    try:
        assert main(["export", "tritonserver", "default", "--entries", "python", "--out", "repo", "--quiet"]) == 0
    finally:
        os.chdir(old)
    return folder / "repo"


@pytest.fixture
def force_folder(written_repo, tmp_path, monkeypatch):
    """A copy of ``written_repo`` with the user's files: a version folder 2/ of their own and a NOTES.md."""
    import shutil

    shutil.copytree(written_repo, tmp_path / "repo")
    model = tmp_path / "repo" / "default_python"
    (model / "2").mkdir()
    (model / "2" / "model.onnx").write_text("the user's own model")
    (model / "NOTES.md").write_text("my notes")
    monkeypatch.chdir(tmp_path)
    return tmp_path


PYTHON_ENTRY = ["export", "tritonserver", "default", "--entries", "python", "--out", "repo", "--quiet"]
FORCE_CLI: dict[str, tuple[list[str], Callable[[Path], None] | None, str]] = {
    # case 2: --overwrite is about the --json file only, never the model folders
    "overwrite for the json does not replace model folders": (
        [*PYTHON_ENTRY, "--json", "repo/s.json", "--overwrite"],
        None,
        r"'repo/default_python' exists and is not empty: pass force \(--force\)",
    ),
    # case 1: --force replaces only vit-fast's files; one of the user's where vit-fast writes stops it
    "force never replaces a hand-edited config.pbtxt": (
        [*PYTHON_ENTRY, "--force"],
        lambda f: (f / "repo/default_python/config.pbtxt").write_text("# my own config\n"),
        r"holds 'config.pbtxt' \(changed since vit-fast wrote it\) where vit-fast writes; --force replaces only the "
        r"files vit-fast wrote there: move those away yourself",
    ),
    "force never replaces a user's file in the version folder": (
        [*PYTHON_ENTRY, "--force"],
        lambda f: (f / "repo/default_python/1/labels.txt").write_text("cat\ndog\n"),
        r"holds '1/labels.txt' \(not written by vit-fast\) where vit-fast writes",
    ),
    "force never replaces a folder without vit-fast's manifest": (
        [*PYTHON_ENTRY, "--force"],
        lambda f: (f / "repo/default_python/vit-fast-files.json").unlink(),
        r"holds '1/' \(not written by vit-fast\), 'config.pbtxt' \(not written by vit-fast\), 'verification.json'",
    ),
    "force never trusts an edited manifest": (
        [*PYTHON_ENTRY, "--force"],
        lambda f: (f / "repo/default_python/vit-fast-files.json").write_text('{"files": {}}'),
        r"holds '1/' \(not written by vit-fast\), 'config.pbtxt'",
    ),
    # case 9: model names Triton loads, refused before any work
    "tritonserver hidden name": (
        [*PYTHON_ENTRY, "--name", ".hidden"],
        None,
        r"model name '\.hidden' is not usable by Triton: it starts with '\.' \(a hidden folder, never loaded\); start "
        r"it with a letter, digit or '_'",
    ),
    "tritonserver name with a separator": (
        [*PYTHON_ENTRY, "--name", "a/b"],
        None,
        r"'a/b' is not usable by Triton: it holds a path separator",
    ),
    "tritonserver name dot-dot": ([*PYTHON_ENTRY, "--name", ".."], None, r"'\.\.' is not usable by Triton"),
    "tritonserver name too long": ([*PYTHON_ENTRY, "--name", "n" * 250], None, r"250 characters .* 240 at most"),
}


@pytest.mark.parametrize("case", sorted(FORCE_CLI))
def test_force_and_overwrite_touch_only_their_own_outputs(case, force_folder, capsys):
    argv, prepare, message = FORCE_CLI[case]
    if prepare is not None:
        prepare(force_folder)
    before = _snapshot(force_folder)
    rc, out, err = _run_cli(argv, capsys)
    assert rc == 1, f"{case}: exit {rc}; stderr: {err}"
    assert "Traceback" not in out + err
    assert re.search(message, err), f"{case}: {message!r} not in: {err}"
    assert re.search(r"^vit-fast [a-z ]+: error: ", err.strip().splitlines()[-1]), err
    assert _snapshot(force_folder) == before, f"{case}: the folder changed"


def test_force_replaces_vit_fasts_files_and_keeps_and_lists_the_users(force_folder, capsys):
    """Case 1: the user's version folder 2/ and NOTES.md stay (the same files, not copies) and are named, with the
    fact that Triton serves 2/ by default; vit-fast's own files are replaced."""
    model = force_folder / "repo" / "default_python"
    theirs = {p: os.lstat(model / p).st_ino for p in ("2/model.onnx", "NOTES.md")}
    config = os.lstat(model / "config.pbtxt").st_ino
    rc, out, err = _run_cli([*PYTHON_ENTRY, "--force", "--batch", "1,4", "--json", "s.json"], capsys)
    assert rc == 0, err
    import json

    assert json.loads((force_folder / "s.json").read_text())["models"][0]["kept"] == ["2/", "NOTES.md"]
    assert re.search(
        r"kept in repo/default_python \(vit-fast did not write them, --force leaves them as they are\): 2/, NOTES\.md; "
        r"Triton serves the highest version folder by default: 2/, not the 1/ written now",
        err,
    ), err
    assert {p: os.lstat(model / p).st_ino for p in theirs} == theirs
    assert (model / "2" / "model.onnx").read_text() == "the user's own model"
    assert (model / "NOTES.md").read_text() == "my notes"
    assert (
        os.lstat(model / "config.pbtxt").st_ino != config
        and "max_batch_size: 4" in (model / "config.pbtxt").read_text()
    )
    assert sorted(p.name for p in (force_folder / "repo").iterdir()) == ["default_python"]  # no staging left
    # and again: the folder it wrote, with the user's files in it, is replaced the same way
    assert _run_cli([*PYTHON_ENTRY, "--force"], capsys)[0] == 0
    assert {p: os.lstat(model / p).st_ino for p in theirs} == theirs


# --------------------------------------------------------------------------- issue 46: Ctrl-C a library wrapped
def _wrapping_exporter(how: str):
    """An exporter that meets Ctrl-C and reports it as its own failure, as torch's dynamo exporter does 6 s in."""

    def exporter(*args, **kwargs):
        if how == "chained":  # the KeyboardInterrupt kept as the cause
            raise RuntimeError("\x1b[31mthe dynamo exporter could not trace\x1b[0m") from KeyboardInterrupt()
        message = None
        try:  # the signal arrives here; the library keeps only its text
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # never reached: the handler raises first
        except BaseException as err:  # noqa: BLE001 - what such a library does
            message = f"could not trace: {type(err).__name__}"
        raise RuntimeError(message)

    return exporter


@pytest.mark.parametrize("how", ["chained", "swallowed"])
@pytest.mark.parametrize(
    "argv",
    [
        ["export", "onnx", "default", "--out", "o.onnx", "--no-verify"],
        ["export", "tritonserver", "default", "--out", "repo", "--no-verify"],
    ],
    ids=["export onnx", "export tritonserver"],
)
def test_ctrl_c_a_library_wraps_still_means_interrupted(argv, how, tmp_path, capsys, monkeypatch):
    """Case 6: whatever the exporter makes of Ctrl-C, the command says interrupted and exits 130; no colour codes."""
    import vit_fast.export.onnx as onnx_export

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(onnx_export, "_run_exporter", _wrapping_exporter(how))
    rc, out, err = _run_cli(argv, capsys)
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == f"vit-fast {' '.join(argv[:2])}: interrupted", err
    assert "could not trace" not in err and "\x1b" not in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*") if not p.is_dir()) == []  # nothing published, no staging


def test_library_messages_pass_on_without_colour_codes(tmp_path, capsys, monkeypatch):
    import vit_fast.export.onnx as onnx_export

    def coloured(*args, **kwargs):
        raise RuntimeError("\x1b[1m\x1b[31mUnsupported operator\x1b[0m aten::foo \x1b]8;;https://x\x07link\x1b]8;;\x07")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(onnx_export, "_run_exporter", coloured)
    rc, _, err = _run_cli(["export", "onnx", "default", "--out", "o.onnx", "--no-verify"], capsys)
    assert rc == 1 and "\x1b" not in err and "\x07" not in err, repr(err)
    assert "RuntimeError: Unsupported operator aten::foo link" in err, err


class _RunsCode:
    """What a hostile checkpoint pickles: unpickling it runs a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("layout", ["zip", "legacy", "bare pickle"])
def test_a_checkpoint_with_code_is_refused_without_torchs_advice(layout, tmp_path, capsys, monkeypatch):
    """Case 5: a .pth whose pickle runs code is refused by name, with what to do (safetensors, a state_dict), never
    torch's advice to retry with weights_only=False nor a command that would unpickle it."""
    import pickle

    monkeypatch.chdir(tmp_path)
    payload = {"state_dict": _tiny().state_dict(), "x": _RunsCode("touch ran")}
    if layout == "bare pickle":
        (tmp_path / "hostile.pth").write_bytes(pickle.dumps(payload, protocol=4))
    else:
        torch.save(payload, tmp_path / "hostile.pth", _use_new_zipfile_serialization=layout == "zip")
    rc, out, err = _run_cli(["export", "onnx", "hostile.pth", "--out", "o.onnx", "--no-verify"], capsys)
    assert rc == 1 and "Traceback" not in err, err
    assert re.search(
        r"error: 'hostile.pth' holds Python objects( \(posix.system\))? whose unpickling may run code: vit-fast does "
        r"not load it, nor should anything unpickle it\. Get the weights alone .*a \.safetensors file \(preferred\), "
        r"or a state_dict saved with torch\.save\(model\.state_dict\(\), \.\.\.\)",
        err,
    ), err
    assert "weights_only=False" not in err and "python -c" not in err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "o.onnx").exists()


def _full_disk_on(monkeypatch, name: str) -> None:
    """Writing a file called ``name`` meets a full disk, as a write does: the OSError carries no file name."""
    import errno

    from vit_fast.util.files import writing

    real = writing.open_new

    @contextlib.contextmanager
    def open_new(path, mode=0o666):
        with real(path, mode) as f:
            if Path(path).name == name:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            yield f

    monkeypatch.setattr(writing, "open_new", open_new)


FULL = r"no space left on its device; free space there, or choose a path on another disk$"


def test_a_full_disk_names_the_report_the_user_asked_for(tmp_path, capsys, monkeypatch):
    """A full disk while a --json report is written names that report (bench and verify write theirs the same way)."""
    monkeypatch.chdir(tmp_path)
    _full_disk_on(monkeypatch, "r.json")
    rc, _, err = _run_cli(["info", "--json", "out/r.json"], capsys)
    assert rc == 1 and re.search(rf"^vit-fast info: error: cannot write 'out/r.json': {FULL}", err.strip(), re.M), err
    assert ".tmp-" not in err and not (tmp_path / "out" / "r.json").exists()


def test_a_full_disk_during_a_force_rebuild_names_the_users_path(force_folder, capsys, monkeypatch):
    before = _snapshot(force_folder)
    _full_disk_on(monkeypatch, "config.pbtxt")
    rc, _, err = _run_cli([*PYTHON_ENTRY, "--force"], capsys)
    assert rc == 1 and ".tmp-" not in err, err
    assert re.search(rf"error: cannot write 'repo/default_python/config.pbtxt': {FULL}", err.strip()), err
    assert _snapshot(force_folder) == before


# --------------------------------------------------------------------------- issue 46: unclear messages made clear
@pytest.fixture
def hf_folders(tmp_path, monkeypatch):
    import json

    from safetensors.torch import save_file

    for name, config in {
        "zero_mlp": {**_HF_TINY, "model_type": "vit", "intermediate_size": 0},
        "odd_heads": {**_HF_TINY, "model_type": "vit", "num_attention_heads": 3},
        "bert": {**_HF_TINY, "model_type": "bert", "architectures": ["BertModel"], "vocab_size": 50},
        "deit": {**_HF_TINY, "model_type": "deit", "architectures": ["DeiTModel"]},
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in _tiny().state_dict().items()}, str(tmp_path / "plain.safetensors"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


HF_CLI: dict[str, tuple[list[str], str]] = {
    "HF intermediate_size 0 named by its own key": (
        ["export", "onnx", "zero_mlp", "--out", "o.onnx"],
        r"Hugging Face config 'zero_mlp/config.json': intermediate_size must be an int >= 1, got 0: fix that field",
    ),
    "HF heads named by their own keys": (
        ["export", "onnx", "odd_heads", "--out", "o.onnx"],
        r"hidden_size 32 is not divisible by num_attention_heads 3: fix that field",
    ),
    "HF config passed as --config named by its own key": (
        ["export", "onnx", "plain.safetensors", "--config", "zero_mlp/config.json", "--out", "o.onnx"],
        r"intermediate_size must be an int >= 1, got 0",
    ),
    "HF bert folder refused before loading": (
        ["export", "onnx", "bert", "--out", "o.onnx"],
        r"Hugging Face folder 'bert' is a 'bert' model \(config.json's model_type\), which vit-fast does not load: it "
        r"takes model_type 'vit'.*give a Hugging Face ViT model",
    ),
    "HF deit folder refused before loading": (["verify", "deit", "triton"], r"'deit' is a 'deit' model"),
    "HF bert config passed as --config": (
        ["export", "onnx", "plain.safetensors", "--config", "bert/config.json", "--out", "o.onnx"],
        r"Hugging Face config 'bert/config.json' is a 'bert' model",
    ),
}


@pytest.mark.parametrize("case", sorted(HF_CLI))
def test_hugging_face_configs_are_refused_in_their_own_words(case, hf_folders, capsys):
    pytest.importorskip("transformers", reason="the hf extra reads Hugging Face folders")
    argv, message = HF_CLI[case]
    before = _snapshot(hf_folders)
    rc, out, err = _run_cli(argv, capsys)
    assert rc == 1 and "Traceback" not in out + err, err
    assert re.search(message, err), f"{case}: {message!r} not in: {err}"
    assert "mlp_ratio" not in err and "embed_dim" not in err and "BertModel" not in err, err
    assert len(err.strip().splitlines()) == 1, err  # nothing loaded: no weight report before the refusal
    assert _snapshot(hf_folders) == before


@pytest.fixture
def out_folder(tmp_path, monkeypatch):
    (tmp_path / "isdir.onnx").mkdir()
    (tmp_path / "isdir.json").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


OUT_CLI: dict[str, tuple[list[str], int, str]] = {
    "out an existing folder with a suffix": (
        ["export", "onnx", "default", "--out", "isdir.onnx"],
        1,
        r"--out 'isdir.onnx' is a folder; give a file path such as 'isdir.onnx/model.onnx'$",
    ),
    "out with a trailing slash": (
        ["export", "onnx", "default", "--out", "trail/"],
        1,
        r"--out 'trail/' is a folder; give a file path such as 'trail/model.onnx'$",
    ),
    "engine out with a trailing slash": (
        ["export", "tensorrt", "m.onnx", "--out", "trail/"],
        1,
        r"--out 'trail/' is a folder; give a file path such as 'trail/model.plan'$",
    ),
    "json with a trailing slash": (
        ["info", "--json", "new/"],
        2,
        r"--json: 'new/' is a folder \(it ends in '/'\): give a file path such as 'new/report.json'",
    ),
    "json an existing folder with a trailing slash": (
        ["verify", "default", "triton", "--json", "isdir.json/"],
        1,
        r"--json 'isdir.json/' is a folder; give a file path such as 'isdir.json/report.json'$",
    ),
    "bench with neither out nor json": (
        ["bench", "default"],
        1,
        r"bench writes its reports into a folder: give --out DIR, or --json - \(or --json FILE\)",
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_CLI))
def test_output_paths_that_name_folders_are_refused_as_folders(case, out_folder, capsys):
    argv, code, message = OUT_CLI[case]
    before = _snapshot(out_folder)
    rc, out, err = _run_cli(argv, capsys)
    assert rc == code, f"{case}: exit {rc}; stderr: {err}"
    assert "Traceback" not in out + err and "wrong suffix" not in err
    assert re.search(message, err.strip()), f"{case}: {message!r} not in: {err}"
    assert _snapshot(out_folder) == before


def test_the_folder_a_refusal_suggests_passes_the_suffix_check(out_folder):
    from vit_fast.util.files import check_output_file

    with pytest.raises(ValueError, match=r"is a folder; give a file path such as 'isdir.onnx/model.onnx'") as info:
        check_output_file("isdir.onnx", (".onnx",), "ONNX file")
    suggested = re.search(r"such as '([^']+)'", str(info.value)).group(1)
    assert check_output_file(suggested, (".onnx",), "ONNX file") == Path(suggested)
    with pytest.raises(ValueError, match=r"'trail/' is a folder"):
        check_output_file("trail/", (".onnx",), "ONNX file", make_parents=True)


@pytest.mark.parametrize(
    "argv",
    [["info", "--json", "new/dir/i.json"], [*PYTHON_ENTRY[:-3], "--out", "new/dir/repo", "--quiet"]],
    ids=["a report", "a model repository"],
)
def test_missing_folders_are_made_and_said_by_every_command(argv, out_folder, capsys):
    """One behaviour: a missing folder on the way to an output is made, and the command says so before the work."""
    rc, _, err = _run_cli(argv, capsys)
    assert rc == 0, err
    assert re.search(r"vit-fast: note: --(json|out): folder 'new/dir' does not exist; it is made when the", err)
    assert (out_folder / "new" / "dir").is_dir()


def test_bench_json_to_stdout_needs_no_folder(out_folder, capsys, monkeypatch):
    """`bench --json -` writes the JSON report to stdout and leaves no folder or file behind."""
    import json

    import vit_fast.bench as bench
    from vit_fast.util.files import write_json_atomic

    seen = {}

    def run_benchmark(settings, log, name):
        seen["out_dir"] = settings.out_dir
        path = write_json_atomic({"rows": [{"status": "ok"}], "model": name}, Path(settings.out_dir) / "bench.json")
        return {"rows": [{"status": "ok"}]}, {"json": path}

    monkeypatch.setattr(bench, "run_benchmark", run_benchmark)
    monkeypatch.setattr(bench, "markdown_report", lambda report: "table")
    rc, out, err = _run_cli(["bench", "default", "--json", "-", "--quiet"], capsys)
    assert rc == 0, err
    assert json.loads(out)["model"] == "default"
    assert not Path(seen["out_dir"]).exists() and _snapshot(out_folder) == {"isdir.json": "dir", "isdir.onnx": "dir"}
    assert "wrote" not in err  # the private folder's files are never named
