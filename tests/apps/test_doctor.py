"""``vit-fast doctor`` on this CPU, and the checks it is built of (vit_fast.doctor, vit_fast.model.selfcheck).

The kernel check is :func:`vit_fast.model.selfcheck.check_kernel`, the function doctor runs on a user's card; here it
runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vit_fast import doctor
from vit_fast.backend import env
from vit_fast.base import versions
from vit_fast.base.cards import pretend_arch
from vit_fast.cli import main
from vit_fast.kernels import OPS
from vit_fast.model.config import ViTConfig
from vit_fast.model.selfcheck import DIFF_FAMILY, POOL_FAMILY, RMS_FAMILY, check_kernel, family_cases, model_cases
from vit_fast.util.files import MARKER_KEY

from ..fakes import skip_if_interpreted_and_broken, skip_if_interpreter_broken

#: a model with every feature a case depends on: registers, LayerScale, tanh GELU, a non-square image
TINY = ViTConfig(
    img_size=(16, 24), patch_size=8, embed_dim=32, depth=1, num_heads=2, reg_tokens=1, init_values=0.1, act="gelu_tanh"
)


# ------------------------------------------------------------------------------ the kernel check itself
def test_model_cases_cover_every_kernel_of_a_forward():
    cases = model_cases(TINY, batch=2, dtype=torch.float16)
    assert {c.kernel for c in cases} == set(OPS) - {c.kernel for c in family_cases()}
    assert [c.role for c in cases if c.kernel in ("linear", "layer_norm_linear")] == ["qkv", "proj", "fc1", "fc2"]
    qkv = next(c for c in cases if c.role == "qkv")
    assert qkv.shape() == "[2, 8, 32] -> [2, 8, 96]"  # 6 patches + class token + 1 register
    assert next(c for c in cases if c.role == "proj").dims["gamma"]  # LayerScale rides in the epilogue
    big = ViTConfig.from_name("vit_base_patch16_224")
    tiny = {c.role: c for c in model_cases(big, max_heads=2)}
    assert tiny["attention"].shape() == "[1, 197, 384] -> [1, 197, 128] (2 heads of 64)"  # head dim and T kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_every_kernel_passes_at_a_models_shapes(dtype):
    for case in model_cases(TINY, batch=1, dtype=dtype):
        result = check_kernel(case, seed=1)
        assert result["status"] == "ok", result
        assert result["max_abs_err"] <= result["bound"]


def test_a_wrong_kernel_fails_and_is_named(monkeypatch):
    import vit_fast.kernels.linear as linear

    real = linear.launch_linear
    monkeypatch.setattr(linear, "launch_linear", lambda *a, **k: real(*a, **k) * 1.01)
    results = {c.role: check_kernel(c) for c in model_cases(TINY) if c.kernel in ("linear", "attention")}
    assert results["attention"]["status"] == "ok"
    for role in ("proj", "fc2"):
        assert results[role]["status"] == "failed" and "OUTSIDE bound" in results[role]["summary"]
        assert results[role]["name"] == f"linear ({role}) fp32"


def test_an_unwritten_output_fails(monkeypatch):
    """A launcher that leaves its (NaN-filled) output unwritten fails: its error is infinite."""
    import vit_fast.kernels.attention as attention

    monkeypatch.setattr(attention, "launch_attention", lambda qkv, heads, out: out)
    (case,) = [c for c in model_cases(TINY) if c.kernel == "attention"]
    result = check_kernel(case)
    assert result["status"] == "failed" and result["max_abs_err"] == float("inf")


def test_a_kernel_that_raises_is_a_failed_check(monkeypatch):
    import vit_fast.kernels.layer_norm as layer_norm

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory, Required: 117760, Hardware limit: 101376")

    monkeypatch.setattr(layer_norm, "launch_layer_norm", broken)
    (case,) = [c for c in model_cases(TINY) if c.kernel == "layer_norm"]
    result = check_kernel(case)
    assert result["status"] == "failed" and "out of resources" in result["summary"] and result["traceback"]


# ------------------------------------------------------------------------------ the patched timm / HF families
def test_family_cases_cover_the_kernels_only_patched_models_launch():
    ours, families = {c.kernel for c in model_cases(TINY)}, {c.kernel for c in family_cases()}
    assert ours | families == set(OPS) and not ours & families
    full = {c.role.split(",")[0]: c for c in family_cases(batch=8, dtype=torch.float16)}
    assert {c.dtype for c in full.values()} == {torch.float16}
    assert full["fc1"].shape() == "[8, 197, 768] -> [8, 197, 3072]" and full["fc1"].dims["act"] == "gelu"
    assert full["qkv"].shape() == "[8, 197, 768] -> [8, 197, 2304]" and full["qkv"].dims["bias"] is False
    assert full["qk-norm"].shape() == "[8, 197, 12, 64]"
    assert full["attention"].shape() == "[8, 257, 960] -> [8, 257, 320] (5 heads: q, k 10 of 32, v 5 of 64)"
    assert full["map head"].shape() == "q [1, 1, 768], kv [8, 196, 1536] -> [8, 1, 768] (12 heads of 64)"
    two = {c.role.split(",")[0]: c.shape() for c in family_cases(max_heads=2)}  # head dims and token counts kept
    assert two["attention"] == "[1, 257, 384] -> [1, 257, 128] (2 heads: q, k 4 of 32, v 2 of 64)"
    assert two["map head"] == "q [1, 1, 128], kv [1, 196, 256] -> [1, 1, 128] (2 heads of 64)"
    assert two["qk-norm"] == "[1, 197, 2, 64]"


def test_family_sizes_are_timms_own():
    """The families' sizes, read from timm's models themselves (built on the meta device: no weights, no time)."""
    timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")
    with torch.device("meta"):
        xp, diff, siglip = (timm.create_model(f["model"]) for f in (RMS_FAMILY, DIFF_FAMILY, POOL_FAMILY))
    block = xp.blocks[0]
    assert type(block).__name__ == "ParallelScalingBlock" and type(block.in_norm).__name__ == "RmsNorm"
    assert (xp.patch_embed.num_patches + xp.num_prefix_tokens, block.num_heads, block.head_dim) == (197, 12, 64)
    assert block.in_norm.eps == block.q_norm.eps == RMS_FAMILY["eps"] and block.in_proj.bias is None
    assert block.in_proj.out_features == 3 * 768 + int(768 * RMS_FAMILY["mlp_ratio"])
    attn = diff.blocks[-1].attn
    assert type(attn).__name__ == "DiffAttention" and (attn.num_heads, attn.head_dim) == (5, 32)
    assert diff.patch_embed.num_patches + diff.num_prefix_tokens == DIFF_FAMILY["tokens"]
    assert attn.lambda_init == pytest.approx(DIFF_FAMILY["lambda_init"])
    pool = siglip.attn_pool
    assert (pool.num_heads, pool.head_dim, pool.latent_len) == (12, 64, POOL_FAMILY["latents"])
    assert siglip.patch_embed.num_patches + siglip.num_prefix_tokens == POOL_FAMILY["tokens"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_family_kernels_pass_at_their_models_shapes(dtype):
    """One head of each (the head dim, token count and latent length stay the family's): the interpreter's time."""
    for case in family_cases(dtype=dtype, max_heads=1):
        result = check_kernel(case, seed=2)
        assert result["status"] == "ok", result
        assert result["max_abs_err"] <= result["bound"]


def _unwritten(real):
    """The real launcher, then its output's last element back to NaN: a store mask that drops the tail element."""

    def launch(*args, out, **kwargs):
        real(*args, out=out, **kwargs)
        out.view(-1)[-1] = float("nan")
        return out

    return launch


def _column_off_by_one(real):
    """The real launcher, then its last output column written from its neighbour: a store index one off."""

    def launch(*args, out, **kwargs):
        real(*args, out=out, **kwargs)
        out[..., -1] = out[..., -2]
        return out

    return launch


def _k_one_short(real):
    """A GEMM whose reduction (and its RmsNorm prologue's statistic) stops one element short of K."""

    def launch(x, weight, *args, ln_weight, **kwargs):
        return real(x[..., :-1], weight[:, :-1], *args, ln_weight=ln_weight[:-1], **kwargs)

    return launch


def _kv_one_short(real):
    """An attention pool whose token loop stops one short: the last token's key and value never seen."""

    def launch(q, kv, *args, **kwargs):
        return real(q, kv[:, :-1], *args, **kwargs)

    return launch


WRONG = {  # kernel -> (module, launcher), and the wrong launchers each must be caught as
    "rms_norm": ("layer_norm", "launch_rms_norm", [_unwritten, _column_off_by_one]),
    "rms_norm_linear": ("linear", "launch_linear", [_unwritten, _column_off_by_one, _k_one_short]),
    "diff_attention": ("diff_attention", "launch_diff_attention", [_unwritten, _column_off_by_one]),
    "attention_pool": ("attention_pool", "launch_attention_pool", [_unwritten, _column_off_by_one, _kv_one_short]),
}


@pytest.mark.parametrize(
    "kernel, wrong",
    [(kernel, wrong) for kernel, (_, _, wrongs) in WRONG.items() for wrong in wrongs],
    ids=lambda v: v if isinstance(v, str) else v.__name__.strip("_"),
)
def test_a_wrong_family_kernel_fails_and_is_named(monkeypatch, kernel, wrong):
    import importlib

    module_name, launcher, _ = WRONG[kernel]
    module = importlib.import_module(f"vit_fast.kernels.{module_name}")
    monkeypatch.setattr(module, launcher, wrong(getattr(module, launcher)))
    cases = [c for c in family_cases(max_heads=1) if c.kernel == kernel]
    assert cases
    for case in cases:
        result = check_kernel(case, seed=3)
        assert result["status"] == "failed", result
        assert "OUTSIDE bound" in result["summary"] and result["name"].startswith(f"{kernel} (")
        if wrong is _unwritten:
            assert result["max_abs_err"] == float("inf")


# ------------------------------------------------------------------------------ the environment section
def _by_name(checks):
    return {c["name"]: c for c in checks}


def test_mismatched_torch_and_triton_are_flagged(monkeypatch):
    installed = {"torch": "2.10.0", "triton": "3.9.0"}
    monkeypatch.setattr(versions, "installed", installed.get)
    monkeypatch.setattr(versions, "torch_pinned_triton", lambda: "3.6.0")
    pair = _by_name(doctor.environment_checks(torch.device("cpu")))["torch / triton pair"]
    assert pair["status"] == "warning"
    assert "built against triton 3.6.0, but triton 3.9.0 is installed" in pair["summary"]


def test_too_old_triton_fails_and_skips_the_kernels(monkeypatch, tmp_path):
    installed = {"torch": "2.8.0", "triton": "3.4.0"}
    monkeypatch.setattr(versions, "installed", installed.get)
    monkeypatch.setattr(versions, "torch_pinned_triton", lambda: "3.4.0")
    report = doctor.run_doctor(doctor.DoctorSettings(out=tmp_path, device="cpu"))
    checks = _by_name(report["checks"])
    assert checks["triton"]["status"] == "failed" and "triton 3.4.0 is installed" in checks["triton"]["summary"]
    assert report["exit_code"] == 1 and report["failed"] == ["triton"]
    assert "triton cannot run vit-fast's kernels here" in report["skipped"]["kernels"]


# what Triton's C launcher needs: each finder (vit_fast.backend.env, shared with vit-fast info) fed a made-up machine
def _program(path, script):
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return path


def test_interpreter_broken_by_numpy_fails_and_skips_the_kernels(monkeypatch, tmp_path):
    """On a CPU with torch 2.11's triton 3.6.0 and numpy 2.5 (faked): the environment names the interpreter's fault
    and both fixes, and the kernel and model checks are skipped with that reason instead of failing one by one."""
    installed = {"torch": "2.11.0", "triton": "3.6.0", "numpy": "2.5.0"}
    monkeypatch.setattr(versions, "installed", installed.get)
    monkeypatch.setattr(versions, "torch_pinned_triton", lambda: "3.6.0")
    report = doctor.run_doctor(doctor.DoctorSettings(out=tmp_path, device="cpu"))
    checks = _by_name(report["checks"])
    summary = checks["triton interpreter"]["summary"]
    assert checks["triton interpreter"]["status"] == "failed" and checks["triton"]["status"] == "ok"
    assert "triton 3.6.0 cannot run vit-fast's kernels with numpy 2.5.0" in summary
    assert "pip install 'numpy<2.4'" in summary and "pip install 'torch>=2.12'" in summary
    assert report["exit_code"] == 1 and report["failed"] == ["triton interpreter"]
    for name in ("kernels", "model"):
        assert "triton interpreter cannot run vit-fast's kernels here" in report["skipped"][name]
    installed["numpy"] = "2.3.5"
    checks = _by_name(doctor.environment_checks(torch.device("cpu")))
    assert checks["triton interpreter"]["status"] == "ok" and "numpy 2.3.5" in checks["triton interpreter"]["summary"]
    assert "triton interpreter" not in _by_name(doctor.environment_checks(torch.device("cuda", 0)))  # compiled there


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "gpu"])
def test_missing_c_compiler_is_flagged(monkeypatch, tmp_path, cuda):
    """No $CC and no gcc or clang on PATH (an empty one): a warning on a CPU, a failure where kernels compile."""
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert env.c_compiler() == (None, "CC is unset and neither gcc nor clang is on PATH")
    check = _by_name(doctor.launcher_checks(cuda))["C compiler"]
    assert check["status"] == ("failed" if cuda else "warning") and check["path"] is None
    assert "no working C compiler" in check["summary"] and "set CC" in check["summary"]
    assert ("not needed on this CPU" in check["summary"]) is not cuda


