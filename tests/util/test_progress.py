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
from vit_fast.util import progress
from vit_fast.util.progress import LONG_CPU_GFLOP, Remaining, duration, long_cpu_note, plural

CFG = dict(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=5)


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def run(self, seconds: float) -> None:
        self.now += seconds


def test_plural_takes_the_count():
    assert plural(1, "torch thread") == "1 torch thread" and plural(2, "torch thread") == "2 torch threads"
    assert plural(0, "image") == "0 images" and plural(1, "batch", "batches") == "1 batch"
    assert plural(3, "batch", "batches") == "3 batches"


def test_duration_and_remaining_from_measured_times():
    assert [duration(s) for s in (0.2, 5, 89, 300, 7200)] == ["under 1 s", "5 s", "89 s", "5.0 min", "2.0 h"]
    clock = FakeClock()
    left = Remaining([1, 1, 1, 1], clock=clock)
    assert left.seconds_left() is None and left.text() == ""  # nothing measured: nothing said
    clock.run(10)
    left.finished(0)
    assert left.text() == "; about 30 s left"  # 3 more pieces like the one that took 10 s
    clock.run(20)
    left.finished(1)  # the pieces alike took 10 s and 20 s: 15 s a piece
    assert left.seconds_left() == pytest.approx(30.0)
    for i in (2, 3):
        left.finished(i, seconds=1.0)
    assert left.seconds_left() == 0.0 and left.text() == ""  # done: nothing left to say
    with pytest.raises(ValueError, match="finite cost > 0"):
        Remaining([1, 0])


def test_remaining_waits_for_a_piece_of_comparable_cost():
    """Batch 1 then batch 8 of two backends (costs 1 and 8): after the batch-1 case nothing is said (a batch-8 case
    is not predicted from a batch-1 one); after the batch-8 case every piece left has a measured neighbour."""
    clock = FakeClock()
    left = Remaining([1, 8, 1, 8], clock=clock)
    clock.run(2.0)
    left.finished(0)
    assert left.seconds_left() is None
    clock.run(12.0)
    left.finished(1)
    assert left.seconds_left() == pytest.approx(2.0 + 12.0)  # each piece left predicted by the one of its size
    left.expect(3, 16)  # the caller learns the last piece costs twice what it thought: still within 4x of 8
    assert left.seconds_left() == pytest.approx(2.0 + 24.0)
    left.skip(2)  # it will not run (unavailable): neither predicted nor predicting
    assert left.seconds_left() == pytest.approx(24.0)
    left.expect(3, 100)  # no finished piece within 4x of it any more
    assert left.seconds_left() is None


def test_the_estimate_does_not_jump():
    """A bench-like run: four backends at batches 1, 8, 64, each case's time its cost times its backend's speed.
    Nothing is said while a size has no measured case; once the estimate shows, elapsed + left stays within 25%
    of the real total at every case (a share-of-work extrapolation after the first case says 1/12 of the work
    took 2 s, so about 22 s left, for a run of about 570 s)."""
    costs = [1, 8, 64] * 4
    speed = [1.0, 1.0, 1.0, 0.8, 0.8, 0.8, 1.2, 1.2, 1.2, 0.9, 0.9, 0.9]
    seconds = [2 * c * k for c, k in zip(costs, speed, strict=True)]
    total = sum(seconds)
    clock = FakeClock()
    left = Remaining(costs, clock=clock)
    said = []
    for i, t in enumerate(seconds[:-1]):
        clock.run(t)
        left.finished(i)
        said.append((clock.now, left.seconds_left()))
    assert [left for _, left in said[:2]] == [None, None]  # batches 1 and 8 measured: the 64s not predicted yet
    for i, (elapsed, estimate) in enumerate(said[2:], start=2):
        assert estimate is not None
        assert abs(elapsed + estimate - total) <= 0.25 * total, (i, elapsed + estimate, total)


def test_the_line_bar_says_the_time_left_only_once_it_is_measured(capsys, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr("vit_fast.util.progress.time.perf_counter", clock)
    bar = progress.bar(3, "bench", costs=[1, 1, 100])
    bar.set_postfix_str("first")
    clock.run(5)
    bar.write("[bench] 1/3 done: 5 s")
    bar.update(1)
    bar.set_postfix_str("second")  # the third piece (100x) has no measured neighbour: no estimate
    clock.run(5)
    bar.update(1)
    bar.remaining.expect(2, 2)  # the caller learns it is small after all
    bar.set_postfix_str("third")
    bar.close()
    assert capsys.readouterr().err.splitlines() == [
        "[bench] 1/3 cases: first",
        "[bench] 1/3 done: 5 s",
        "[bench] 2/3 cases: second",
        "[bench] 3/3 cases: third; about 10 s left",
    ]


def test_long_cpu_note_names_the_work_the_time_and_the_smaller_command():
    assert long_cpu_note(LONG_CPU_GFLOP / 2, "x", "--batch 1") is None
    note = long_cpu_note(1700.0, "verifying vitb16.onnx at batches 1,32,64", "--batch 1,3")
    assert "1,700 GFLOP on a CPU" in note and "sized for a GPU" in note and "(try --batch 1,3)" in note
    note = long_cpu_note(1700.0, "w", "--batch 1: about 40 s", "expected about 2.0 h (timed here)")
    assert note == (
        "w: 1,700 GFLOP on a CPU, sized for a GPU; expected about 2.0 h (timed here) (try --batch 1: about 40 s)"
    )


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
    monkeypatch.setattr("vit_fast.model.vit.count_flops", lambda cfg: 61.6e9)
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
        from vit_fast.util import progress
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
    from vit_fast.interop import training

    argv = ["--out", str(tmp_path), "--epochs", "3", "--embed-dim", "16", "--depth", "1", "--heads", "2"]
    assert training.main([*argv, "--threads", "1", "--log-every", "5"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("epoch")]
    assert [ln.split()[1] for ln in lines] == ["1/3", "3/3"], lines
    assert "left" in lines[0]
