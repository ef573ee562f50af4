"""tests/progress.py, the pytest plugin ``make test`` loads: done / total, time so far and an estimate of the time
left, at most every ``--progress-every`` seconds; run here on a three-test file of its own in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .progress import progress_line

ROOT = Path(__file__).resolve().parent.parent


def test_the_estimate_is_the_rate_so_far_times_what_is_left():
    assert progress_line(0, 10, 0.0) == "progress: 0 of 10 tests (0 %), 0 s so far"
    assert (
        progress_line(5, 10, 100.0)
        == "progress: 5 of 10 tests (50 %), 1 min 40 s so far, about 1 min 40 s left at this rate"
    )
    assert progress_line(1, 2874, 2.0).endswith("about 1 h 35 min left at this rate")
    assert progress_line(2874, 2874, 2520.0) == "progress: 2,874 of 2,874 tests (100 %), 42 min 0 s so far"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_three.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('n', [1, 2, 3])\ndef test_n(n):\n    assert n\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # a quicker start
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.progress", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_each_test_reports_with_every_zero_and_only_the_last_with_a_long_interval(tmp_path):
    every = _run(tmp_path, "--progress-every", "0", "test_three.py")
    assert every.returncode == 0, every.stdout + every.stderr
    lines = [line for line in every.stdout.splitlines() if line.startswith("progress: ")]
    assert [line.split(",")[0] for line in lines] == [f"progress: {n} of 3 tests ({100 * n // 3} %)" for n in (1, 2, 3)]
    assert all("left at this rate" in line for line in lines[:2]) and "left" not in lines[2]
    rare = _run(tmp_path, "--progress-every", "3600", "test_three.py")
    assert (
        [line for line in rare.stdout.splitlines() if line.startswith("progress: ")]
        == [line for line in rare.stdout.splitlines() if line.startswith("progress: 3 of 3 tests (100 %)")]
        != []
    )
    quiet = _run(tmp_path, "test_three.py")  # without the option: no line
    assert quiet.returncode == 0 and "progress: " not in quiet.stdout


def test_a_negative_interval_is_a_usage_error(tmp_path):
    bad = _run(tmp_path, "--progress-every", "-1", "test_three.py")
    assert bad.returncode == 4, bad.stdout + bad.stderr
    assert "--progress-every must be a number of seconds >= 0, got -1.0" in bad.stderr
