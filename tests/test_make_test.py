"""``make test`` runs both suites whatever the first one's result, says each one's exit status and fails when either
failed (run here with stand-in pythons that only print their arguments); the set-up says what each install step is
installing before pip, which is quiet, runs for minutes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_PYTHON = '#!/bin/sh\necho "ran: $0 $*"\nexit ${FAKE_RC:-0}\n'


def _venv(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").write_text(FAKE_PYTHON)
    (path / "bin" / "python").chmod(0o755)
    (path / "bin" / "activate").touch()
    (path / ".installed").touch()  # newer than pyproject.toml and the Makefile: no set-up runs
    return path


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed (CI runs through it)")
@pytest.mark.parametrize("first, serve", [(0, 0), (1, 0), (0, 1)])
def test_both_suites_run_and_either_failing_fails_the_target(tmp_path, first, serve):
    main, serving = _venv(tmp_path / "main"), _venv(tmp_path / "serve")
    (main / "bin" / "python").write_text(FAKE_PYTHON.replace("FAKE_RC", "FAKE_MAIN_RC"))
    (serving / "bin" / "python").write_text(FAKE_PYTHON.replace("FAKE_RC", "FAKE_SERVE_RC"))
    env = {**os.environ, "FAKE_MAIN_RC": str(first), "FAKE_SERVE_RC": str(serve), "MAKEFLAGS": ""}
    cmd = ["make", "--no-print-directory", "test", f"VENV={main}", f"SERVE_VENV={serving}"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    ran = [line for line in done.stdout.splitlines() if line.startswith("ran: ")]
    progress = "-p tests.progress --progress-every 60"
    assert ran == [
        f"ran: {main}/bin/python -m pytest -q {progress}",
        f"ran: {serving}/bin/python -m pytest -q {progress} tests/serve",
    ], done.stdout + done.stderr
    assert f"make test: the suite exited {first}, the serve suite {serve} (0: passed)" in done.stdout
    assert (done.returncode == 0) == (first == 0 and serve == 0), done.stdout + done.stderr


def test_every_install_step_of_the_set_up_says_what_it_installs():
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    steps, said = 0, False
    for number, line in enumerate(lines, 1):
        if not line.startswith("\t"):  # a rule, a variable or a comment ends a recipe
            said = False
        elif line.startswith("\t@echo "):
            said = True
        elif re.match(r"\t\$\((BIN|SERVE_BIN|OLDEST_BIN)\)/python -m pip install", line):
            steps += 1
            assert said, f"Makefile:{number}: no line since the last step says what this one installs: {line}"
            said = "--upgrade pip" in line  # the venv's own pip goes with the line that announced the venv
    assert steps >= 10