def test_cc_that_is_not_a_compiler_is_flagged(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert _by_name(doctor.launcher_checks(True))["C compiler"]["status"] == "failed"
    monkeypatch.setenv("CC", "/bin/false")  # a program Triton would take as it is, but `--version` fails
    check = _by_name(doctor.launcher_checks(True))["C compiler"]
    assert check["status"] == "failed" and "'/bin/false --version' exited 1" in check["summary"]
    monkeypatch.setenv("CC", str(_program(tmp_path / "cc", "echo 'fakecc 1.0'")))
    check = _by_name(doctor.launcher_checks(True))["C compiler"]
    assert check["status"] == "ok" and check["summary"] == f"{tmp_path / 'cc'} (CC={tmp_path / 'cc'}: fakecc 1.0)"


def test_python_headers_are_looked_for_where_triton_compiles_against(monkeypatch):
    """triton/runtime/build.py: sysconfig's include path for the default scheme, Debian's posix_local read as
    posix_prefix (a system python's posix_local include folder is not where its -dev package puts Python.h)."""
    import sysconfig

    assert env.python_include_dir() == sysconfig.get_paths(scheme=sysconfig.get_default_scheme())["include"]
    monkeypatch.setattr(sysconfig, "get_default_scheme", lambda: "posix_local")
    assert env.python_include_dir() == sysconfig.get_paths(scheme="posix_prefix")["include"]


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "gpu"])
def test_missing_python_headers_are_flagged_with_the_fix(monkeypatch, tmp_path, cuda):
    monkeypatch.setattr(env, "python_include_dir", lambda: str(tmp_path))
    check = _by_name(doctor.launcher_checks(cuda))["Python headers"]
    xy = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert check["status"] == ("failed" if cuda else "warning") and check["path"] is None
    assert f"no Python.h in {tmp_path}" in check["summary"] and f"apt-get install python{xy}-dev" in check["summary"]
    assert ("not needed on this CPU" in check["summary"]) is not cuda
    (tmp_path / "Python.h").write_text("")
    check = _by_name(doctor.launcher_checks(cuda))["Python headers"]
    assert check["status"] == "ok" and check["path"] == str(tmp_path / "Python.h")


