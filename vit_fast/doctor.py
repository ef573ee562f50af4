"""``vit-fast doctor``: prove the stack on this machine, and write what was found for a bug report.

Every check is a dict ``{"section", "name", "status": ok | warning | failed | skipped, "summary", ...}``;
:func:`run_doctor` runs them, writes ``report.json`` and ``report.md`` and returns the report, whose
``exit_code`` is 1 when any check failed. Nothing here judges on its own: the kernel checks are
:func:`vit_fast.selfcheck.check_kernel` (the same function the tests run), the whole model is
:func:`vit_fast.export.verify` with ``"triton"`` (as ``vit-fast verify MODEL triton``), the card is
:func:`vit_fast.kernels.cards.card_of`, the versions are :mod:`vit_fast.kernels._versions`, the graph is
:class:`vit_fast.graphs.CUDAGraphRunner`, timings are the bench timer's, files go through vit_fast.files.

  environment  python, torch, triton and whether they belong together, whether Triton's interpreter runs with
               the installed numpy (CPU only), what Triton builds its C launcher with (a C compiler, Python.h,
               libcuda.so.1), the driver, each GPU's row of the card table, TRITON_* / VIT_FAST_* settings
  kernels      every kernel of one forward at the model's shapes, then the kernels only timm / HF models
               patched in place run (RmsNorm and RmsNorm + GEMM of vit_base_patch16_xp_224, differential
               attention of vit_dlittle_patch16_reg1_gap_256, the attention-pool head of
               vit_base_patch16_siglip_224 and HF SigLIP) at those models' shapes, per dtype, against float64:
               compiled on a GPU (batch 1 and 8: both sides of the GEMMs' 512-row switch); on a CPU in
               Triton's interpreter (batch 1, at most two heads), in a child process with TRITON_INTERPRET=1
  model        the whole model, triton backend against the torch backend (float64 reference): per dtype on a
               GPU; on a CPU in the first dtype at batch 1, for small models only
  cuda graph   capture and replay of the triton model (GPU only)
  timing       triton against the torch backend, and attention against torch's SDPA (GPU only, brief)

On a CPU the GPU checks are listed as skipped, each with the reason. Each check is printed once, as a row on
standard output when it finishes (:func:`format_check`; the interpreter child's rows pass through the parent);
what runs next goes to standard error.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from . import first_use
from .children import guarded_python
from .doctor_settings import DoctorSettings
from .dtypes import DTYPES
from .env import collect_environment, driver_version, launcher_needs
from .files import MARKER_KEY, read_json, seal_markdown, temp_staging, write_atomic, write_json_atomic, write_new
from .kernels import _versions
from .kernels._interpret import interpreter_enabled
from .kernels.cards import MIN_ARCH, card_of, device_name
from .progress import Stages
from .selfcheck import check_kernel, family_cases, model_cases

#: the environment variables reported besides every TRITON_* and VIT_FAST_* one
OTHER_SETTINGS = ("CC", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "PYTORCH_CUDA_ALLOC_CONF")
#: batches of the compiled kernel checks: M = B * T on both sides of the GEMMs' 512-row switch for any T > 64
GPU_KERNEL_BATCHES = (1, 8)
#: in Triton's interpreter: one image, at most this many heads (the head dim and token count stay the model's)
INTERPRETER_MAX_HEADS = 2
#: the interpreter runs the whole model only when one image costs at most this many FLOPs (the embedded default
#: model: 0.03 GFLOP, about a second per image); larger models are checked whole on a GPU
INTERPRETER_MODEL_FLOPS = 0.2e9
#: what a CPU runs by default: bf16 dots run through fp32 in the interpreter, so its bf16 path is not the GPU's
CPU_DTYPES = ("fp32", "fp16")
GPU_CHECKS = ("kernels, compiled", "model, compiled", "first-use check", "cuda graph", "timing")
#: the environment check of whether Triton's interpreter runs our kernels with this triton and numpy (CPU only)
INTERPRETER_CHECK = "triton interpreter"


def _check(section: str, name: str, status: str | bool, summary: str, **fields: Any) -> dict[str, Any]:
    if not isinstance(status, str):
        status = "ok" if status else "failed"
    return {"section": section, "name": name, "status": status, "summary": summary, **fields}


def _failed(section: str, name: str, err: BaseException) -> dict[str, Any]:
    first = (str(err).strip().splitlines() or [""])[0]
    return _check(section, name, False, f"{type(err).__name__}: {first}".rstrip(": "), traceback=traceback.format_exc())


# --------------------------------------------------------------------------- environment
def launcher_checks(cuda: bool) -> list[dict[str, Any]]:
    """What Triton needs to build its C launcher on a GPU (:func:`vit_fast.env.launcher_needs`: the C compiler,
    Python.h, libcuda.so.1): failed when missing where kernels compile (``cuda``), else a warning, or skipped for
    libcuda (it comes with a GPU's driver)."""
    checks = []
    for need in launcher_needs():
        fields = need.to_dict(cuda)
        checks.append(_check("environment", fields.pop("name"), fields.pop("status"), fields.pop("summary"), **fields))
    return checks


def _triton_checks(cuda: bool) -> list[dict[str, Any]]:
    triton_version, torch_version = _versions.installed("triton"), torch.__version__
    pinned = _versions.torch_pinned_triton()
    want = ".".join(map(str, _versions.MIN_TRITON))
    checks = []
    triton_ok = False
    if triton_version is None:
        checks.append(
            _check(
                "environment",
                "triton",
                "failed" if cuda else "warning",
                f"triton is not installed: the triton backend cannot run (pip install 'triton>={want}', Linux)",
            )
        )
    else:
        problem = _versions.triton_problem()
        triton_ok = problem is None
        summary = problem or f"triton {triton_version} (vit-fast's kernels need >= {want})"
        checks.append(_check("environment", "triton", triton_ok, summary, version=triton_version))
    pair = _versions.pair_problem()
    if pair is not None:
        status, summary = "warning", pair
    elif pinned is None:
        status, summary = "ok", f"torch {torch_version} pins no triton (a CPU build, or not installed by pip)"
    else:
        status, summary = "ok", f"torch {torch_version} pins triton {pinned}, and triton {triton_version} is installed"
    checks.append(_check("environment", "torch / triton pair", status, summary, torch_pins=pinned))
    if triton_ok and not cuda:  # the kernel checks run in Triton's interpreter here
        problem = _versions.interpreter_problem()
        numpy_version = _versions.installed("numpy")
        summary = problem or (
            f"triton {triton_version} with numpy {numpy_version}: no known fault of the interpreter there "
            "(the kernel checks below run in it)"
        )
        checks.append(_check("environment", INTERPRETER_CHECK, problem is None, summary, numpy=numpy_version))
    return checks


def settings_present(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Every TRITON_* and VIT_FAST_* variable set, and the few others that change what runs (:data:`OTHER_SETTINGS`)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(("TRITON_", "VIT_FAST_")) or k in OTHER_SETTINGS}


def _settings_check() -> dict[str, Any]:
    found = settings_present()
    shown = ", ".join(f"{k}={v}" for k, v in found.items()) or "none set"
    # our kernels pass enable_fp_fusion on every launch (kernels._common.FP_FUSION), so the variable changes only
    # other Triton code in the process; said, because a user comparing numerics may have set it
    fusion = os.environ.get("TRITON_DEFAULT_FP_FUSION", "unset")
    fusion_note = f"our kernels pin fp fusion per launch (TRITON_DEFAULT_FP_FUSION, {fusion}, does not reach them)"
    return _check("environment", "settings", True, f"{shown}; {fusion_note}", variables=found)


def _gpu_checks(cuda: bool) -> list[dict[str, Any]]:
    if not cuda:
        why = f"no CUDA GPU visible to torch {torch.__version__}" + (
            f" (a CUDA {torch.version.cuda} build: check the driver with nvidia-smi, and CUDA_VISIBLE_DEVICES)"
            if torch.version.cuda
            else " (a CPU build)"
        )
        return [
            _check("environment", "driver", "skipped", why),
            _check("environment", "gpu", "skipped", why),
        ]
    checks = [_check("environment", "driver", True, driver_version(torch.device("cuda", 0)))]
    for index in range(torch.cuda.device_count()):
        card = card_of(index)
        summary = f"{device_name(index)}: {card.describe()}"
        status = "ok"
        if card.arch < MIN_ARCH:
            status, summary = "failed", summary + f"; Triton has no target below sm_{MIN_ARCH}"
        elif not card.tensor_cores:
            status = "warning"
            summary += "; tl.dot has no tensor cores here, so backend='auto' keeps the torch backend"
        checks.append(_check("environment", f"gpu {index}", status, summary, card=asdict(card)))
    return checks


def environment_checks(device: torch.device) -> list[dict[str, Any]]:
    """The environment section: versions, their pairing, what Triton's launcher needs (C compiler, Python.h,
    libcuda), the driver and cards, the settings."""
    cuda = device.type == "cuda"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    checks = [
        _check("environment", "python", True, f"{platform.python_version()} on {platform.platform()}"),
        _check("environment", "torch", True, f"torch {torch.__version__} ({build})", version=torch.__version__),
    ]
    checks += _triton_checks(cuda)
    checks += launcher_checks(cuda)
    checks += _gpu_checks(torch.cuda.is_available())
    checks.append(_settings_check())
    return checks


# --------------------------------------------------------------------------- kernels and the model
def _dtypes_for(s: DoctorSettings, device: torch.device) -> tuple[list[str], list[dict[str, Any]]]:
    """The dtypes to check on ``device`` and a skipped check for each one left out, with the reason."""
    cuda = device.type == "cuda"
    wanted = list(s.dtypes) if s.dtypes else (list(DTYPES) if cuda else list(CPU_DTYPES))
    skipped = []
    if cuda and "bf16" in wanted and not card_of(device).native_bf16:
        wanted.remove("bf16")
        why = f"{device_name(device)} emulates bf16 (no native bf16): use fp16 there"
        skipped.append(_check("kernels", "bf16", "skipped", why))
    if not cuda and not s.dtypes:
        why = "the interpreter runs bf16 dots through fp32, so its bf16 path is not the GPU's (--dtype bf16 runs it)"
        skipped.append(_check("kernels", "bf16", "skipped", why))
    return wanted, skipped


def format_check(check: dict[str, Any], counter: str = "") -> str:
    """One check as the row doctor prints: status, name and summary (``counter``: ``"[3/26] "``)."""
    return f"  {counter}{check['status']:<7}  {check['name']}: {check['summary']}"


class CheckLog(Stages):
    """Doctor's progress lines, which also keep each check as it is noted and hand the list so far to ``saved``
    (the report files rewritten, or the interpreter child's progress file), so an interrupt loses none."""

    def __init__(self, saved: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        super().__init__("vit-fast doctor")
        self.checks: list[dict[str, Any]] = []
        self.saved = saved or (lambda checks: None)

    def record(self, check: dict[str, Any]) -> None:
        self.checks.append(check)
        self.saved(self.checks)


def _note(stages: Stages, check: dict[str, Any], counter: str = "") -> None:
    """Print ``check`` as its row, once, when it is made (``stages`` off: nothing), and record it where ``stages``
    is a :class:`CheckLog` (the report files rewritten with it)."""
    if stages.enabled:
        print(format_check(check, counter), flush=True)
    if isinstance(stages, CheckLog):
        stages.record(check)


def doctor_cases(cfg: Any, batch: int, dtype: torch.dtype, max_heads: int | None) -> list[Any]:
    """What doctor checks per dtype and batch: every kernel of one forward of ``cfg`` (:func:`model_cases`), then
    the kernels only patched timm / Hugging Face models run (:func:`family_cases`: RmsNorm, RmsNorm + GEMM,
    differential attention, the attention-pool head), always, at their families' shapes. Always, since the model
    doctor loads is vit-fast's own: the models that run these kernels are the user's timm / transformers objects
    patched in place (``vit_fast.apply_vit_fast``), which no model name resolves to."""
    return model_cases(cfg, batch, dtype, max_heads) + family_cases(batch, dtype, max_heads)


def kernel_checks(cfg: Any, device: torch.device, dtypes: list[str], seed: int, stages: Stages) -> list[dict[str, Any]]:
    """Every kernel of one forward of ``cfg`` and those of the patched timm / HF families (:func:`doctor_cases`), in
    each of ``dtypes``, on ``device`` (compiled on a GPU, at batches 1 and 8; else in the interpreter, at batch 1
    with at most two heads)."""
    cuda = device.type == "cuda"
    batches = GPU_KERNEL_BATCHES if cuda else (1,)
    max_heads = None if cuda else INTERPRETER_MAX_HEADS
    runs = [
        (batch, case)
        for dtype_name in dtypes
        for batch in batches
        for case in doctor_cases(cfg, batch, DTYPES[dtype_name], max_heads)
    ]
    checks = []
    for i, (batch, case) in enumerate(runs, 1):
        record = check_kernel(case, device, seed)
        name = f"{record.pop('name')} b={batch}" if cuda else record.pop("name")
        checks.append(_check("kernels", name, record.pop("status"), record.pop("summary"), **record))
        _note(stages, checks[-1], f"[{i}/{len(runs)}] ")
    return checks


def model_checks(model: Any, device: torch.device, dtypes: list[str], seed: int, stages: Stages) -> list[dict]:
    """The whole model, triton backend against the torch backend and float64, per dtype (vit_fast.export.verify)."""
    from .export import verify
    from .model import count_flops

    cuda = device.type == "cuda"
    if not cuda and count_flops(model.cfg) > INTERPRETER_MODEL_FLOPS:
        why = (
            f"{count_flops(model.cfg) / 1e9:.1f} GFLOP per image is minutes in Triton's interpreter (its kernels "
            "were checked above at its token count and head dim); run vit-fast doctor on a GPU to check it whole"
        )
        skipped = _check("model", "model", "skipped", why)
        _note(stages, skipped)
        return [skipped]
    checks = []
    for dtype_name in dtypes if cuda else dtypes[:1]:  # each interpreted launch takes up to a second
        name = f"model {dtype_name}"
        try:
            report = verify(
                model,
                "triton",
                batches=None if cuda else [1],
                dtype=dtype_name,
                seed=seed,
                print_table=False,
                raise_on_failure=False,
            ).to_dict()
        except Exception as err:
            checks.append(_failed("model", name, err))
        else:
            worst = max(report["rows"], key=lambda r: r["max_abs_err"] / r["bound"] if r["bound"] else float("inf"))
            summary = (
                f"{report['runtime']}, batches {sorted({r['batch'] for r in report['rows']})}: worst max|err| "
                f"{worst['max_abs_err']:.2e} vs torch {worst['eager_max_abs_err']:.2e}, bound {worst['bound']:.2e}"
            )
            fields = {k: worst[k] for k in ("max_abs_err", "eager_max_abs_err", "bound")}
            checks.append(_check("model", name, report["passed"], summary, seed=report["seed"], **fields))
        _note(stages, checks[-1])
    return checks


# --------------------------------------------------------------------------- GPU only
def _median_ms(fn: Any, device: torch.device, iters: int = 20) -> float:
    from .bench import summarize, time_callable

    return summarize(time_callable(fn, device, warmup=5, iters=iters))["median_ms"]


def cuda_graph_check(model: Any, device: torch.device, dtype_name: str) -> dict[str, Any]:
    """Capture one forward of the triton model at batch 1 and replay it: the replay must give the eager output."""
    from .graphs import CUDAGraphRunner
    from .numerics import FLOOR, max_err, scale_of

    dtype = DTYPES[dtype_name]
    gpu = copy.deepcopy(model).to(device, dtype).eval().set_backend("triton")
    x = torch.randn(1, model.cfg.in_chans, *model.cfg.img_hw, device=device, dtype=dtype)
    with torch.no_grad():
        eager = gpu(x)
        graph = CUDAGraphRunner(gpu, x)
        out = graph(x)
        eager_ms, graph_ms = _median_ms(lambda: gpu(x), device), _median_ms(graph.replay, device)
    diff = max_err(out, eager)
    summary = (
        f"{dtype_name}, batch 1: captured and replayed; max|replay - eager| {diff:.1e}; eager {eager_ms:.3f} ms, "
        f"replay {graph_ms:.3f} ms"
    )
    ok = diff <= FLOOR[dtype] * scale_of(eager)
    return _check("cuda graph", f"cuda graph {dtype_name}", ok, summary, eager_ms=eager_ms, graph_ms=graph_ms)


def timing_check(model: Any, device: torch.device, dtype_name: str) -> dict[str, Any]:
    """Median CUDA-event times: the triton backend against the torch backend (batch 1 and 8), and our attention
    kernel against torch's scaled_dot_product_attention at the model's attention shape. Informational."""
    from .kernels.attention import attention

    dtype, cfg = DTYPES[dtype_name], model.cfg
    gpu = copy.deepcopy(model).to(device, dtype).eval()
    cases: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for batch in (1, 8):
            x = torch.randn(batch, cfg.in_chans, *cfg.img_hw, device=device, dtype=dtype)
            row = cases[f"model b={batch}"] = {}
            for backend in ("torch", "triton"):
                gpu.set_backend(backend)
                row[backend] = _median_ms(lambda x=x: gpu(x), device)
        B, T, H, Dh = 8, cfg.num_tokens, cfg.num_heads, cfg.head_dim
        qkv = torch.randn(B, T, 3 * H * Dh, device=device, dtype=dtype)
        q, k, v = qkv.view(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4).unbind(0)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        cases[f"attention b={B}"] = {
            "sdpa": _median_ms(lambda: sdpa(q, k, v), device),
            "triton": _median_ms(lambda: attention(qkv, H), device),
        }
    parts = [f"{name}: {' vs '.join(f'{k} {v:.3f} ms' for k, v in row.items())}" for name, row in cases.items()]
    return _check("timing", f"timing {dtype_name}", True, f"{dtype_name}, median; " + "; ".join(parts), cases_ms=cases)


def _compiled_checks(model: Any, device: torch.device, dtypes: list[str], seed: int, stages: Stages) -> list[dict]:
    """Kernels, the whole model, a CUDA graph and timings on the GPU ``device`` (made the current device for them:
    the whole-model check and the timings run on the current one)."""
    if not dtypes:
        skipped = _gpu_skipped("no precision left to check on this card (see kernels: bf16)")
        for c in skipped:
            _note(stages, c)
        return skipped
    with torch.cuda.device(device):
        stages.note(f"kernels of the model, compiled on {device_name(device)}, {', '.join(dtypes)}")
        checks = kernel_checks(model.cfg, device, dtypes, seed, stages)
        stages.note("the whole model, triton backend against the torch backend and float64")
        checks += model_checks(model, device, dtypes, seed, stages)
        checks.append(first_use_check())
        _note(stages, checks[-1])
        first = next(d for d in ("fp16", "bf16", "fp32") if d in dtypes)
        for name, step in (("cuda graph", cuda_graph_check), ("timing", timing_check)):
            stages.note(f"{name}, {first}")
            try:
                checks.append(step(model, device, first))
            except Exception as err:
                checks.append(_failed(name, f"{name} {first}", err))
            _note(stages, checks[-1])
    return checks


def first_use_check() -> dict[str, Any]:
    """What the safety net at first use (vit_fast/first_use.py) saw in this process: the whole-model check above
    ran each kernel's first compiled use through it. Failed when any kernel fell back to eager PyTorch."""
    seen = first_use.report()
    if not seen["enabled"]:
        return _check("model", "first-use check", "skipped", f"switched off ({first_use.ENV}=0)")
    if seen["failed"]:
        named = "; ".join(
            f"{f['kernel']} ({f['config']}) on {f['device']} {f['dtype']}: "
            f"max|err| {f['max_err']:.3g} > {f['bound']:.3g}"
            for f in seen["failed"]
        )
        return _check("model", "first-use check", False, f"fell back to eager PyTorch: {named}", first_use=seen)
    return _check(
        "model",
        "first-use check",
        True,
        f"{len(seen['checked'])} first uses judged, all within the rule",
        first_use=seen,
    )


def _gpu_skipped(reason: str) -> list[dict[str, Any]]:
    sections = {"kernels, compiled": "kernels", "model, compiled": "model", "first-use check": "model"}
    sections["cuda graph"] = "cuda graph"
    return [_check(sections.get(name, "timing"), name, "skipped", reason) for name in GPU_CHECKS]


# --------------------------------------------------------------------------- the interpreter child
def interpreter_checks(s: DoctorSettings, stages: Stages, model: Any = None) -> list[dict[str, Any]]:
    """The kernel and model checks on the CPU, in this process: TRITON_INTERPRET=1 must have been set before
    triton was imported (a child process started by :func:`_run_in_interpreter`, or a test)."""
    from .loading import load_model

    if model is None:
        model = load_model(s.model, backend="torch", seed=s.seed, config=s.config, weights=s.weights)
    cpu = torch.device("cpu")
    dtypes, _ = _dtypes_for(s, cpu)
    stages.note(
        f"kernels of {s.model} ({model.cfg.num_tokens} tokens, head dim {model.cfg.head_dim}) in Triton's "
        f"interpreter, and those of patched timm / HF models at their families' shapes, {', '.join(dtypes)}: "
        f"{len(doctor_cases(model.cfg, 1, torch.float32, None)) * len(dtypes)} checks"
    )
    checks = kernel_checks(model.cfg, cpu, dtypes, s.seed, stages)
    stages.note(f"the whole model, triton backend against the torch backend and float64, {dtypes[0]}, batch 1")
    return checks + model_checks(model, cpu, dtypes, s.seed, stages)


def _run_in_interpreter(s: DoctorSettings, stages: Stages) -> list[dict[str, Any]]:
    """:func:`interpreter_checks` in a child process started with TRITON_INTERPRET=1 (it must be set before
    triton is first imported, whatever this process imported already); it prints its rows on the stdout it
    shares with this process and its progress lines on stderr. Its checks so far (its progress file, rewritten
    after each) reach ``stages`` as they come, when it is a :class:`CheckLog`, so this run's report holds them
    before the child ends, and after an interrupt. The child dies with this process and its folder is removed on
    the way out (a SIGKILLed run's by the child, or by the next run)."""
    with temp_staging("vit-fast-doctor") as tmp:  # removed on SIGTERM; a SIGKILLed run's, by the next run
        settings, result = tmp / "settings.json", tmp / "checks.json"
        progress = tmp / "checks-so-far.json"
        write_new(settings, json.dumps(asdict(s), default=str))
        env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
        # the child dies with this process, and removes the folder if this process is gone (SIGKILL)
        cmd = guarded_python(["vit_fast.doctor", str(settings), str(result), str(progress)], cleanup=tmp)
        deadline, seen = time.monotonic() + s.timeout, 0

        def forward(checks: list[dict[str, Any]]) -> None:  # the child's new checks, into this run's record
            nonlocal seen
            for check in checks[seen:] if isinstance(stages, CheckLog) else []:
                stages.record(check)  # printed by the child itself, on the stdout it shares with this process
            seen = max(seen, len(checks))

        stdout = None if stages.enabled else subprocess.DEVNULL
        with subprocess.Popen(cmd, env=env, stdout=stdout) as proc:
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        proc.kill()
                        proc.wait()
                        forward(_read_checks(progress))
                        why = f"the interpreter run took longer than {s.timeout:g} s (raise --timeout)"
                        failed = _check("kernels", "interpreter", False, why)
                        _note(stages, failed)
                        return [*_read_checks(progress), failed]
                    time.sleep(0.2)
                    forward(_read_checks(progress))
            except BaseException:  # an interrupt, or a failure here: the child goes with it
                proc.kill()
                raise
        forward(_read_checks(progress))
        if not result.is_file():
            why = f"the interpreter run ended early (exit status {proc.returncode}; its error is on stderr above)"
            failed = _check("kernels", "interpreter", False, why)
            _note(stages, failed)
            return [*_read_checks(progress), failed]
        return read_json(result, "the interpreter run's checks")


def _read_checks(path: Path) -> list[dict[str, Any]]:
    """The checks in the child's progress file (written atomically), or none yet (or a partial one: unreadable)."""
    try:
        data = read_json(path, "the interpreter run's checks so far")
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def _child_main(settings_path: str, result_path: str, progress_path: str | None = None) -> int:
    raw = read_json(settings_path, "doctor settings")
    s = DoctorSettings(**{**raw, "out": Path(raw["out"])})
    stages = CheckLog((lambda checks: write_json_atomic(checks, progress_path)) if progress_path else None)
    try:
        checks = interpreter_checks(s, stages)
    except Exception as err:  # the model could not be loaded, or the interpreter could not start
        checks = [_failed("kernels", "interpreter", err)]
        _note(stages, checks[0])
    write_json_atomic(checks, result_path)
    return 0


# --------------------------------------------------------------------------- report
def _resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} asked for, but no CUDA GPU is visible to torch: use cpu or auto")
    return device


def _markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# vit-fast doctor",
        "",
        f"{report['created']} · vit-fast {report[MARKER_KEY]} · torch {env['torch']} · triton {env['triton']} · "
        f"{env['device_name']} · model `{report['model']['name']}`",
        "",
        "| section | check | status | result |",
        "|---|---|---|---|",
    ]
    for c in report["checks"]:
        summary = c["summary"].replace("|", "\\|")
        lines.append(f"| {c['section']} | {c['name']} | {c['status']} | {summary} |")
    verdict = "FAILED: " + ", ".join(report["failed"]) if report["failed"] else "OK"
    if not report.get("complete", True):  # rewritten as each check ends; or cut by an interrupt
        ran = f"{len(report['checks'])} checks so far"
        verdict = f"INCOMPLETE ({report['interrupted'] or ran}; {verdict.lower()} so far)"
    lines += ["", f"**{verdict}** (exit code {report['exit_code']}), {report['wall_s']:.1f} s.", ""]
    if report["skipped"]:
        lines += ["Skipped:", ""] + [f"- {name}: {why}" for name, why in report["skipped"].items()] + [""]
    return "\n".join(lines)


