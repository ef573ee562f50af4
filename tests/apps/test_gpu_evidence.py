"""benchmarks/gpu_evidence.py and benchmarks/run_gpu.sh, proven on a CPU before they meet a GPU: every phase run end
to end with Triton's driver stubbed (nothing compiles or computes; every launch is recorded), the six files written
and readable after a budget cut and after a SIGTERM mid-phase, a follow-up that resumes an earlier record, the
output folder's ownership, and the dry run's plan."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_evidence.py"
WRAPPER = ROOT / "benchmarks" / "run_gpu.sh"
FILES = ("preflight.txt", "results.json", "summary.md", "kernels.csv", "perf.csv", "run.log")
#: the embedded default model (dim 64, 2 heads of 32, 65 tokens) at tiny batches: every phase in seconds
TINY = [
    "--stub-driver",
    "--models", "default", "--perf-model", "default", "--kernel-batches", "1,2", "--fp32-batches", "1",
    "--tma-batches", "2", "--perf-batches", "1,2", "--compile-batches", "1", "--tuned-batches", "1",
    "--min-time", "0.02",
]  # fmt: skip
ALL_PHASES = ["--phases", "env,kernels,model,tma,perf,compile,tuned"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the wrapper is a bash script")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the stub stands in for a GPU
    env.update(PYTHON=sys.executable, EVIDENCE_KEEP=str(tmp_path / "keep"), TRITON_CACHE_DIR=str(tmp_path / "tc"))
    return env


def _wrapper(tmp_path: Path, out: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**_env(tmp_path), "OUT": str(out)}
    return subprocess.run(
        ["bash", str(WRAPPER), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _read(out: Path) -> dict:
    """Every file parsed as what it is; the results."""
    for name in FILES:
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    for name in ("kernels.csv", "perf.csv"):
        rows = list(csv.DictReader(io.StringIO((out / name).read_text())))
        assert all(None not in row for row in rows), name  # no ragged row
    assert (out / "summary.md").read_text().rstrip().endswith("-->")  # vit-fast's mark, last
    return results


def test_every_phase_runs_with_the_driver_stubbed_and_writes_the_six_files(tmp_path):
    out = tmp_path / "out"
    # the budget lets every step's H100 estimate fit (tuning: its upper bound of compilations, about 3 minutes)
    proc = _wrapper(tmp_path, out, *TINY, *ALL_PHASES, "--budget", "600")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = _read(out)
    assert results["driver"] == "stub" and "Not a GPU run" in (out / "summary.md").read_text()
    phases = {p["name"]: p for p in results["phases"]}
    assert list(phases) == ["env", "kernels", "model", "tma", "perf", "compile", "tuned"]
    assert [p["status"] for p in results["phases"]] == ["done"] * 7
    kernels = results["kernels"]
    # every kernel of the model and of the patched families, at each dtype and batch asked for
    assert {r["kernel"] for r in kernels} == {
        "patch_embed", "layer_norm_linear", "attention", "linear", "layer_norm", "add_layer_norm", "rms_norm",
        "rms_norm_linear", "diff_attention", "attention_pool",
    }  # fmt: skip
    assert {(r["dtype"], r["batch"]) for r in kernels} == {("bf16", 1), ("bf16", 2), ("fp16", 1), ("fp16", 2),
                                                           ("fp32", 1)}  # fmt: skip
    # the config each ran and its programs, from the launch itself
    gemm = next(r for r in kernels if r["kernel"] == "linear")
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(gemm["config"]) and gemm["programs"] >= 1
    # nothing was computed: the check says so by failing, never by passing on an unwritten output
    assert all(r["status"] != "ok" for r in kernels)
    assert phases["env"]["status"] == "done"
    labels = {r["label"] for r in results["perf"]}
    assert {"torch", "timm", "hf", "triton", "triton+graph", "torch+graph", "triton tuned"} <= labels
    # the tuned phase records every candidate the autotuner timed, per kernel and shape
    assert {t["kernel"] for t in results["tuning"]} >= {"_linear_kernel", "_attention_kernel"}
    graph = next(r for r in results["perf"] if r["label"] == "torch+graph")
    assert graph["status"] == "unavailable" and "CUDA" in graph["notes"]
    torch_rows = [r for r in results["perf"] if r["label"] == "torch"]
    assert all(r["status"] == "ok" and r["n"] >= 5 and r["agrees_with_torch"] for r in torch_rows), torch_rows
    # torch.compile (fullgraph, dynamic=False) runs on a CPU too (inductor's C++ backend), checked against torch
    compiled = {r["label"]: r for r in results["compile"]}
    assert set(compiled) == {"compile(torch)", "compile(timm)"}
    for row in compiled.values():
        assert row["status"] == "ok" and row["compile_s"] > 0 and row["agrees_with_torch"], row
    assert "== gpu_evidence.py exited 0" in proc.stdout and "## Targets" in proc.stdout  # the summary's end
    preflight = (out / "preflight.txt").read_text()
    assert "Python.h" in preflight and "libcuda" in preflight and "install:" in preflight
    assert (tmp_path / "keep" / "results.json").is_file()  # kept for a follow-up's --resume


def test_a_budget_cut_skips_what_does_not_fit_and_leaves_valid_files(tmp_path):
    out = tmp_path / "out"
    proc = _wrapper(tmp_path, out, *TINY, "--phases", "env,kernels,compile", "--budget", "30")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _read(out)
    phases = {p["name"]: p for p in results["phases"]}
    compile_phase = phases["compile"]
    assert compile_phase["status"].startswith("cut:") and compile_phase["done"] == 0  # 60 s will not fit in 30
    assert all(entry["status"].startswith("skipped:") for entry in compile_phase["log"])
    assert phases["kernels"]["status"] == "done"


def test_sigterm_mid_phase_keeps_every_step_that_ended(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, str(SCRIPT), *TINY, "--phases", "kernels,model", "--out", str(out), "--budget", "300"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        done = 0  # waited for as long as the run goes on (its own --budget ends it), not by a clock of ours
        while proc.poll() is None and done < 3:
            time.sleep(0.2)
            try:
                phases = json.loads((out / "results.json").read_text())["phases"]
                done = next(p["done"] for p in phases if p["name"] == "kernels")
            except (OSError, ValueError, KeyError, StopIteration):
                pass
        assert done >= 3, "the kernels phase never got going"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.stdout.close()
    results = _read_without_preflight(out)
    phase = next(p for p in results["phases"] if p["name"] == "kernels")
    assert phase["status"].startswith("cut by a signal") and phase["done"] >= 3
    assert len(results["kernels"]) == phase["done"]  # every step that ended is in the table
    assert "stopped by SIGTERM" in (out / "run.log").read_text()


def _read_without_preflight(out: Path) -> dict:
    (out / "preflight.txt").write_text("(the wrapper writes this; the script was run alone)\n")
    return _read(out)


def test_the_pythonpath_mapping_runs_the_script_where_pip_cannot_install(tmp_path):
    """The wrapper's fallback where the offline install fails (no setuptools, say): a copy of vit_fast with kernels/
    and export/ linked in, first on PYTHONPATH; the script runs from it."""
    out = tmp_path / "out"
    env = {**_env(tmp_path), "OUT": str(out), "EVIDENCE_INSTALL": "map"}
    cmd = ["bash", str(WRAPPER), *TINY, "--phases", "env", "--budget", "60"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    preflight = (out / "preflight.txt").read_text()
    mapped = preflight.split("install: map: PYTHONPATH=")[1].split(",")[0]
    assert f"from {mapped}/vit_fast/__init__.py" in preflight  # imported from the mapping, not the editable install
    assert _read(out)["phases"][0]["status"] == "done"


def test_a_follow_up_resumes_the_earlier_record(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert _wrapper(tmp_path, first, *TINY, "--phases", "env", "--budget", "60").returncode == 0
    proc = _wrapper(tmp_path, second, *TINY, "--phases", "model", "--resume", str(tmp_path / "keep" / "results.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _read(second)
    assert [p["name"] for p in results["phases"]] == ["env", "model"] and len(results["runs"]) == 2
    log = (second / "run.log").read_text()
    assert "== env" in log and "---- resumed ----" in log and "== model" in log


def test_the_output_folder_is_checked_before_any_work(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kernels.csv").write_text("a user's own table\n")
    cmd = [sys.executable, str(SCRIPT), *TINY, "--phases", "env", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "kernels.csv" in proc.stderr and "not written by vit-fast" in proc.stderr
    assert (out / "kernels.csv").read_text() == "a user's own table\n" and not (out / "results.json").exists()
    # an earlier run's own files are replaced; one of them edited since is a user's
    (out / "kernels.csv").unlink()
    assert subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, timeout=300).returncode == 0
    assert subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, timeout=300).returncode == 0
    with (out / "perf.csv").open("a") as f:
        f.write("my note\n")
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "perf.csv" in proc.stderr


def test_the_interpreter_and_a_machine_without_a_gpu_are_refused(tmp_path):
    env = {**_env(tmp_path), "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "unset TRITON_INTERPRET" in proc.stderr
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--stub-driver" in proc.stderr


def test_help_shows_the_gpu_machines_command():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0
    assert "bash benchmarks/run_gpu.sh" in proc.stdout and "--resume /tmp/vit-fast-evidence/results.json" in proc.stdout


@pytest.mark.slow
def test_dry_run_plans_every_phase_and_the_default_fits_the_budget(tmp_path):
    """The plan at the real shapes (ViT-S/16 and ViT-B/16, batches up to 256), compilations counted with the driver
    stubbed: every phase listed with its estimate, and the default phases within 470 s."""
    proc = _wrapper(tmp_path, tmp_path / "unused", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in ("env", "kernels", "model", "tma", "perf", "compile", "tuned"):
            rows[parts[0]] = (int(parts[1]), int(parts[2]), float(parts[3]), parts[4])
    assert list(rows) == ["env", "kernels", "model", "tma", "perf", "compile", "tuned"]
    assert rows["kernels"][1] > 0 and rows["tuned"][1] > rows["kernels"][1]  # tuning compiles every candidate
    default = sum(seconds for _, _, seconds, default in rows.values() if default == "yes")
    assert default <= 470 and "(fits)" in proc.stdout
    assert not (tmp_path / "unused").exists()  # a dry run writes nothing
