"""Progress on long steps: verification says each batch as it goes and about how long is left, GPU-sized work on
a CPU is announced before it starts with a smaller command to try, and the exporter adds no torchvision lines."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch

import vit_fast
from vit_fast import export
from vit_fast.progress import LONG_CPU_GFLOP, Remaining, duration, long_cpu_note, plural

CFG = dict(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=5)


def test_duration_and_remaining(monkeypatch):
    assert [duration(s) for s in (5, 89, 300, 7200)] == ["5 s", "89 s", "5.0 min", "2.0 h"]
    clock = iter([0.0, 10.0, 30.0])
    monkeypatch.setattr("vit_fast.progress.time.perf_counter", lambda: next(clock))
    left = Remaining(4)
    assert left.advance(1) == "; about 30 s left"  # 1 of 4 in 10 s: 3 more take 30 s
    assert left.advance(3) == ""  # done: nothing left to say


def test_plural_takes_the_count():
    assert plural(1, "torch thread") == "1 torch thread" and plural(2, "torch thread") == "2 torch threads"
    assert plural(0, "image") == "0 images" and plural(1, "batch", "batches") == "1 batch"
    assert plural(3, "batch", "batches") == "3 batches"


def test_long_cpu_note_names_the_work_and_the_smaller_command():
    assert long_cpu_note(LONG_CPU_GFLOP / 2, "x", "--batch 1") is None
    note = long_cpu_note(1700.0, "verifying vitb16.onnx at batches 1,32,64", "--batch 1,3")
    assert "1,700 GFLOP on a CPU" in note and "sized for a GPU" in note and "(try --batch 1,3)" in note


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    torch.manual_seed(0)
    model = vit_fast.VisionTransformer(vit_fast.ViTConfig(**CFG), backend="torch").eval()
    path = tmp_path_factory.mktemp("onnx") / "t.onnx"
    export.to_onnx(model, path, batch=(1, 4), exporter="torchscript", progress=False, verify=False)
    return model, path


def test_verify_reports_each_batch_and_what_is_left(tiny_onnx, capsys):
    model, path = tiny_onnx
    export.verify(model, path, batches=[1, 2, 4], seed=0, print_table=False, progress=True)
    err = capsys.readouterr().err.splitlines()
    starts = [line for line in err if line.endswith("...") and "[vit-fast verify] batch" in line]
    assert [s.split(" at ")[0].split()[-1] for s in starts] == ["1", "2", "4"]
    assert "(1/3)" in starts[0] and "(3/3)" in starts[2]
    done = [line for line in err if ": done (" in line]
    assert len(done) == 3
    assert all("left" in line for line in done[:2]) and "left" not in done[2]
    assert not any("GFLOP on a CPU" in line for line in err)  # a tiny model is no GPU-sized work


def test_verify_is_silent_without_progress(tiny_onnx, capsys):
    model, path = tiny_onnx
    export.verify(model, path, batches=[1], seed=0, print_table=False)
    assert capsys.readouterr().err == ""


def test_verify_announces_gpu_sized_work_on_a_cpu(tiny_onnx, capsys, monkeypatch):
    """The same run, with the model's FLOPs read as ViT-L/16's (61.6 GFLOP an image: 7 images, each run three
    times, are over progress.LONG_CPU_GFLOP): the note comes before the first batch."""
    model, path = tiny_onnx
    monkeypatch.setattr("vit_fast.model.count_flops", lambda cfg: 61.6e9)
    export.verify(model, path, batches=[1, 2, 4], seed=0, print_table=False, progress=True)
    err = capsys.readouterr().err.splitlines()
    assert "GFLOP on a CPU, sized for a GPU" in err[0] and "(try --batch 1,2 (batches=[1, 2])" in err[0]
    assert "batch 1 at" in err[1]


def test_quiet_registration_silences_torchvision_lines_and_restores_the_level(caplog):
    from vit_fast.export.onnx import _REGISTRATION_LOGGER, _quiet_registration

    logger = logging.getLogger(_REGISTRATION_LOGGER)
    before = logger.level
    with caplog.at_level(logging.WARNING, logger=_REGISTRATION_LOGGER):
        with _quiet_registration():
            logger.warning("torchvision is not installed. Skipping torchvision::nms")
        assert not caplog.records
    assert logger.level == before


@pytest.mark.slow
def test_dynamo_export_prints_no_torchvision_lines(tmp_path):
    """A fresh process (torch's op registry fills once per process) exports with the dynamo exporter: no line
    about torchvision's detection ops reaches stderr."""
    code = textwrap.dedent(
        f"""
        import torch, vit_fast
        from vit_fast import export
        model = vit_fast.VisionTransformer(vit_fast.ViTConfig(**{CFG!r}), backend="torch").eval()
        export.to_onnx(model, {str(tmp_path / "d.onnx")!r}, batch=(1, 2), exporter="dynamo", progress=False,
                       verify=False)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "torchvision" not in result.stderr, result.stderr


def test_training_says_each_reported_epoch_and_what_is_left(tmp_path, capsys):
    """The retrain of the embedded model (tiny here): the first epoch is always reported (it says how long the
    whole run will take), the last one too; no line in between at --log-every 5."""
    from vit_fast import training

    argv = ["--out", str(tmp_path), "--epochs", "3", "--embed-dim", "16", "--depth", "1", "--heads", "2"]
    assert training.main([*argv, "--threads", "1", "--log-every", "5"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("epoch")]
    assert [ln.split()[1] for ln in lines] == ["1/3", "3/3"], lines
    assert "left" in lines[0]