def run_doctor(s: DoctorSettings) -> dict[str, Any]:
    """Run every check, write ``report.json`` and ``report.md`` into ``s.out``; returns the report.

    ``report["exit_code"]`` is 1 when a check failed, else 0 (warnings and skipped checks do not fail). The two
    files are rewritten as each check ends (``complete: false``); Ctrl-C or SIGTERM writes them once more with the
    checks that ended and ``interrupted`` saying so, then lets the interrupt go on.
    """
    from . import interrupts

    start = time.perf_counter()
    device = _resolve_device(s.device)
    cuda = device.type == "cuda"
    environment = collect_environment(device if cuda else torch.device("cpu"))
    model_record: dict[str, Any] = {"name": s.model}
    out = Path(s.out)

    def save(checks: list[dict[str, Any]], complete: bool = False, interrupted: str | None = None) -> dict:
        report = _report(s, start, environment, model_record, checks, complete, interrupted)
        with interrupts.held():
            write_json_atomic(report, out / "report.json")
            write_atomic(out / "report.md", seal_markdown(_markdown(report), report[MARKER_KEY]))
        return report

    stages = CheckLog(save)
    with interrupts.handled():
        save([])  # from here on the files are this run's: "in progress", then each check as it ends
        try:
            checks = _all_checks(s, device, model_record, stages)
        except interrupts.INTERRUPTS as err:
            note = interrupts.cut_note(err, len(stages.checks), None, "check")
            save(stages.checks, interrupted=note)
            stages.note(f"{note}: {out / 'report.json'} and {out / 'report.md'} keep them")
            raise
        return save(checks, complete=True)