def _ldconfig_line(path):
    return f"\tlibcuda.so.1 (libc6,x86-64) => {path}"


# name: (TRITON_LIBCUDA_PATH, ldconfig -p's libcuda lines or None for a failing ldconfig, LD_LIBRARY_PATH,
#        the folder found (None: missing), how it was found or why not); folders: "lib" and "other" hold
#        libcuda.so.1, "empty" does not; Triton's order: TRITON_LIBCUDA_PATH as it is, else ldconfig, else
#        (only when ldconfig names none) LD_LIBRARY_PATH
LIBCUDA_CASES = {
    "TRITON_LIBCUDA_PATH": ("lib", [], None, "lib", "TRITON_LIBCUDA_PATH={lib}"),
    "TRITON_LIBCUDA_PATH without it": ("empty", ["other"], "other", None, "that folder holds no libcuda.so.1"),
    "ldconfig": (None, ["lib"], "other", "lib", "ldconfig -p"),
    "LD_LIBRARY_PATH": (None, [], "empty:other", "other", "LD_LIBRARY_PATH"),
    "stale ldconfig entry": (None, ["empty"], "other", None, "but none is there (a stale linker cache"),
    "ldconfig fails": (None, None, "other", None, "-p', which Triton reads to find libcuda.so.1, failed"),
    "nowhere": (None, [], None, None, "no libcuda.so.1 in the linker cache (ldconfig -p), and LD_LIBRARY_PATH is"),
    "nowhere, LD_LIBRARY_PATH set": (None, [], "empty", None, "nor in any folder of LD_LIBRARY_PATH"),
}


