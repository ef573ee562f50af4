"""The files of a Triton model repository stay the same byte for byte: a python entry and an engine entry (no
export, so quick) written through ``vit-fast export tritonserver`` are compared with the files the writer wrote
before its code moved, the line naming the version, commit and date and the file marker's digest set aside."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from pathlib import Path

import vit_fast
from vit_fast.cli import tritonserver as cli
from vit_fast.export.tritonserver import TEMPLATE

WRITTEN_BY = re.compile(r"^# written by vit-fast \S+ \(commit \S+\) on \d{4}-\d{2}-\d{2}\n")

PYTHON_CONFIG = """\
# source: default
# verification: the module itself; check its triton backend with `vit-fast verify MODEL triton`
# runs triton kernels on KIND_GPU instances, the torch backend (eager PyTorch) on KIND_CPU; needs vit-fast installed \
in the Python of Triton's python backend: a wheel from `make wheel`, or pip install -e . in a vit-fast checkout
name: "default_python"
backend: "python"
max_batch_size: 32
input [
  {
    name: "images"
    data_type: TYPE_FP16
    dims: [ 1, 32, 32 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP16
    dims: [ 10 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_GPU
  }
]
dynamic_batching {
  preferred_batch_size: [ 2, 32 ]
  max_queue_delay_microseconds: 7
}
parameters {
  key: "vit_fast.dtype"
  value: { string_value: "fp16" }
}
"""
PYTHON_RECORD = {"note": "no artifact: the entry serves the vit-fast module itself", "passed": None}

ENGINE_CONFIG = """\
# source: ENGINE
# verification: PASSED against eager PyTorch, worst error/bound 0.5 (TensorRT 10.x for X (sm_90))
# engine: TensorRT 10.x for X (sm_90); it loads on that GPU and TensorRT only
name: "vit"
platform: "tensorrt_plan"
max_batch_size: 32
input [
  {
    name: "images"
    data_type: TYPE_FP32
    dims: [ 1, 32, 32 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_GPU
  }
]
dynamic_batching {
  preferred_batch_size: [ 8, 32 ]
  max_queue_delay_microseconds: 100
}
"""
ENGINE_RECORD = {
    "dtype": "fp32",
    "note": "verified when the engine was built (vit-fast export tensorrt)",
    "passed": True,
    "rows": 3,
    "rule": "x",
    "runtime": "TensorRT 10.x for X (sm_90)",
    "worst_ratio": 0.5,
}


def _run(*argv: str) -> None:
    parser = argparse.ArgumentParser(prog="vit-fast export tritonserver")
    cli.add_arguments(parser)
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.run(parser.parse_args(list(argv))) == 0


def _config(folder: Path) -> str:
    text = (folder / "config.pbtxt").read_text()
    assert WRITTEN_BY.match(text), text.splitlines()[0]
    return WRITTEN_BY.sub("", text)


def _record(folder: Path) -> dict:
    record = json.loads((folder / "verification.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", record.pop("vit_fast_digest"))
    return record


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_python_entry_files_are_as_before(tmp_path) -> None:
    repo = tmp_path / "repo"
    _run("default", "--out", str(repo), "--entries", "python", "--dtype", "fp16", "--kind", "gpu",
         "--queue-delay-us", "7", "--batch", "1,2,32", "--quiet")  # fmt: skip
    folder = repo / "default_python"
    # vit-fast-files.json: the list of what vit-fast wrote, which --force replaces and nothing else
    assert _files(folder) == [
        "1/model.py", "1/model.safetensors", "config.pbtxt", "verification.json", "vit-fast-files.json"
    ]  # fmt: skip
    assert _config(folder) == PYTHON_CONFIG
    assert _record(folder) == PYTHON_RECORD
    assert (folder / "1" / "model.py").read_bytes() == TEMPLATE.read_bytes()


def test_engine_entry_files_are_as_before(tmp_path) -> None:
    engine = tmp_path / "vit.plan"
    engine.write_bytes(b"not a real engine: the repository writer reads the metadata only")
    meta = {
        "format": "tensorrt",
        "profiles": [{"input": "images", "min": [1, 1, 32, 32], "opt": [8, 1, 32, 32], "max": [32, 1, 32, 32]}],
        "precision": "fp32",
        "config": vit_fast.load_model("default").cfg.to_dict(),
        "tensorrt_version": "10.x",
        "gpu_name": "X",
        "gpu_sm": "sm_90",
        "verification": {"passed": True, "worst_ratio": 0.5, "runtime": "r", "dtype": "fp32", "rule": "x", "rows": 3},
    }
    Path(f"{engine}.json").write_text(json.dumps(meta))
    repo = tmp_path / "repo"
    _run(str(engine), "--out", str(repo), "--quiet")
    folder = repo / "vit"
    assert _files(folder) == [
        "1/model.plan", "1/model.plan.json", "config.pbtxt", "verification.json", "vit-fast-files.json"
    ]  # fmt: skip
    assert _config(folder) == ENGINE_CONFIG.replace("ENGINE", str(engine.resolve()))
    assert _record(folder) == ENGINE_RECORD
    assert (folder / "1" / "model.plan").read_bytes() == engine.read_bytes()
    assert (folder / "1" / "model.plan.json").read_bytes() == Path(f"{engine}.json").read_bytes()