def _all_checks(s: DoctorSettings, device: torch.device, model_record: dict, stages: Stages) -> list[dict[str, Any]]:
    """Every check in order (each noted, and recorded when ``stages`` is a :class:`CheckLog`, as it ends)."""
    from .loading import load_model

    cuda = device.type == "cuda"
    stages.note("environment: versions, the C compiler, Python.h and libcuda, the driver and cards, settings")
    checks = environment_checks(device)
    for c in checks:
        _note(stages, c)
    dtypes, checks_skipped = _dtypes_for(s, device)
    try:
        model = load_model(s.model, backend="torch", seed=s.seed, config=s.config, weights=s.weights)
        model_record.update(config=model.cfg.to_dict(), tokens=model.cfg.num_tokens, weights=model.describe_weights())
    except Exception as err:
        checks.append(_failed("model", "load", err))
        _note(stages, checks[-1])
        model = None
    blockers = [c["name"] for c in checks if c["name"] in ("triton", INTERPRETER_CHECK) and c["status"] != "ok"]
    kernels_ready = not blockers
    if not kernels_ready:
        why = f"{blockers[0]} cannot run vit-fast's kernels here (see environment: {blockers[0]})"
        said = [_check("kernels", "kernels", "skipped", why), _check("model", "model", "skipped", why)]
    elif model is None:
        said = [_check("kernels", "kernels", "skipped", "their shapes come from the model (see model: load)")]
    else:
        said = checks_skipped
    for c in said:
        _note(stages, c)
    checks += said
    if kernels_ready and model is not None and cuda:
        checks += _compiled_checks(model, device, dtypes, s.seed, stages)
    elif kernels_ready and model is not None:
        if interpreter_enabled():  # set before triton was imported (a test, or the user's own shell): run here
            checks += interpreter_checks(s, stages, model)
        else:
            stages.note("starting a child process with TRITON_INTERPRET=1 for the interpreter checks")
            checks += _run_in_interpreter(s, stages)
    if not cuda:
        why = f"no CUDA GPU visible to torch {torch.__version__}" if not torch.cuda.is_available() else "--device cpu"
        for c in _gpu_skipped(f"{why}: needs a GPU (the interpreter ran what it can instead)"):
            _note(stages, c)
            checks.append(c)
    return checks


def _report(
    s: DoctorSettings,
    start: float,
    environment: dict[str, Any],
    model_record: dict[str, Any],
    checks: list[dict[str, Any]],
    complete: bool,
    interrupted: str | None,
) -> dict[str, Any]:
    """The report: every check, the verdict and the exit code (None until the run is complete)."""
    failed = [c["name"] for c in checks if c["status"] == "failed"]
    return {
        MARKER_KEY: environment["vit_fast"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment,
        "model": model_record,
        "args": {**asdict(s), "out": str(s.out)},
        "complete": complete,
        "interrupted": interrupted,
        "checks": list(checks),
        "failed": failed,
        "warnings": [c["name"] for c in checks if c["status"] == "warning"],
        "skipped": {c["name"]: c["summary"] for c in checks if c["status"] == "skipped"},
        "ok": complete and not failed,
        "exit_code": (1 if failed else 0) if complete else None,
        "wall_s": time.perf_counter() - start,
    }


if __name__ == "__main__":  # the interpreter child: python -m vit_fast.doctor SETTINGS.json RESULT.json [PROGRESS]
    try:
        with contextlib.suppress(BrokenPipeError):
            sys.exit(_child_main(*sys.argv[1:4]))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent reports it, quietly here
        sys.exit(130)
