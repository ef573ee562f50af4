"""perf_analyzer sending image files to `vit-fast serve --encoded`: the --input-data JSON that
vit_fast.serve.encoded.perf_analyzer_data makes and benchmarks/serve_perf.py writes (--images, --write-input-data),
and the table of a run with no plain side. perf_analyzer itself does not run here (see docs/deploy.md)."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from vit_fast.serve.encoded import ENCODED_INPUT, perf_analyzer_data

from ..fakes import load_script

ROOT = Path(__file__).resolve().parents[2]


def _element(step: dict) -> bytes:
    tensor = step[ENCODED_INPUT]
    assert set(tensor) == {"content", "shape"} and tensor["shape"] == [1] and set(tensor["content"]) == {"b64"}
    return base64.b64decode(tensor["content"]["b64"])


def test_each_image_is_one_bytes_element_as_tritons_clients_serialize_it():
    blobs = [b"\xff\xd8\xff\xe0 a jpeg", bytes(range(256)) * 3, b"\x89PNG\r\n\x1a\n"]
    data = json.loads(perf_analyzer_data(blobs))
    assert list(data) == ["data"] and len(data["data"]) == 3  # perf_analyzer refuses any other top-level member
    for step, blob in zip(data["data"], blobs, strict=True):
        raw = _element(step)
        assert raw == struct.pack("<I", len(blob)) + blob
    with pytest.raises(ValueError, match="at least one image"):
        perf_analyzer_data([])


def test_the_serialization_is_tritonclients():
    utils = pytest.importorskip("tritonclient.utils", reason="tritonclient (the serve extra) serializes BYTES tensors")
    blob = b"\x00\x01 image \xff"
    step = json.loads(perf_analyzer_data([blob]))["data"][0]
    assert _element(step) == utils.serialize_byte_tensor(np.array([blob], dtype=np.object_)).item()


def test_serve_perf_writes_the_input_data_of_a_folder_and_never_overwrites(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = load_script(ROOT / "benchmarks" / "serve_perf.py", "serve_perf_script")
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "b.png").write_bytes(b"\x89PNG second")
    (folder / "a.jpg").write_bytes(b"\xff\xd8\xff first")
    out = tmp_path / "data" / "images.json"
    (tmp_path / "data").mkdir()
    script.main(["--images", str(folder), "--write-input-data", str(out)])
    assert f"wrote {out}: 2 images" in capsys.readouterr().out
    steps = json.loads(out.read_text())["data"]
    assert [_element(s)[4:] for s in steps] == [b"\xff\xd8\xff first", b"\x89PNG second"]  # sorted by name
    before = out.read_bytes()
    for argv, says in (
        (["--images", str(folder), "--write-input-data", str(out)], "images.json"),
        (["--write-input-data", str(tmp_path / "x.json")], "--write-input-data goes with --images"),
        (["--images", str(tmp_path / "none"), "--write-input-data", str(tmp_path / "y.json")], "does not exist"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            script.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and says in err and "Traceback" not in err, err
    assert out.read_bytes() == before and not (tmp_path / "y.json").exists()


def test_the_table_of_an_encoded_run_has_no_plain_side():
    script = load_script(ROOT / "benchmarks" / "serve_perf.py", "serve_perf_script")
    ours = {"inferences_per_s": 120.0, "p50_ms": 8.0, "p99_ms": 20.0, "load": 1.5, "runs": [120.0, 110.0]}
    row = script.table([{"protocol": "grpc", "batch": 8, "concurrency": 2, "vit-fast": ours}]).splitlines()[-1]
    assert row == "| grpc | 8 | 2 | 120.0 | - | - | 8.0 / 20.0 | - | - | 1.5 | - |"
