"""benchmarks/run_gpu.sh --dry-run: the GPU session's stages and commands, checked on a CPU machine."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "run_gpu.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to run the script")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def _stages(stdout: str) -> dict[str, str]:
    lines = [line for line in stdout.splitlines()[1:] if line.strip()]
    return {line.split(None, 1)[0]: line.split(None, 1)[1] for line in lines}


def test_dry_run_prints_the_default_plan():
    proc = _run("--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "each limited to 530s" in proc.stdout  # under 9 minutes a stage
    stages = _stages(proc.stdout)
    assert list(stages) == ["env", "doctor", "tests-kernels", "tests-rest", "kernels", "b16"]
    assert "vit_fast doctor --model vit_base_patch16_224" in stages["doctor"]
    # correctness tests never autotune; the benches do
    for name in ("tests-kernels", "tests-rest"):
        assert stages[name].startswith("VIT_FAST_AUTOTUNE=0 ")
    assert "VIT_FAST_AUTOTUNE=0" not in stages["kernels"] + stages["b16"]
    assert "--batch 1,256" in stages["b16"] and "vit_base_patch16_224" in stages["b16"]


def test_dry_run_test_files_exist_and_split_the_suite():
    stages = _stages(_run("--dry-run").stdout)
    named = re.findall(r"tests/test_\w+\.py", stages["tests-kernels"])
    ignored = re.findall(r"--ignore=(tests/test_\w+\.py)", stages["tests-rest"])
    assert named and named == ignored  # the second stage runs exactly what the first does not
    for path in named:
        assert (ROOT / path).is_file(), path


def test_dry_run_of_chosen_stages_and_unknown_stage():
    proc = _run("--dry-run", "b16-unfused", "host", "b16-notma")
    assert proc.returncode == 0
    stages = _stages(proc.stdout)
    assert list(stages) == ["b16-unfused", "host", "b16-notma"]
    assert stages["b16-unfused"].startswith("VIT_FAST_FUSE_LN=0 ")
    assert stages["b16-notma"].startswith("VIT_FAST_TMA=0 ") and "--batch 64,256" in stages["b16-notma"]
    bad = _run("--dry-run", "nonsense")
    assert bad.returncode == 2 and "unknown stage 'nonsense'" in bad.stderr