@pytest.mark.parametrize("case", LIBCUDA_CASES)
def test_libcuda_is_found_as_triton_finds_it(monkeypatch, tmp_path, case):
    """A fake ldconfig (a script printing the cache's libcuda lines, or exiting 1) and folders with or without
    libcuda.so.1; missing: failed where kernels compile, skipped on a CPU (it comes with a GPU's driver)."""
    triton_path, listed, ld_path, found, how = LIBCUDA_CASES[case]
    for name in ("lib", "other", "empty"):
        (tmp_path / name).mkdir()
    for name in ("lib", "other"):
        (tmp_path / name / "libcuda.so.1").write_text("")
    lines = "\n".join(_ldconfig_line(tmp_path / name / "libcuda.so.1") for name in listed or [])
    script = "exit 1" if listed is None else f"echo '9 libs found in cache'; printf '%s\\n' '{lines}'"
    monkeypatch.setattr(env, "LDCONFIG", str(_program(tmp_path / "ldconfig", script)))
    for var, value in (("TRITON_LIBCUDA_PATH", triton_path), ("LD_LIBRARY_PATH", ld_path)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, ":".join(str(tmp_path / part) for part in value.split(":")))
    path, found_by = env.libcuda()
    assert path == (None if found is None else str(tmp_path / found / "libcuda.so.1"))
    assert how.format(lib=tmp_path / "lib") in found_by
    gpu, cpu = (_by_name(doctor.launcher_checks(cuda))["libcuda"] for cuda in (True, False))
    assert (gpu["status"], cpu["status"]) == (("ok", "ok") if found else ("failed", "skipped"))
    if not found:
        assert "install the driver, or set TRITON_LIBCUDA_PATH to the folder holding libcuda.so.1" in gpu["summary"]


