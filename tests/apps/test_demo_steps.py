"""The demo's progress and timing: each step number is said once, in order (skipped steps too), and torch and
ONNX Runtime are timed on the same threads, chosen as the bench chooses them and recorded."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (pip install -e '.[demo]')")

from vit_fast.cli import main  # noqa: E402
from vit_fast.demo import STEPS, DemoSettings  # noqa: E402
from vit_fast.demo.steps import timing_step  # noqa: E402
from vit_fast.util.progress import Stages  # noqa: E402


def test_every_step_number_once_and_in_order(tmp_path, capsys):
    code = main(["demo", "--out", str(tmp_path / "d"), "--skip-triton", "--skip-onnx", "--skip-timing", "--no-plots"])
    assert code == 0
    numbers = [int(m.group(1)) for m in re.finditer(rf"\[vit-fast demo\] (\d)/{STEPS} ", capsys.readouterr().err)]
    assert numbers == list(range(1, STEPS + 1))


@pytest.mark.parametrize("threads", [None, 1])
def test_timing_runs_on_the_threads_it_records(threads, monkeypatch):
    from vit_fast.assets import load_default_eval_set
    from vit_fast.interop.loading import load_default_model

    model = load_default_model(backend="torch")
    images, _ = load_default_eval_set()
    monkeypatch.setattr("vit_fast.demo.steps.cpu_threads_for_load", lambda: (1, "1 of 2: load average 3.0 on 2 cores"))
    seen = []
    monkeypatch.setattr(
        "vit_fast.demo.steps.summarize", lambda times: seen.append(torch.get_num_threads()) or {"median_ms": 1.0}
    )
    before = torch.get_num_threads()
    step = timing_step(model, images[:4], None, DemoSettings(threads=threads, repeats=1), Stages("t", False))
    assert step["threads"] == 1 and seen and set(seen) == {1}  # every timed call ran on the recorded threads
    assert step["threads_note"] == ("--threads" if threads else "1 of 2: load average 3.0 on 2 cores")
    assert "1 thread each" in step["summary"]
    assert torch.get_num_threads() == before  # the caller's setting is restored
