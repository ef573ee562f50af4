"""benchmarks/pipeline.py: both rows measured on the embedded model, bounded arguments, its JSON through the writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..fakes import load_script

pytest.importorskip("PIL", reason="Pillow (the images extra) decodes the images")
ROOT = Path(__file__).resolve().parents[2]


def test_both_rows_are_measured_and_written(tmp_path, capsys):
    script = load_script(ROOT / "benchmarks" / "pipeline.py", "pipeline_script")
    out = tmp_path / "pipeline.json"
    argv = ["--models", "default", "--images", "3", "--repeats", "1", "--batch", "2", "--json", str(out)]
    assert script.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"].split(" (")[0] for r in rows] == ["by hand", "predict"]
    assert all(r["model"] == "default" and r["images"] == 3 and r["images_per_s"] > 0 for r in rows)
    assert "images/s" in capsys.readouterr().out
    (skipped,) = json.loads(out.read_text())["skipped"]  # the digits model is grayscale: the kernel takes RGB
    assert skipped["path"] == "predict, fused preprocessing kernel" and "3 channels" in skipped["skipped"]
    from vit_fast.util.files import written_by_vit_fast

    assert written_by_vit_fast(out)


def test_the_fused_kernel_row_is_measured_and_labelled_as_the_interpreter(tmp_path, capsys):
    """An RGB preset: the third row runs predict with the fused kernel (Triton's interpreter here, which the label
    says), on --interpreter-images of the files; 8x8 sources keep the interpreter's work small."""
    from vit_fast.base.interpret import interpreter_enabled

    if not interpreter_enabled():
        pytest.skip("the fused kernel runs on the CPU only in Triton's interpreter (TRITON_INTERPRET=1)")
    script = load_script(ROOT / "benchmarks" / "pipeline.py", "pipeline_script")
    out = tmp_path / "pipeline.json"
    argv = ["--models", "vit_tiny_patch16_224", "--images", "2", "--interpreter-images", "1", "--size", "8x8"]
    assert script.main([*argv, "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"].split(" (")[0] for r in rows] == ["by hand", "predict", "predict, fused preprocessing kernel"]
    assert "Triton interpreter on the CPU, not GPU speed" in rows[2]["path"] and rows[2]["images"] == 1
    assert all(r["images_per_s"] > 0 for r in rows) and "images/s" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--images", "0"], r"--images: must be an int from 1 to 10000, got '0'"),
        (["--models", "resnet50"], r"'resnet50' is neither default nor a preset"),
        (["--size", "3x4"], r"expected HxW pixels, each 8 to 4096"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(argv, message, capsys):
    import re

    script = load_script(ROOT / "benchmarks" / "pipeline.py", "pipeline_script")
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    assert exit_.value.code == 2 and re.search(message, capsys.readouterr().err)