def test_no_ldconfig_is_flagged(monkeypatch, tmp_path):
    """Triton runs /sbin/ldconfig unless TRITON_LIBCUDA_PATH is set: where there is none it cannot find libcuda."""
    monkeypatch.delenv("TRITON_LIBCUDA_PATH", raising=False)
    monkeypatch.setattr(env, "LDCONFIG", str(tmp_path / "no-ldconfig"))
    path, why = env.libcuda()
    assert path is None and f"'{tmp_path / 'no-ldconfig'} -p', which Triton reads" in why


def test_the_environment_section_lists_what_the_launcher_needs():
    names = [c["name"] for c in doctor.environment_checks(torch.device("cpu"))]
    assert names[names.index("C compiler") :][:3] == ["C compiler", "Python headers", "libcuda"]


def test_settings_report_triton_and_vit_fast_variables():
    found = doctor.settings_present({"TRITON_DEFAULT_FP_FUSION": "0", "VIT_FAST_AUTOTUNE": "1", "HOME": "/root"})
    assert found == {"TRITON_DEFAULT_FP_FUSION": "0", "VIT_FAST_AUTOTUNE": "1"}


def test_bf16_skipped_on_a_card_without_native_bf16():
    with pretend_arch(75):
        dtypes, skipped = doctor.checks.dtypes_for(doctor.DoctorSettings(), torch.device("cuda", 0))
    assert dtypes == ["fp32", "fp16"]
    assert skipped[0]["name"] == "bf16" and "emulates bf16" in skipped[0]["summary"]
    with pretend_arch(80):
        assert doctor.checks.dtypes_for(doctor.DoctorSettings(), torch.device("cuda", 0))[0] == [
            "fp32",
            "fp16",
            "bf16",
        ]


@skip_if_interpreter_broken
def test_a_model_that_cannot_load_fails_with_the_reason(tmp_path):
    report = doctor.run_doctor(doctor.DoctorSettings(model="no_such_model", out=tmp_path, device="cpu"))
    checks = _by_name(report["checks"])
    assert report["failed"] == ["load"] and "cannot resolve model 'no_such_model'" in checks["load"]["summary"]
    assert "see model: load" in report["skipped"]["kernels"]
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == 1


def test_gpu_path_runs_every_check_and_reports_a_crash_as_failed(monkeypatch, tmp_path):
    """The GPU branch's order and bookkeeping, with a faked T4 (sm_75) and the checks themselves stubbed (no GPU
    here: what they compute is tested above in the interpreter): bf16 is skipped with the reason, the kernels run
    at batches 1 and 8, the graph and timing take fp16, and a check that raises is a failed check, not a crash."""
    import contextlib

    calls = []
    monkeypatch.setattr(doctor.report, "_resolve_device", lambda spec: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(doctor.report, "environment_checks", lambda device: [])

    def kernels(cfg, device, dtypes, seed, stages):
        calls.append(("kernels", tuple(dtypes), doctor.GPU_KERNEL_BATCHES))
        return [doctor.base.check_record("kernels", "attention fp16 b=8", True, "fine")]

    def graph(model, device, dtype_name):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(doctor.checks, "kernel_checks", kernels)
    monkeypatch.setattr(doctor.checks, "model_checks", lambda *a: calls.append(("model",)) or [])
    monkeypatch.setattr(doctor.checks, "cuda_graph_check", graph)
    monkeypatch.setattr(
        doctor.checks, "timing_check", lambda m, d, name: doctor.base.check_record("timing", f"timing {name}", 1, "t")
    )
    monkeypatch.setattr(
        doctor.report,
        "collect_environment",
        lambda device: {"vit_fast": "0", "torch": "t", "triton": "t", "device_name": "T4"},
    )
    with pretend_arch(75):
        report = doctor.run_doctor(doctor.DoctorSettings(out=tmp_path))
    assert calls == [("kernels", ("fp32", "fp16"), (1, 8)), ("model",)]
    checks = _by_name(report["checks"])
    assert "emulates bf16" in report["skipped"]["bf16"]
    assert (
        checks["cuda graph fp16"]["status"] == "failed"
        and "stream is capturing" in checks["cuda graph fp16"]["summary"]
    )
    assert checks["timing fp16"]["status"] == "ok"
    assert report["failed"] == ["cuda graph fp16"] and report["exit_code"] == 1
    assert not {"kernels, compiled", "cuda graph", "timing"} & set(report["skipped"])


# ------------------------------------------------------------------------------ the command
@skip_if_interpreted_and_broken
def test_failing_kernel_makes_doctor_exit_1_naming_it(monkeypatch, tmp_path, capsys):
    """In this process (the interpreter is on): a wrong attention kernel fails its check, the report names it, the
    command exits 1. The whole-model check is left out here (the CLI test runs it)."""
    import vit_fast.kernels.attention as attention

    real = attention.launch_attention
    monkeypatch.setattr(attention, "launch_attention", lambda *a, **k: real(*a, **k) + 0.5)
    monkeypatch.setattr(doctor.interpreter, "model_checks", lambda *a, **k: [])
    out = tmp_path / "out"
    code = main(["doctor", "--dtype", "fp32", "--out", str(out), "--json", str(tmp_path / "d.json")])
    assert code == 1
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["failed"] == ["attention fp32"] and report["exit_code"] == 1
    stdout = capsys.readouterr().out
    assert "FAILED: attention fp32" in stdout
    assert "FAILED: attention fp32" in (out / "report.md").read_text()
    _assert_each_check_printed_once(report["checks"], stdout)


def _assert_each_check_printed_once(checks: list[dict], stdout: str) -> None:
    """Every check is one row of doctor's output (its progress is the report: no table repeats it), and no row
    is padded past its text."""
    rows = [line for line in stdout.splitlines() if line.startswith("  ")]
    assert len(rows) == len(checks), stdout
    for c in checks:
        row = doctor.format_check(c)[2:]  # without the indent: a kernel row has its counter before the status
        assert sum(line.endswith(row) for line in rows) == 1, (row, stdout)
    assert not any(line != line.rstrip() or "   " in line.split(": ", 1)[-1] for line in rows), stdout


@skip_if_interpreted_and_broken
def test_doctor_on_this_cpu(tmp_path):
    """``vit-fast doctor --json d.json``, as a user runs it (no TRITON_INTERPRET: it starts the interpreter child
    itself): exit 0, the report written, every GPU check named as skipped with its reason."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "vit_fast.cli", "doctor", "--json", "d.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "d.json").read_text())
    assert report[MARKER_KEY] and report["ok"] and report["exit_code"] == 0
    assert (tmp_path / "vit-fast-out/doctor/report.json").is_file()
    assert (tmp_path / "vit-fast-out/doctor/report.md").is_file()
    no_gpu = "no CUDA GPU visible to torch"
    for name in ("kernels, compiled", "model, compiled", "cuda graph", "timing", "driver", "gpu"):
        assert no_gpu in report["skipped"][name], name
        assert f"skipped  {name}" in run.stdout
    checks = _by_name(report["checks"])
    for case in model_cases(ViTConfig.from_dict(report["model"]["config"])):
        for dtype in ("fp32", "fp16"):
            assert checks[case.name.replace("fp32", dtype)]["status"] == "ok"
    assert checks["model fp32"]["status"] == "ok" and "Triton interpreter" in checks["model fp32"]["summary"]
    assert "bf16" in report["skipped"]
    # one progress line per check, from the child, as it ran
    for case in family_cases():  # the kernels of patched timm / HF models, whatever the model
        for dtype in ("fp32", "fp16"):
            assert checks[case.name.replace("fp32", dtype)]["status"] == "ok"
    # each check printed once, on stdout, as it finished (the child's rows passed through): 8 cases of the model
    # and 5 of the families per dtype; no table after them
    assert "  [16/26] ok       attention fp16: [1, 65, 192] -> [1, 65, 64]" in run.stdout
    _assert_each_check_printed_once(report["checks"], run.stdout)
    assert "ok       attention fp16" not in run.stderr  # stderr says what runs next, not the results
