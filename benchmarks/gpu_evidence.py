"""The GPU evidence run: every phase, most valuable first, each in a process of its own, in one time budget; nothing
lost when a step fails, hangs or the run is cut.

    python benchmarks/gpu_evidence.py --out DIR [--budget 540] [--phases env,kernels,model,tma,perf,compile,tuned]
    python benchmarks/gpu_evidence.py --dry-run          # the plan, with estimated seconds on an H100
    python benchmarks/gpu_evidence.py --stub-driver ...  # a CPU rehearsal: Triton's driver stubbed, nothing computed

Each phase runs in a child process: a CUDA error that breaks the context ends that process, and the phase goes on
in a new one after the failed step; a step that runs past 3x its estimate plus --step-timeout (a hang in a CUDA
synchronize) is killed by the watchdog and recorded, and the phase goes on after it. Each step is logged (and the
files saved) before it starts. After every step the child rewrites results.json (strict JSON), summary.md,
kernels.csv, perf.csv and run.log in --out (each replaced whole, atomically). Before each step it checks the time
left against the step's estimate with its expected compilations (at the seconds per compilation measured so far)
and skips what does not fit; each phase starts with time kept back for the phases after it.

Phases (all run by default, in this order):
  env      versions, device, clocks, driver; the environment checks (C compiler, Python.h, libcuda); one trivial
           Triton kernel compiled and launched; which SDPA kernel torch picks; nvJPEG's decode of a few JPEGs
           against Pillow's (skipped with its reason where torchvision's GPU decode_jpeg is not there)
  kernels  every kernel of ViT-B/16 (--models adds ViT-S/16 or others) and those only patched timm / HF models
           launch, at their family shapes: bf16 at batch 1 and 64, fp16 and fp32 at 1, each against float64 by the
           numerics rule into NaN-filled outputs (vit_fast.model.selfcheck.check_kernel), with the config each ran,
           its programs, registers, spills and shared memory
  model    the whole model, triton backend against the torch backend and float64 (vit_fast.export.verify)
  tma      the GEMMs of ViT-B/16 in --perf-dtype (bf16) at batch 256 with VIT_FAST_TMA on and off: correct, and
           how fast
  perf     ViT-B/16 bf16 at batch 1, 8, 64, 256, side by side: torch eager (SDPA), eager in a CUDA graph, timm,
           transformers (sdpa), then ours: triton untuned (what a user gets), triton in a CUDA graph; the
           ceilings; the image pipeline from JPEG files to top-k (benchmarks/pipeline.py: by hand, and predict
           with decode threads, the fused preprocessing kernel and batching); seconds to the first output of a
           fresh process on a fresh cache; launches per forward
  compile  torch.compile (default mode, fullgraph, dynamic=False) of the torch backend at batch 1 (timm too with
           --compile-sources torch,timm): compile seconds, then a timing (max-autotune is left out: minutes per
           GEMM shape)
  tuned    the tuned triton backend at batch 1 (and in a CUDA graph), every candidate's timing recorded

The GPU machine's one command (docs/gpu.md; it writes preflight.txt, installs offline, runs this, all within 570 s):

    bash benchmarks/run_gpu.sh
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import datetime as _dt
import gc
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START = time.monotonic()
HERE = Path(__file__).resolve().parent

#: the phases, most valuable first; one command runs them all within one budget
PHASES = ("env", "kernels", "model", "tma", "perf", "compile", "tuned")
DEFAULT_PHASES = PHASES
#: seconds one Triton compilation takes on the lent H100's host for the plan and until the run has measured its
#: own (KERNELS.md: 0.35-2 s on a fast host; the upper end)
COMPILE_SECONDS = 2.0
#: seconds kept back for each later phase when a phase starts: the first, most valuable steps of every phase run
#: even when an earlier phase's estimates were short
RESERVE_S = {"env": 0.0, "kernels": 30.0, "model": 15.0, "tma": 10.0, "perf": 60.0, "compile": 45.0, "tuned": 45.0}
#: the budget the default command is planned for: 600 s of device call, less install and the wrapper's margins
PLANNED_BUDGET = 540.0
#: a phase child's exit status after a CUDA error that leaves the context unusable: restarted after that step
EXIT_BROKEN = 3
#: the most times one phase is restarted (after a CUDA error, a hang or a crash) before it is given up
MAX_RESTARTS = 6
#: the longest the first-output child may take (it must not eat the rest of the budget)
FIRST_OUTPUT_LIMIT_S = 60.0
#: the largest --resume file read (a full run's results.json is about 1 MB)
RESUME_MAX_BYTES = 16 * 2**20
#: float64 FLOP/s of the GPU machine's CPU (16 cores) for verify's float64 reference, for the plan
CPU_FLOAT64_RATE = 50e9
#: the files this script writes into --out (preflight.txt is the wrapper's)
FILES = ("results.json", "summary.md", "kernels.csv", "perf.csv", "run.log")
#: the lock file that keeps a second run off the same --out
LOCK_NAME = ".gpu_evidence.lock"
KERNEL_FIELDS = (
    "phase", "model", "name", "kernel", "role", "dtype", "batch", "shape", "tma", "status", "max_abs_err",
    "eager_max_abs_err", "bound", "config", "num_warps", "num_stages", "programs", "registers", "spills",
    "shared_bytes", "compiles", "median_ms", "tflops", "seconds", "summary",
)  # fmt: skip
PERF_FIELDS = (
    "phase", "label", "dtype", "batch", "status", "median_ms", "p10_ms", "p90_ms", "n", "images_per_s",
    "speedup_vs_best_peer", "best_peer", "floor_ms", "vs_floor", "first_output_s", "compiles", "max_abs_err_vs_torch",
    "agrees_with_torch", "notes",
)  # fmt: skip
#: the tables of records in results.json (each record names the phase that made it)
TABLES = ("kernels", "model", "tma", "perf", "compile")
#: what a run carries over from the record it resumes, with the type each must have
CARRIED = {
    "env": dict, "phases": list, "kernels": list, "model": list, "tma": list, "perf": list, "compile": list,
    "launches": dict, "tuning": list, "first_use": dict, "runs": list, "ceilings": dict, "first_output": dict,
    "perf_model": dict, "compile_s": (int, float), "simulated_s": (int, float), "running": dict,
}  # fmt: skip
#: the pipeline rows' image sizes (HxW), several as users' files are; the label prefix that keeps those rows (files
#: to top-k, not one forward) out of the side-by-side comparison
PIPELINE_SIZES = ((240, 320), (375, 500), (480, 640))
PIPELINE = "pipeline: "
#: the rows that are ours in the perf table; every other label is a peer
OURS = ("triton", "triton+graph", "triton tuned", "triton tuned+graph")


class UsageError(ValueError):
    """A command line, --out or --resume refused before any work: one line, exit 2."""


def held() -> contextlib.AbstractContextManager:
    """SIGTERM and SIGINT held back within the block (vit_fast.util.interrupts): the bookkeeping of a step and the
    rewriting of the files are never cut half way."""
    from vit_fast.util import interrupts

    return interrupts.held()


def strict(value: Any) -> Any:
    """``value`` with every NaN and infinity made None: results.json is strict JSON."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


@dataclass
class Step:
    """One unit of work: ``run()`` returns its records; ``launch()`` launches what it would compile (a dry run
    counts those compilations with the driver stubbed); ``seconds`` is its estimate on an H100 beyond them,
    ``compiles`` the compilations it is expected to make (the kernels phase learns its own rate as it runs)."""

    phase: str
    name: str
    seconds: float | Callable[[], float]  # a callable where it depends on what ran before (a compiled model)
    run: Callable[[], list[dict[str, Any]]]
    launch: Callable[[], Any] | None = None
    rows: bool = True  # its records are rows of the phase's table (else only its line in the phase's log)
    #: the dry run's seconds for the step given the compilations it counted (default: its estimate plus
    #: COMPILE_SECONDS each); for a step whose own estimate depends on what ran before it
    planned: Callable[[int], float] | None = None
    compiles: float = 0.0

    def estimate(self, compile_s: float = COMPILE_SECONDS, compiles: float | None = None) -> float:
        own = self.seconds() if callable(self.seconds) else self.seconds
        return own + (self.compiles if compiles is None else compiles) * compile_s

    def plan(self, compiles: int) -> float:
        return self.planned(compiles) if self.planned else self.estimate(compiles=0) + compiles * COMPILE_SECONDS


# --------------------------------------------------------------------------------------------- the record
class Evidence:
    """What the run knows, and the files that say it: rewritten whole after every step. ``deadline`` is a wall
    clock (time.time()) shared by the run and its phase children; with ``simulated`` the clock is the sum of the
    estimates of the steps run (a test's clock, independent of the machine's speed)."""

    def __init__(
        self,
        out: Path,
        budget: float,
        args: argparse.Namespace,
        mode: str,
        deadline: float | None = None,
        started: float | None = None,
    ) -> None:
        self.out, self.budget, self.args, self.mode = out, budget, args, mode
        self.started = time.time() if started is None else started
        self.deadline = self.started + budget if deadline is None else deadline
        self.simulated = bool(getattr(args, "simulated_clock", False))
        self.lines: list[str] = []
        self.data: dict[str, Any] = {
            "vit_fast_version": None,
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "driver": mode,
            "budget_s": budget,
            "argv": sys.argv[1:],
            "env": {},
            "phases": [],
            "kernels": [],
            "model": [],
            "tma": [],
            "perf": [],
            "compile": [],
            "launches": {},
            "tuning": [],
            "first_use": {},
            "runs": [],
            "compile_s": None,
            "simulated_s": 0.0,
        }
        self.compiles = 0
        self.device = None  # the torch device a phase child runs on

    def left(self) -> float:
        if self.simulated:
            return self.deadline - self.started - self.data["simulated_s"]
        return self.deadline - time.time()

    def compile_s(self) -> float:
        """Seconds per compilation: measured in this run where it compiled, else COMPILE_SECONDS."""
        return self.data.get("compile_s") or COMPILE_SECONDS

    def log(self, text: str) -> None:
        line = f"[{time.time() - self.started:6.1f} s] {text}"
        print(line, flush=True)
        self.lines.append(line)

    def carry(self, earlier: dict[str, Any], lines: list[str]) -> None:
        for key in CARRIED:
            if earlier.get(key) is not None:
                self.data[key] = earlier[key]
        self.lines = lines

    def resume(self, path: Path) -> None:
        """Carry an earlier run's records (and log) into this one, which adds its phases to them; refused with a
        UsageError, before any work, when the file is not an evidence record."""
        earlier = read_record(path, "--resume")
        log = path.with_name("run.log")
        lines = []
        if log.is_file() and log.stat().st_size <= RESUME_MAX_BYTES:
            lines = log.read_text(errors="replace").splitlines() + ["", "---- resumed ----"]
        self.carry(earlier, lines)
        self.log(f"resumed from {path}: phases {', '.join(p['name'] for p in self.data['phases'])}")

    def reload(self) -> None:
        """This run's own record, as its phase child left it in --out (its files claimed again for our writes: the
        folder was checked before the run and is locked, so whatever is there now is this run's, even a file a
        killed child left half-updated beside its digest)."""
        check_out(self.out, overwrite=True)
        earlier = read_record(self.out / "results.json", "the run's own record")
        log = self.out / "run.log"
        self.carry(earlier, log.read_text(errors="replace").splitlines() if log.is_file() else [])

    def save(self) -> None:
        with held():
            self._save()

    def _save(self) -> None:
        from vit_fast import __version__
        from vit_fast.util.files import json_text, write_atomic

        self.data["vit_fast_version"] = __version__
        self.data["elapsed_s"] = round(time.time() - self.started, 1)
        data = strict(self.data)
        texts = {
            "kernels.csv": _csv(KERNEL_FIELDS, data["kernels"] + data["tma"]),
            "perf.csv": _csv(PERF_FIELDS, perf_rows(data)),
            "summary.md": summary(data),
            "run.log": "\n".join(self.lines) + "\n",
        }
        data["file_sha256"] = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()}
        for name, text in texts.items():
            write_atomic(self.out / name, text)
        write_atomic(self.out / "results.json", json_text(data))


def read_record(path: Path, what: str) -> dict[str, Any]:
    """An evidence record (results.json) read and its types checked, or a UsageError saying what is wrong: refused
    by its size before it is read, and when it is not JSON, not an object, or a carried key has the wrong type."""
    from vit_fast.util.files import JSONInputError, loads_json

    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UsageError(f"{what} {str(path)!r} does not exist: give an earlier run's results.json") from None
    except OSError as err:
        raise UsageError(f"{what} {str(path)!r} cannot be read: {err.strerror or err}") from None
    if not path.is_file():
        raise UsageError(f"{what} {str(path)!r} is not a file: give an earlier run's results.json")
    if size > RESUME_MAX_BYTES:  # refused by its size, never read
        raise UsageError(
            f"{what} {str(path)!r} is {size / 2**20:.0f} MiB, more than the {RESUME_MAX_BYTES // 2**20} MiB an "
            "evidence record can be (about 1 MB): give an earlier run's results.json"
        )
    try:
        data = loads_json(path.read_bytes(), f"{what} {str(path)!r}")
    except JSONInputError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"{what} {str(path)!r} cannot be read: {err.strerror or err}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{what} {str(path)!r} holds a JSON {type(data).__name__}, not an evidence record (an object)")
    for key, kind in CARRIED.items():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UsageError(f"{what} {str(path)!r}: {key!r} is a {type(value).__name__}, not an evidence record's")
        if isinstance(value, list) and not all(isinstance(row, dict) for row in value):
            raise UsageError(f"{what} {str(path)!r}: {key!r} holds entries that are not objects (rows)")
    for p in data.get("phases") or []:
        if not isinstance(p.get("name"), str) or p["name"] not in PHASES:
            raise UsageError(f"{what} {str(path)!r}: a phase without a known name ({p.get('name')!r})")
    return data


def _csv(fields: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in fields})
    return buf.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def check_out(out: Path, overwrite: bool) -> None:
    """Before any work: ``out`` is a folder we may write, and each file this run writes there is new or an earlier
    evidence run's own (its results.json carries vit-fast's marker and the digest of the others' bytes)."""
    from vit_fast.util.files import check_files_in, check_output_dir, written_by_vit_fast

    check_output_dir(out, "--out folder")
    digests: dict[str, str] = {}
    if (out / "results.json").is_file() and written_by_vit_fast(out / "results.json"):
        with contextlib.suppress(ValueError, OSError):
            digests = json.loads((out / "results.json").read_text()).get("file_sha256") or {}

    def unchanged(path: Path) -> bool:
        return digests.get(path.name) == hashlib.sha256(path.read_bytes()).hexdigest()

    ours = {name: unchanged for name in FILES if name != "results.json"}
    check_files_in(out, FILES, "evidence", overwrite=overwrite, ours=ours)


# --------------------------------------------------------------------------------------------- shared helpers
def count_compiles(evidence: Evidence) -> None:
    """Count every compilation of a Triton JIT function (ours; inductor compiles through its own path)."""
    from triton.runtime import jit

    real = jit.JITFunction._do_compile

    def counted(self, *args, **kwargs):
        evidence.compiles += 1
        return real(self, *args, **kwargs)

    jit.JITFunction._do_compile = counted


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def compiles_in(evidence: Evidence, record: dict[str, Any]) -> Iterator[None]:
    before = evidence.compiles
    try:
        yield
    finally:
        record["compiles"] = evidence.compiles - before


def release(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def failure(err: BaseException) -> dict[str, Any]:
    first = (str(err).strip().splitlines() or [""])[0]
    return {"status": "error", "error": f"{type(err).__name__}: {first}"[:500], "traceback": traceback.format_exc()}


def timing(fn: Callable[[], Any], device, min_time: float) -> dict[str, Any]:
    """The bench's own sampling (vit_fast.bench.timing): CUDA events per call on a GPU, at least ``min_time``
    seconds and 20 calls after 10 warm-up calls."""
    from vit_fast.bench.timing import Sampling, sample, summarize

    plan = Sampling(warmup=10, min_samples=20, min_time_s=min_time, max_seconds=max(2.0, 4 * min_time), floor=5)
    times, stopped_by = sample(fn, device, plan)
    return {**summarize(times), "stopped_by": stopped_by}


# --------------------------------------------------------------------------------------------- phases
class Phases:
    """The steps of each phase, built from the command line; models and inputs are made on first use."""

    def __init__(self, evidence: Evidence, args: argparse.Namespace, device) -> None:
        self.ev, self.args, self.device = evidence, args, device
        self.cuda = device.type == "cuda"
        self._models: dict[tuple[str, str], Any] = {}
        self._backends: dict[str, Any] = {}
        self._refs: dict[int, Any] = {}
        self._inputs: dict[int, Any] = {}
        self._stack = contextlib.ExitStack()  # what this process wrote for itself, removed by close()
        self._pipeline_files: list[Path] | None = None
        self.workdir = Path(
            tempfile.gettempdir()
        )  # the bench's backends built here (no ONNX, no TensorRT) write nothing

    # -- models
    def model(self, spec: str, dtype_name: str = "fp32") -> Any:
        from vit_fast.interop.loading import load_model
        from vit_fast.util.dtypes import DTYPES

        key = (spec, dtype_name)
        if key not in self._models:
            base = load_model(spec, backend="torch", seed=self.args.seed).eval()
            self._models[key] = base.to(device=self.device, dtype=DTYPES[dtype_name])
        return self._models[key]

    def forget(self) -> None:
        """Drop every model, backend, input and reference built so far (the dry run, between phases)."""
        self._models.clear()
        self._backends.clear()
        self._refs.clear()
        self._inputs.clear()

    def perf_input(self, batch: int) -> Any:
        import torch

        if batch not in self._inputs:
            model = self.model(self.args.perf_model, self.args.perf_dtype)
            h, w = model.cfg.img_hw
            gen = torch.Generator().manual_seed(self.args.seed * 100003 + batch)
            x = torch.randn(batch, model.cfg.in_chans, h, w, generator=gen)
            self._inputs[batch] = x.to(device=self.device, dtype=model.dtype)
        return self._inputs[batch]

    def steps(self, phase: str) -> list[Step]:
        return getattr(self, f"_{phase}")()

    # -- env
    def _env(self) -> list[Step]:
        return [
            Step("env", "versions and device", 3.0, self.env_versions),
            Step("env", "environment checks", 1.0, self.env_checks),
            Step("env", "trivial Triton kernel", 1.0, self.env_trivial_kernel, launch=self.env_trivial_kernel),
            Step("env", "SDPA backend", 2.0, self.env_sdpa),
            Step("env", "nvJPEG decode against Pillow", 0.5, self.env_nvjpeg),
        ]

    def env_versions(self) -> list[dict[str, Any]]:
        from vit_fast.backend.env import collect_environment

        env = collect_environment(self.device)
        env["nvidia_smi"] = _command(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,"
                "power.limit,temperature.gpu,persistence_mode",
                "--format=csv",
            ]
        )
        env["triton_cache_dir"] = os.environ.get("TRITON_CACHE_DIR")
        env["mode"] = self.ev.mode
        if self.cuda:
            import torch

            env["sm_count"] = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.ev.data["env"].update(env)
        return [{"status": "ok", "summary": f"{env['device_name']}, torch {env['torch']}, triton {env['triton']}"}]

    def env_checks(self) -> list[dict[str, Any]]:
        from vit_fast.doctor import environment_checks

        checks = environment_checks(self.device)
        self.ev.data["env"]["checks"] = [{k: c.get(k) for k in ("name", "status", "summary")} for c in checks]
        bad = [c["name"] for c in checks if c["status"] == "failed"]
        return [{"status": "failed" if bad else "ok", "summary": "failed: " + ", ".join(bad) if bad else "all ok"}]

    def env_trivial_kernel(self) -> list[dict[str, Any]]:
        """One trivial kernel compiled and launched: proves the C compiler, Python.h and libcuda before any of ours."""
        import torch

        x = torch.arange(1000, dtype=torch.float32, device=self.device)
        out = torch.full_like(x, float("nan"))
        start = time.perf_counter()
        _trivial_kernel()[(4,)](x, out, 1000, BLOCK=256)
        sync(self.device)
        seconds = time.perf_counter() - start
        computed = bool(torch.equal(out, x + 1))
        status = "ok" if computed else ("not computed (stubbed driver)" if self.ev.mode == "stub" else "failed")
        return [{"status": status, "seconds": seconds, "summary": f"compiled and launched in {seconds:.2f} s"}]

    def env_sdpa(self) -> list[dict[str, Any]]:
        import torch
        import torch.nn.functional as F

        if not self.cuda:
            self.ev.data["env"]["sdpa"] = "cpu: no CUDA kernel to name"
            return [{"status": "skipped", "summary": "no CUDA"}]
        q = torch.randn(1, 12, 197, 64, device=self.device, dtype=torch.bfloat16)
        F.scaled_dot_product_attention(q, q, q)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(q, q, q)
            sync(self.device)
        names = sorted({e.key for e in prof.key_averages() if _is_device_event(e)})
        kind = next((k for k in ("flash", "cudnn", "efficient", "fmha") if any(k in n.lower() for n in names)), "math")
        self.ev.data["env"]["sdpa"] = {"kind": kind, "kernels": names}
        return [{"status": "ok", "summary": f"{kind}: {', '.join(names)[:200]}"}]

    def env_nvjpeg(self) -> list[dict[str, Any]]:
        """JPEGs decoded as ``predict`` and ``serve --encoded`` decode them here (nvJPEG through torchvision where
        :func:`vit_fast.interop.images.gpu_jpeg_decoder` chooses it) against Pillow: same shape, mean |diff| below
        NVJPEG_MEAN_TOLERANCE per image; skipped with the chooser's reason where nvJPEG is not chosen."""
        import torch

        from vit_fast.interop.images import GpuJpegs, gpu_jpeg_decoder, gpu_jpeg_header, load_image

        decode, how = gpu_jpeg_decoder(self.device)
        if decode is None:
            self.ev.data["env"]["nvjpeg"] = {"skipped": how}
            return [{"status": "skipped", "summary": how}]
        samples = nvjpeg_samples(self.args.seed)
        import numpy as np

        headers = [gpu_jpeg_header(data) for _, data in samples]
        decoded = GpuJpegs(decode).decode_all([data for _, data in samples], headers)  # type: ignore[arg-type]
        sync(self.device)
        rows = []
        for (name, data), gpu in zip(samples, decoded, strict=True):
            pil = torch.from_numpy(np.asarray(load_image(data, "RGB")).copy()).permute(2, 0, 1)
            if gpu is None or tuple(gpu.shape) != tuple(pil.shape):
                got = "refused" if gpu is None else list(gpu.shape)
                rows.append({"image": name, "ok": False, "shape": got, "pillow_shape": list(pil.shape)})
                continue
            diff = (gpu.cpu().float() - pil.float()).abs()
            mean = float(diff.mean())
            rows.append({"image": name, "ok": mean < NVJPEG_MEAN_TOLERANCE, "mean_abs": round(mean, 3),
                         "p99_abs": float(diff.flatten().kthvalue(max(1, int(0.99 * diff.numel()))).values),
                         "max_abs": float(diff.max())})  # fmt: skip
        self.ev.data["env"]["nvjpeg"] = {"decoder": how, "tolerance_mean_abs": NVJPEG_MEAN_TOLERANCE, "images": rows}
        bad = [r["image"] for r in rows if not r["ok"]]
        worst = max((r.get("mean_abs", 0.0) for r in rows), default=0.0)
        said = f"{len(rows)} JPEGs, worst mean |diff| {worst:.3f} (bound {NVJPEG_MEAN_TOLERANCE})"
        return [{"status": "failed" if bad else "ok", "summary": said + (f"; failed: {', '.join(bad)}" if bad else "")}]

    # -- kernels
    def kernel_cases(self) -> list[tuple[str, Any]]:
        from vit_fast.model.selfcheck import family_cases, model_cases
        from vit_fast.util.dtypes import DTYPES

        runs = []
        for dtype_name in self.args.dtypes:
            batches = {"fp32": self.args.fp32_batches, "fp16": self.args.fp16_batches}.get(
                dtype_name, self.args.kernel_batches
            )
            for batch in batches:
                dtype = DTYPES[dtype_name]
                for spec in self.args.models:
                    cases = model_cases(self.model(spec).cfg, batch, dtype)
                    # the preprocessing kernel's fp16 output is its fp32 math rounded once: bf16 and fp32 judge it
                    cases = [c for c in cases if c.kernel != "preprocess" or dtype_name != "fp16"]
                    runs += [(spec, c) for c in cases]
                runs += [("family", c) for c in family_cases(batch, dtype)]
        return runs

    def _kernels(self) -> list[Step]:
        steps = []
        for spec, case in self.kernel_cases():
            name = f"{case.name} b={case.dims['batch']} ({spec})"
            steps.append(
                Step(
                    "kernels",
                    name,
                    0.15,
                    lambda spec=spec, case=case: [self.check_case("kernels", spec, case)],
                    launch=lambda case=case: self.launch_case(case),
                    compiles=0.5,  # the dry run counts about one compilation per two checks
                )
            )
        return steps

    def launch_case(self, case) -> Any:
        from vit_fast.model.selfcheck import launch_case

        return launch_case(case, self.device, self.args.seed)

    def check_case(self, phase: str, spec: str, case, tma: bool | None = None) -> dict[str, Any]:
        from vit_fast.kernels.launches import record_launches
        from vit_fast.model.selfcheck import check_kernel

        row: dict[str, Any] = {"phase": phase, "model": spec, "batch": case.dims["batch"], "tma": tma}
        with compiles_in(self.ev, row), record_launches() as launches:
            record = check_kernel(case, self.device, self.args.seed, reference_device=self.device)
        record.pop("traceback", None) if record["status"] == "ok" else None
        row.update(record)
        if launches:
            row.update({k: v for k, v in launches[-1].items() if k != "kernel"})
        return row

    # -- model
    def _model(self) -> list[Step]:
        from vit_fast.model.vit import count_flops

        steps = []
        for spec in self.args.models:
            for dtype_name in self.args.dtypes:
                flops = count_flops(self.model(spec).cfg)
                seconds = 2.0 + 12 * flops / CPU_FLOAT64_RATE  # verify's batches 1, 3, 8 in float64 on the CPU
                steps.append(
                    Step(
                        "model",
                        f"{spec} {dtype_name}",
                        seconds,
                        lambda spec=spec, d=dtype_name: [self.check_model(spec, d)],
                        launch=lambda spec=spec, d=dtype_name: self.model_forward(spec, d, (1, 3, 8)),
                    )
                )
        return steps

    def model_forward(self, spec: str, dtype_name: str, batches: tuple[int, ...]) -> None:
        import torch

        model = copy.deepcopy(self.model(spec, dtype_name)).set_backend("triton")
        h, w = model.cfg.img_hw
        with torch.no_grad():
            for b in batches:
                model(torch.randn(b, model.cfg.in_chans, h, w, device=self.device, dtype=model.dtype))

    def check_model(self, spec: str, dtype_name: str) -> dict[str, Any]:
        from vit_fast.export import verify

        row: dict[str, Any] = {"model": spec, "dtype": dtype_name}
        with compiles_in(self.ev, row):
            report = verify(
                self.model(spec),
                "triton",
                dtype=dtype_name,
                seed=self.args.seed,
                print_table=False,
                raise_on_failure=False,
                progress=False,
            ).to_dict()
        worst = max(report["rows"], key=lambda r: r["max_abs_err"] / r["bound"] if r["bound"] else float("inf"))
        row.update(
            status="ok" if report["passed"] else "failed",
            batches=sorted({r["batch"] for r in report["rows"]}),
            runtime=report["runtime"],
            **{k: worst[k] for k in ("max_abs_err", "eager_max_abs_err", "bound", "cosine")},
            summary=f"worst max|err| {worst['max_abs_err']:.2e} vs torch {worst['eager_max_abs_err']:.2e}, "
            f"bound {worst['bound']:.2e}",
        )
        return row

    # -- tma
    def tma_cases(self) -> list[Any]:
        from vit_fast.model.selfcheck import model_cases
        from vit_fast.util.dtypes import DTYPES

        cfg = self.model(self.args.perf_model).cfg
        return [
            case
            for dtype_name in (self.args.perf_dtype,)
            for batch in self.args.tma_batches
            for case in model_cases(cfg, batch, DTYPES[dtype_name])
            if case.kernel in ("linear", "layer_norm_linear")
        ]

    def _tma(self) -> list[Step]:
        return [
            Step(
                "tma",
                f"{case.name} b={case.dims['batch']} TMA {'on' if tma else 'off'}",
                0.6,
                lambda case=case, tma=tma: [self.tma_case(case, tma)],
                launch=lambda case=case, tma=tma: self.with_tma(tma, lambda: self.launch_case(case)),
            )
            for case in self.tma_cases()
            for tma in (True, False)
        ]

    @staticmethod
    def with_tma(on: bool, fn: Callable[[], Any]) -> Any:
        """``fn()`` with ``VIT_FAST_TMA`` set on or off (the switch is read per tuning, and a launch's TMA_OK
        argument, part of its cache key, follows it), the environment restored after."""
        from unittest import mock

        with mock.patch.dict(os.environ, {"VIT_FAST_TMA": "1" if on else "0"}):
            return fn()

    def tma_case(self, case, tma: bool) -> dict[str, Any]:
        from vit_fast.model.selfcheck import prepared_launch

        def work() -> dict[str, Any]:
            row = self.check_case("tma", self.args.perf_model, case, tma=tma)
            if row["status"] == "ok":
                launch = prepared_launch(case, self.device, self.args.seed)
                stats = timing(launch, self.device, 0.2)
                row["median_ms"] = stats["median_ms"]
                d = case.dims
                flops = 2 * d["batch"] * d["tokens"] * d["k_in"] * d["n_out"]
                row["tflops"] = flops / (stats["median_ms"] * 1e-3) / 1e12
            return row

        return self.with_tma(tma, work)

    # -- perf
    PERF_BACKENDS = (
        ("torch", False),
        ("torch", True),
        ("timm", False),
        ("hf", False),
        ("triton", False),
        ("triton", True),
    )

    def _perf(self) -> list[Step]:
        steps = [Step("perf", "ceilings (copy bandwidth, matmul rate)", 5.0, self.perf_ceilings, rows=False)]
        for batch in self.args.perf_batches:
            for backend, graph in self.PERF_BACKENDS:
                label = f"{backend}+graph" if graph else backend
                ours = backend == "triton"
                steps.append(
                    Step(
                        "perf",
                        f"{label} batch {batch}",
                        1.5,
                        lambda b=backend, g=graph, n=batch: [self.perf_case(b, g, n)],
                        launch=(lambda n=batch: self.triton_warmup(n, False)) if ours and not graph else None,
                    )
                )
        steps += self._pipeline()
        steps.append(Step("perf", "first output, fresh process and cache", 25.0, self.first_output, rows=False))
        for batch in sorted({min(self.args.perf_batches), max(self.args.perf_batches)}):
            steps.append(
                Step("perf", f"launches per forward, batch {batch}", 4.0, lambda n=batch: self.launches(n), rows=False)
            )
        return steps

    # -- the pipeline rows: image files on disk to top-k (benchmarks/pipeline.py's two paths, on this device)
    def _pipeline(self) -> list[Step]:
        n, batch = self.args.pipeline_images, self.args.pipeline_batch
        if n == 0:
            return []
        return [
            Step("perf", f"pipeline: {n} image files written", 1.0 + 0.01 * n, self.pipeline_write, rows=False),
            Step("perf", "pipeline: by hand, one image at a time", 2.0 + 0.03 * n, self.pipeline_by_hand),
            Step(
                "perf",
                f"pipeline: predict, batch {batch}",
                2.0 + 0.01 * n,
                self.pipeline_predict,
                launch=self.pipeline_launch,
                compiles=6.0,  # the fused preprocessing kernel's autotune candidates
            ),
        ]

    def pipeline_files(self) -> list[Path]:
        """The pipeline's image files (JPEGs of PIPELINE_SIZES for a preset, PNG digits for ``default``), written
        once per process into a private temporary folder that :meth:`close` removes."""
        if self._pipeline_files is None:
            from vit_fast.util.files import temp_staging

            folder = self._stack.enter_context(temp_staging("vit-fast-evidence-images"))
            pipeline = pipeline_script()
            files: list[Path] = []
            per_size = -(-self.args.pipeline_images // len(PIPELINE_SIZES))
            for i, size in enumerate(PIPELINE_SIZES):
                (folder / str(i)).mkdir()
                count = min(per_size, self.args.pipeline_images - len(files))
                files += pipeline.write_images(folder / str(i), self.args.perf_model, count, size, seed=i)
            self._pipeline_files = files
        return self._pipeline_files

    def close(self) -> None:
        """Remove what this process wrote for itself (the pipeline's image files)."""
        self._pipeline_files = None
        self._stack.close()

    def pipeline_write(self) -> list[dict[str, Any]]:
        files = self.pipeline_files()
        sizes = ", ".join(f"{h}x{w}" for h, w in PIPELINE_SIZES)
        return [{"status": "ok", "summary": f"{len(files)} files ({files[0].suffix}; sizes {sizes} for a preset)"}]

    def pipeline_row(self, path: str, batch: int, fn: Callable[[], Any]) -> dict[str, Any]:
        """One pipeline row: ``fn`` (a pass over every file) timed once after one untimed pass; a failure is the
        row's, never the other rows'."""
        row: dict[str, Any] = {"phase": "perf", "label": PIPELINE + path, "dtype": self.args.perf_dtype}
        row["batch"] = batch
        try:
            notes, files = [], self.pipeline_files()
            seconds = pipeline_script().timed(lambda: notes.append(fn()), 1)
            sync(self.device)
        except Exception as err:
            release(self.device)
            return {**row, **failure(err)}
        per_image = f"{len(files)} files per pass"
        return {
            **row, "status": "ok", "median_ms": seconds * 1e3, "n": 1, "images_per_s": len(files) / seconds,
            "notes": f"{per_image}; {notes[-1]}" if notes and notes[-1] else per_image,
        }  # fmt: skip

    def pipeline_by_hand(self) -> list[dict[str, Any]]:
        """PIL, the library's eval transform (timm's where torchvision imports), the torch model, top-k."""
        from vit_fast import image_transform

        try:
            pipeline = pipeline_script()
            model = self.model(self.args.perf_model, self.args.perf_dtype)
            hand, what = pipeline.library_transform(model, self.args.perf_model)
            mode = "L" if image_transform(model).preprocessing.channels == 1 else "RGB"
            files = self.pipeline_files()
        except Exception as err:  # its row's failure, labelled as the row (no Pillow, no model)
            return [self.pipeline_failed("by hand", 1, err)]
        return [self.pipeline_row(f"by hand ({what})", 1, lambda: pipeline.by_hand(model, files, hand, mode, 5))]

    def pipeline_failed(self, path: str, batch: int, err: Exception) -> dict[str, Any]:
        release(self.device)
        return {
            "phase": "perf",
            "label": PIPELINE + path,
            "dtype": self.args.perf_dtype,
            "batch": batch,
            **failure(err),
        }

    def pipeline_predict(self) -> list[dict[str, Any]]:
        """What ``vit-fast predict`` runs on the triton backend: decode threads, the fused preprocessing kernel,
        batches of --pipeline-batch."""
        import argparse as _argparse

        from vit_fast import image_transform

        batch = self.args.pipeline_batch
        label = f"predict (triton, decode threads, batch {batch})"
        try:
            built = self.backend("triton", False)
            if isinstance(built, str):
                return [{"phase": "perf", "label": PIPELINE + label, "batch": batch, "status": "unavailable",
                         "notes": built}]  # fmt: skip
            pipeline = pipeline_script()
            model, files = built.module, self.pipeline_files()
            ours = image_transform(self.model(self.args.perf_model, self.args.perf_dtype))
        except Exception as err:
            return [self.pipeline_failed(label, batch, err)]
        args = _argparse.Namespace(decode_threads=None, batch=batch, top_k=5)
        return [self.pipeline_row(label, batch, lambda: pipeline.predict_path(model, files, ours, args))]

    def pipeline_launch(self) -> None:
        """The dry run's compilations of the predict row: the fused kernel on one image of each size, the triton
        model at --pipeline-batch."""
        import torch

        from vit_fast import image_transform
        from vit_fast.interop.image_transform import fused_unsupported
        from vit_fast.kernels.preprocess import preprocess

        self.triton_warmup(self.args.pipeline_batch, False)
        pre = image_transform(self.model(self.args.perf_model, self.args.perf_dtype)).preprocessing
        if fused_unsupported(pre, "cuda") is None:
            images = [torch.zeros(h, w, 3, dtype=torch.uint8, device=self.device) for h, w in PIPELINE_SIZES]
            resize = [pre.resize_hw(h, w) for h, w in PIPELINE_SIZES]
            dtype = self.model(self.args.perf_model, self.args.perf_dtype).dtype
            preprocess(images, resize=resize, crop=pre.output_hw, interpolation=pre.interpolation, mean=pre.mean,
                       std=pre.std, out_dtype=dtype, crop_rounding=pre.crop_rounding,
                       uint8_passes=pre.uint8_passes)  # fmt: skip

    def perf_ceilings(self) -> list[dict[str, Any]]:
        from vit_fast.bench.ceilings import measure_bandwidth, measure_matrix_rate

        if not self.cuda:
            self.ev.data["ceilings"] = {"not_measured": "no GPU: a CPU's rates bound nothing here"}
            return [{"status": "skipped", "summary": "no GPU"}]
        ceilings = {"bandwidth": measure_bandwidth(self.device), "matrix": {}}
        ceilings["matrix"][self.args.perf_dtype] = measure_matrix_rate(self.device, self.args.perf_dtype)
        self.ev.data["ceilings"] = ceilings
        release(self.device)
        bw, rate = ceilings["bandwidth"]["GBps"], ceilings["matrix"][self.args.perf_dtype]["TFLOPs"]
        return [{"status": "ok", "summary": f"copy {bw:.0f} GB/s, {self.args.perf_dtype} matmul {rate:.0f} TFLOP/s"}]

    def backend(self, backend: str, graph: bool, tune: bool = False) -> Any:
        from vit_fast.bench.backends import Variant, build_backend, static_unavailable

        key = f"{backend}{'+graph' if graph else ''}{' tuned' if tune else ''}"
        if key not in self._backends:
            variant = Variant(backend, graph=graph)
            reason = static_unavailable(variant, self.device, self.args.perf_dtype)
            if reason is not None and not (self.ev.mode == "stub" and backend == "triton" and not graph):
                self._backends[key] = reason  # the stub stands in for a GPU on the triton path only
            else:
                ref = self.model(self.args.perf_model, self.args.perf_dtype)
                self._backends[key] = build_backend(
                    variant, ref, self.args.perf_dtype, self.device, None, self.workdir, tune=tune
                )
        return self._backends[key]

    def reference_output(self, batch: int) -> Any:
        import torch

        if batch not in self._refs:
            model = self.model(self.args.perf_model, self.args.perf_dtype)
            with torch.no_grad():
                self._refs[batch] = model(self.perf_input(batch)).float()
        return self._refs[batch]

    def triton_warmup(self, batch: int, tune: bool) -> None:
        built = self.backend("triton", False, tune)
        if not isinstance(built, str):
            built.module.warmup([batch], dtype=built.module.dtype, tune=tune, verbose=False)

    def perf_case(self, backend: str, graph: bool, batch: int, tune: bool = False, phase: str = "perf") -> dict:
        import torch

        from vit_fast.bench.backends import FellBack
        from vit_fast.util.numerics import agreement_bound, max_err, scale_of

        label = f"{backend}{' tuned' if tune else ''}{'+graph' if graph else ''}"
        row: dict[str, Any] = {"phase": phase, "label": label, "dtype": self.args.perf_dtype, "batch": batch}
        built = self.backend(backend, graph, tune)
        if isinstance(built, str):
            return {**row, "status": "unavailable", "notes": built}
        x = self.perf_input(batch)
        start = time.perf_counter()
        try:
            with compiles_in(self.ev, row), torch.no_grad():
                case = built.prepare(x)
                out = case.fetch(case.run())
                sync(self.device)
            row["first_output_s"] = time.perf_counter() - start
            ref = self.reference_output(batch)
            err = max_err(out.float(), ref) if torch.isfinite(out).all() else float("nan")
            row["max_abs_err_vs_torch"] = err
            row["agrees_with_torch"] = bool(err <= agreement_bound(out.dtype, scale_of(ref)))
            del out
            with torch.no_grad():
                stats = timing(case.run, self.device, self.args.min_time)
        except FellBack as err:
            return {**row, "status": "fallback", "notes": str(err)}
        except Exception as err:  # one backend's failure is its row's; the others go on
            release(self.device)
            return {**row, **failure(err)}
        row.update(stats, status="ok", images_per_s=batch / (stats["median_ms"] * 1e-3), notes=case.notes)
        return row

    def first_output(self) -> list[dict[str, Any]]:
        """A new process, a new Triton cache: seconds from the start of Python to the first output of the perf model
        on the triton backend at batch 1, and the compilations before it."""
        if self.ev.mode == "stub":
            return [{"status": "skipped", "summary": "stubbed driver: a child process would compile for real"}]
        with tempfile.TemporaryDirectory(prefix="vit-fast-fresh-cache-") as cache:
            env = {**os.environ, "TRITON_CACHE_DIR": cache}
            cmd = [
                sys.executable,
                str(Path(__file__)),
                "--first-output-child",
                self.args.perf_model,
                "--perf-dtype",
                self.args.perf_dtype,
            ]
            start = time.perf_counter()
            limit = first_output_timeout(self.ev.left())
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
            except subprocess.TimeoutExpired:
                return [{"status": "error", "error": f"no first output within {limit:.0f} s: the child was killed"}]
            wall = time.perf_counter() - start
        if proc.returncode != 0:
            return [{"status": "error", "error": proc.stderr[-2000:]}]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["process_s"] = wall
        self.ev.data["first_output"] = result
        return [{"status": "ok", "summary": f"{result['first_output_s']:.1f} s, {result['compiles']} compilations"}]

    def perf_model_info(self) -> dict[str, Any]:
        """The perf model's size and work, for the floor column."""
        import torch

        from vit_fast.model.vit import count_flops
        from vit_fast.util.dtypes import DTYPES

        model = self.model(self.args.perf_model)
        params = sum(p.numel() for p in model.parameters())
        return {
            "model": self.args.perf_model,
            "params": params,
            "flops_per_image": count_flops(model.cfg),
            "weight_bytes": params * torch.empty((), dtype=DTYPES[self.args.perf_dtype]).element_size(),
        }

    def launches(self, batch: int) -> list[dict[str, Any]]:
        """Launches of one triton forward, counted by a Triton launch hook and by our launch record, and on a GPU
        torch.profiler's count of device kernels, with each kernel's time; the same profile of torch eager."""
        import torch
        from triton import knobs

        from vit_fast.kernels.launches import record_launches

        built = self.backend("triton", False)
        if isinstance(built, str):
            return [{"status": "unavailable", "summary": built}]
        model, x = built.module, self.perf_input(batch)
        hooked: list[str] = []

        def hook(metadata) -> None:
            hooked.append(metadata.get()["name"] if hasattr(metadata, "get") else "?")

        with torch.no_grad():
            model(x)  # compiled, checked and cleared before counting
            sync(self.device)
            knobs.runtime.launch_enter_hook.add(hook)
            try:
                with record_launches() as recorded:
                    model(x)
                    sync(self.device)
            finally:
                knobs.runtime.launch_enter_hook.remove(hook)
        entry: dict[str, Any] = {"hook": len(hooked), "recorded": len(recorded)}
        entry["programs"] = [[r["kernel"], r["programs"]] for r in recorded[:7]]
        if self.cuda:
            entry["profiler"] = self.profile(model, x)
            torch_model = self.backend("torch", False)
            if not isinstance(torch_model, str):
                entry["torch_profiler"] = self.profile(torch_model.module, x)
        self.ev.data["launches"][str(batch)] = entry
        prof = entry.get("profiler", {}).get("kernels")
        return [{"status": "ok", "summary": f"hook {len(hooked)}, recorded {len(recorded)}, profiler {prof}"}]

    def profile(self, module: Any, x: Any) -> dict[str, Any]:
        import torch

        with torch.no_grad():
            module(x)
            sync(self.device)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                module(x)
                sync(self.device)
        events = [e for e in prof.events() if _is_device_event(e)]
        per_kernel: dict[str, list[float]] = {}
        for e in events:
            per_kernel.setdefault(e.name, []).append(_device_us(e))
        top = sorted(per_kernel.items(), key=lambda kv: -sum(kv[1]))[:12]
        return {
            "kernels": len(events),
            "device_us": round(sum(sum(v) for v in per_kernel.values()), 1),
            "top": [{"kernel": k[:90], "count": len(v), "us": round(sum(v), 1)} for k, v in top],
        }

    # -- compile
    def _compile(self) -> list[Step]:
        steps = []
        for batch in self.args.compile_batches:
            for source in self.args.compile_sources:
                # dynamo compiles the model once (about a minute) and again for each new batch size (dynamic=False)
                steps.append(
                    Step(
                        "compile",
                        f"torch.compile({source}) batch {batch}",
                        lambda s=source: 30.0 if f"compiled {s}" in self._backends else 60.0,
                        lambda s=source, n=batch: [self.compile_case(s, n)],
                        planned=lambda _, first=batch == self.args.compile_batches[0]: 60.0 if first else 30.0,
                    )
                )
        return steps

    def compile_case(self, source: str, batch: int) -> dict[str, Any]:
        import torch

        label = f"compile({source})"
        key = f"compiled {source}"
        if key not in self._backends:
            built = self.backend(source, False)
            if isinstance(built, str):
                self._backends[key] = built
            else:
                module = copy.deepcopy(built.module)
                self._backends[key] = torch.compile(module, fullgraph=True, dynamic=False)
        compiled = self._backends[key]
        row: dict[str, Any] = {"phase": "compile", "label": label, "dtype": self.args.perf_dtype, "batch": batch}
        if isinstance(compiled, str):
            return {**row, "status": "unavailable", "notes": compiled}
        x = self.perf_input(batch)
        try:
            start = time.perf_counter()
            with torch.no_grad():
                out = compiled(x)
                sync(self.device)
            row["first_output_s"] = row["compile_s"] = time.perf_counter() - start
            ref = self.reference_output(batch)
            from vit_fast.util.numerics import agreement_bound, max_err, scale_of

            err = max_err(out.float(), ref)
            row.update(
                max_abs_err_vs_torch=err, agrees_with_torch=bool(err <= agreement_bound(out.dtype, scale_of(ref)))
            )
            with torch.no_grad():
                stats = timing(lambda: compiled(x), self.device, self.args.min_time)
        except Exception as err:
            release(self.device)
            return {**row, **failure(err)}
        notes = "torch.compile(fullgraph=True, dynamic=False), default mode; first call = compile"
        return {**row, **stats, "status": "ok", "images_per_s": batch / (stats["median_ms"] * 1e-3), "notes": notes}

    # -- tuned
    def _tuned(self) -> list[Step]:
        steps = []
        for batch in self.args.tuned_batches:
            steps.append(
                Step(
                    "tuned",
                    f"tune triton batch {batch}",
                    self.tuning_estimate,
                    lambda n=batch: [self.tuned_case(n)],
                    launch=lambda n=batch: self.triton_warmup(n, True),
                    planned=lambda compiles: 2.0 + compiles * (COMPILE_SECONDS + 0.15),  # each compiled, then timed
                )
            )
            steps.append(
                Step(
                    "tuned",
                    f"triton tuned+graph batch {batch}",
                    2.0,
                    lambda n=batch: [self.perf_case("triton", True, n, tune=True, phase="tuned")],
                )
            )
        return steps

    def tuning_estimate(self) -> float:
        """Seconds to tune one batch class: the warm-up's own upper bound of its compilations, each compiled and
        timed (about 0.15 s of timing a candidate beside its compilation)."""
        from vit_fast.model.warmup import estimate_compilations

        model = self.model(self.args.perf_model, self.args.perf_dtype)
        return estimate_compilations(model, 1, tune=True) * (self.ev.compile_s() + 0.15)

    def tuned_case(self, batch: int) -> dict[str, Any]:
        record_candidate_timings(self.ev)
        row = self.perf_case("triton", False, batch, tune=True, phase="tuned")
        if row.get("first_output_s") is not None:
            row["notes"] = f"{row.get('notes', '')}; tuning and first output {row['first_output_s']:.1f} s"
        return row


# --------------------------------------------------------------------------------------------- small helpers
_TRIVIAL: list[Any] = []
#: the shape arguments an autotune record names (the GEMMs' M, N, K; attention's T and head dim; ...)
SHAPE_ARGS = ("M", "N", "K", "M_CLASS", "T", "HEAD_DIM", "D", "TMA_OK")


def record_candidate_timings(evidence: Evidence) -> None:
    """From now on, every config Triton's autotuner times goes into results.json's ``tuning`` table (kernel, shape,
    config, warps, stages, ms): the numbers that decide a tile (e.g. split-K or narrower tiles where a batch-8 GEMM
    leaves SMs idle), beside the pick the autotuner kept. Installed once."""
    from triton.runtime import autotuner

    if getattr(autotuner.Autotuner._bench, "_evidence", False):
        return
    real = autotuner.Autotuner._bench
    table = evidence.data.setdefault("tuning", [])

    def bench(self, *args, config, **meta):
        timings = real(self, *args, config=config, **meta)
        nargs = getattr(self, "nargs", None) or {}
        ms = timings[0] if isinstance(timings, (list, tuple)) else timings
        table.append(
            {
                "kernel": getattr(self.base_fn, "__name__", "?"),
                "shape": {k: nargs[k] for k in SHAPE_ARGS if isinstance(nargs.get(k), int)},
                "config": dict(config.kwargs),
                "num_warps": config.num_warps,
                "num_stages": config.num_stages,
                "ms": float(ms) if ms is not None else None,
            }
        )
        return timings

    bench._evidence = True
    autotuner.Autotuner._bench = bench


#: nvJPEG against Pillow (libjpeg-turbo): the most mean |diff| per image, in pixel levels (torchvision's own test of
#: its CUDA decode against its CPU decode uses this bound)
NVJPEG_MEAN_TOLERANCE = 2.0


def nvjpeg_samples(seed: int) -> list[tuple[str, bytes]]:
    """A few JPEGs like photos (smooth gradients, a sharp disc, some noise), made in memory: 4:2:0 and 4:4:4 chroma,
    grayscale, and one with EXIF orientation 6 (rotated), at odd sizes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)

    def photo(h: int, w: int) -> Any:
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        disc = ((y - h / 2) ** 2 + (x - w / 3) ** 2 < (min(h, w) / 4) ** 2) * 90.0
        channels = [x / w * 200 + disc, y / h * 180 + 30, (x + y) / (h + w) * 255 - disc]
        noisy = np.stack(channels, -1) + rng.normal(0, 6, (h, w, 3))
        return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))

    def encoded(image: Any, **options: Any) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90, **options)
        return buffer.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6
    return [
        ("375x500 4:2:0", encoded(photo(375, 500), subsampling=2)),
        ("241x319 4:4:4", encoded(photo(241, 319), subsampling=0)),
        ("200x301 gray", encoded(photo(200, 301).convert("L"))),
        ("123x77 EXIF 6", encoded(photo(123, 77), exif=exif.tobytes())),
    ]


def _trivial_kernel() -> Any:
    """``out = x + 1``: the smallest @triton.jit kernel, defined when first asked for (never at import)."""
    if not _TRIVIAL:
        import triton
        import triton.language as tl

        @triton.jit
        def add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

        _TRIVIAL.append(add_one)
    return _TRIVIAL[0]


def _is_device_event(event: Any) -> bool:
    return "CUDA" in str(getattr(event, "device_type", "")).upper()


def _device_us(event: Any) -> float:
    return float(getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0) or 0.0)


def _command(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return f"not run: {err}"
    return (proc.stdout + proc.stderr).strip()


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


# --------------------------------------------------------------------------------------------- the tables
def pipeline_script() -> Any:
    """benchmarks/pipeline.py, whose functions the pipeline rows run."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import pipeline

    return pipeline


def perf_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every timed row (perf, tuned, compile) with its speed-up over the best peer at its dtype and batch (the
    best peer's median over this row's; above 1 is faster) and its ratio to the physical floor."""
    from vit_fast.bench.ceilings import floor_ms

    rows = [dict(r) for r in data["perf"] + data["compile"] if not is_pipeline(r)]
    for r in rows:  # a row without a time (a hostile or damaged record) is no timed row
        if r.get("status") == "ok" and not (isinstance(r.get("median_ms"), (int, float)) and r["median_ms"] > 0):
            r["status"] = "no time recorded"
    best: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("label") not in OURS:
            key = (r.get("dtype"), r.get("batch"))
            if key not in best or r.get("median_ms") < best[key].get("median_ms"):
                best[key] = r
    model = data.get("perf_model") or {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        peer = best.get((r.get("dtype"), r.get("batch")))
        if peer is not None:
            r["speedup_vs_best_peer"] = peer.get("median_ms") / r.get("median_ms")
            r["best_peer"] = peer.get("label")
        ceilings = data.get("ceilings") or {}
        if model and ceilings.get("bandwidth"):
            floor = floor_ms(model["weight_bytes"], model["flops_per_image"] * r.get("batch"), ceilings, r.get("dtype"))
            if floor:
                r["floor_ms"], r["vs_floor"] = floor[0], r.get("median_ms") / floor[0]
    return rows + [dict(r) for r in data["perf"] if is_pipeline(r)]  # their own table: no peer, no floor


def is_pipeline(row: dict[str, Any]) -> bool:
    """A pipeline row (files to top-k: a different quantity from one forward's time)."""
    return str(row.get("label", "")).startswith(PIPELINE)


def first_output_timeout(left: float) -> float:
    """The first-output child's limit: at most FIRST_OUTPUT_LIMIT_S, and never past the time left (5 s at least)."""
    return min(FIRST_OUTPUT_LIMIT_S, max(5.0, left))


def _best(rows: list[dict[str, Any]], batch: int, labels: tuple[str, ...]) -> dict[str, Any] | None:
    """The fastest of ``labels`` at ``batch`` that ran and agrees with torch: a wrong answer meets no target."""
    found = [
        r
        for r in rows
        if r.get("batch") == batch
        and r.get("label") in labels
        and r.get("status") == "ok"
        and r.get("agrees_with_torch") is True
    ]
    return min(found, key=lambda r: r.get("median_ms")) if found else None


def targets(data: dict[str, Any], rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The first-light targets for ViT-B/16 bf16, each as (target, what was measured, met / missed / not run)."""
    out = []

    def verdict(ok: bool | None) -> str:
        if data["driver"] != "cuda":
            return "n/a: not a GPU run"
        return "not run" if ok is None else ("met" if ok else "MISSED")

    graph = _best(rows, 1, ("triton+graph", "triton tuned+graph"))
    peer = graph and graph.get("speedup_vs_best_peer")
    measured = f"{peer:.2f}x {graph.get('best_peer')} ({graph.get('median_ms'):.3f} ms)" if peer else "-"
    out.append(("batch 1: triton + CUDA graph >= 1.5x the best peer", measured, verdict(peer and peer >= 1.5)))
    for batch in (8, 64):
        ours = _best(rows, batch, OURS)
        s = ours and ours.get("speedup_vs_best_peer")
        measured = f"{s:.2f}x ({ours.get('label')} vs {ours.get('best_peer')})" if s else "-"
        out.append((f"batch {batch}: ahead of the best peer", measured, verdict(s and s > 1.0)))
    ours = _best(rows, 256, OURS)
    s = ours and ours.get("speedup_vs_best_peer")
    ok = None if not s else s >= 1.0 and ours.get("images_per_s") >= 12000
    measured = f"{ours.get('images_per_s'):.0f} images/s, {s:.2f}x the best peer" if s else "-"
    out.append(("batch 256: >= the best peer and >= 12,000 images/s (H100)", measured, verdict(ok)))
    first = data.get("first_output")
    out.append(
        (
            "first output on a fresh cache within 10 s",
            f"{first.get('first_output_s'):.1f} s, {first.get('compiles')} compilations" if first else "-",
            verdict(None if not first else first.get("first_output_s") <= 10),
        )
    )
    launches = (data.get("launches") or {}).get("1")
    n = launches and launches.get("hook")
    out.append(
        (
            "launches per forward as designed (62 for ViT-B/16)",
            f"{n} (launch hook)" if n else "-",
            verdict(None if not n else n == 62),
        )
    )
    failed = [r for r in data["kernels"] + data["tma"] if r.get("status") != "ok"]
    checked = len(data["kernels"]) + len(data["tma"])
    out.append(
        (
            "every kernel correct (float64 rule)",
            f"{checked - len(failed)}/{checked} passed",
            verdict(None if not checked else not failed),
        )
    )
    net = first_use_net(data)
    out.append(
        (
            "the first-use safety net fired nowhere",
            f"{len(net.get('checked', []))} first uses checked, {len(net.get('failed', []))} ops fell back"
            if net.get("enabled")
            else "-",
            verdict(None if not net.get("enabled") else not net.get("failed")),
        )
    )
    return out


def first_use_net(data: dict[str, Any]) -> dict[str, Any]:
    """The first-use checks of every phase together (each phase starts with the net reset)."""
    reports = [r for r in (data.get("first_use") or {}).values() if isinstance(r, dict)]
    return {
        "enabled": any(r.get("enabled") for r in reports),
        "checked": [c for r in reports for c in r.get("checked") or []],
        "failed": [f for r in reports for f in r.get("failed") or []],
    }


def _batch_order(batch: Any) -> tuple:
    """Batches in order, then any row without a number for one (a step that failed before its first batch)."""
    number = isinstance(batch, (int, float))
    return (not number, batch if number else 0, str(batch))


def summary(data: dict[str, Any]) -> str:
    """summary.md: what ran, the targets, and each table (a reader's view of results.json)."""
    from vit_fast.util.files import seal_markdown

    env = data.get("env") or {}
    rows = perf_rows(data)
    lines = [
        f"# GPU evidence: {env.get('device_name', '?')}",
        "",
        f"{data['created_utc']} · commit {env.get('git_commit', '?')} · torch {env.get('torch', '?')} · triton "
        f"{env.get('triton', '?')} · driver {env.get('driver_version', '?')} · Triton driver: {data['driver']} · "
        f"budget {data['budget_s']:.0f} s, {data.get('elapsed_s', 0):.0f} s used",
    ]
    if data["driver"] != "cuda":
        lines += ["", f"**Not a GPU run ({data['driver']}): no figure here is a GPU figure.**"]
    lines += [
        "",
        "## Phases",
        "",
        "| phase | status | steps done | seconds | estimate s | compilations |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for p in data["phases"]:
        name = p.get("name")
        lines.append(
            f"| {name} | {p.get('status')} | {p.get('done')}/{p.get('steps')} | {p.get('seconds'):.0f} | "
            f"{p.get('estimate_s'):.0f} | {p.get('compiles')} |"
        )
    lines += ["", "## Targets (ViT-B/16 bf16)", "", "| target | measured | |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in targets(data, rows)]
    pipeline = [r for r in rows if is_pipeline(r)]
    rows = [r for r in rows if not is_pipeline(r)]
    if rows:
        lines += ["", "## Speed, side by side in one process", ""]
        lines.append("speed-up: the best peer's median over the row's (above 1: faster than every peer)")
        # a step that failed before it had a batch (its phase's child died in it) has none: such rows come last
        for batch in sorted({r.get("batch") for r in rows}, key=_batch_order):
            lines += [
                "",
                f"**batch {batch}**" if isinstance(batch, (int, float)) else "**no batch (failed before one)**",
                "",
                "| backend | median ms | p10 | p90 | images/s | speed-up vs best peer | x floor | first output s "
                "| compilations | agrees with torch |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            ]
            for r in [r for r in rows if r.get("batch") == batch]:
                if r.get("status") != "ok":
                    why = r.get("notes") or r.get("error") or ""
                    lines.append(f"| {r.get('label')} | {r.get('status')}: {why[:120]} |||||||||")
                    continue
                lines.append(
                    f"| {r.get('label')} | {r.get('median_ms'):.3f} | {r.get('p10_ms'):.3f} | {r.get('p90_ms'):.3f} | "
                    f"{r.get('images_per_s'):.0f} | {_fmt(r.get('speedup_vs_best_peer'), '.2f')} | "
                    f"{_fmt(r.get('vs_floor'), '.1f')} | {_fmt(r.get('first_output_s'), '.2f')} | "
                    f"{_fmt(r.get('compiles'))} | {_fmt(r.get('agrees_with_torch'))} |"
                )
    if pipeline:
        lines += [
            "",
            "## Pipeline: image files on disk to top-k (benchmarks/pipeline.py's rows)",
            "",
            "| path | batch | images/s | seconds per pass | notes |",
            "|---|---:|---:|---:|---|",
        ]
        for r in pipeline:
            if r.get("status") != "ok":
                why = r.get("notes") or r.get("error") or ""
                lines.append(f"| {r.get('label')} | {r.get('batch')} | {r.get('status')}: {why[:160]} | | |")
                continue
            lines.append(
                f"| {r.get('label')[len(PIPELINE) :]} | {r.get('batch')} | {r.get('images_per_s'):.1f} | "
                f"{r.get('median_ms') / 1e3:.2f} | {r.get('notes') or ''} |"
            )
    if data.get("launches"):
        lines += [
            "",
            "## Launches per forward (triton)",
            "",
            "| batch | launch hook | our record | profiler kernels | device us | torch eager kernels |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for batch, e in data["launches"].items():
            prof, eager = e.get("profiler") or {}, e.get("torch_profiler") or {}
            lines.append(
                f"| {batch} | {e.get('hook')} | {e.get('recorded')} | {_fmt(prof.get('kernels'))} | "
                f"{_fmt(prof.get('device_us'))} | {_fmt(eager.get('kernels'))} |"
            )
        for batch, e in data["launches"].items():
            if (e.get("profiler") or {}).get("top"):
                lines += [
                    "",
                    f"Where the time goes, batch {batch} (triton, one forward):",
                    "",
                    "| kernel | launches | us |",
                    "|---|---:|---:|",
                ]
                lines += [f"| {t.get('kernel')} | {t.get('count')} | {t.get('us')} |" for t in e.get("profiler")["top"]]
    kernels = data["kernels"]
    if kernels:
        lines += [
            "",
            "## Kernels against float64",
            "",
            "| kernel | dtype | checks | passed | worst err/bound | max spills B | max shared KB |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        groups: dict[tuple, list] = {}
        for r in kernels:
            groups.setdefault((r.get("kernel"), r.get("dtype")), []).append(r)
        for (kernel, dtype), rs in groups.items():
            ratios = [r["max_abs_err"] / r["bound"] for r in rs if r.get("bound") and r.get("max_abs_err") is not None]
            spills = [r.get("spills") for r in rs if r.get("spills") is not None]
            shared = [r.get("shared_bytes") for r in rs if r.get("shared_bytes") is not None]
            lines.append(
                f"| {kernel} | {dtype} | {len(rs)} | {sum(r.get('status') == 'ok' for r in rs)} | "
                f"{_fmt(max(ratios) if ratios else None, '.2f')} | {_fmt(max(spills) if spills else None)} | "
                f"{_fmt(max(shared) / 1024 if shared else None, '.0f')} |"
            )
        failed = [r for r in kernels if r.get("status") != "ok"]
        if failed:
            lines += ["", "Failed:", ""] + [
                f"- {r.get('name')} b={r.get('batch')}: {r.get('summary')}" for r in failed[:40]
            ]
    if data["model"]:
        lines += [
            "",
            "## Whole model, triton against float64",
            "",
            "| model | dtype | status | batches | summary |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.get('model')} | {r.get('dtype')} | {r.get('status')} | {_fmt(r.get('batches'))} | "
            f"{r.get('summary') or r.get('error', '')} |"
            for r in data["model"]
        ]
    if data["tma"]:
        lines += [
            "",
            "## 16-bit GEMMs, TMA on and off",
            "",
            "| GEMM | dtype | batch | TMA asked | TMA ran | status | median ms | TFLOP/s |",
            "|---|---|---:|---|---|---|---:|---:|",
        ]
        for r in data["tma"]:
            ran = (r.get("config") or {}).get("TMA")
            lines.append(
                f"| {r.get('role')} | {r.get('dtype')} | {r.get('batch')} | {r.get('tma')} | {_fmt(ran)} | "
                f"{r.get('status')} | {_fmt(r.get('median_ms'), '.4f')} | {_fmt(r.get('tflops'), '.0f')} |"
            )
    if data.get("tuning"):
        lines += ["", "## Tuning: every candidate timed", "", "| kernel | shape | candidates | best ms | best config | "
                  "slowest / best |", "|---|---|---:|---:|---|---:|"]  # fmt: skip
        groups: dict[str, list] = {}
        for t in data["tuning"]:
            groups.setdefault(f"{t.get('kernel')} {json.dumps(t.get('shape'), sort_keys=True)}", []).append(t)
        for key, ts in groups.items():
            timed = [t for t in ts if t.get("ms")]
            if not timed:
                continue
            best, worst = min(timed, key=lambda t: t.get("ms")), max(t.get("ms") for t in timed)
            kernel, shape = key.split(" ", 1)
            config = (
                ", ".join(f"{k}={v}" for k, v in best["config"].items())
                + f", w{best['num_warps']}s{best['num_stages']}"
            )
            lines.append(
                f"| {kernel} | {shape} | {len(timed)} | {best['ms']:.4f} | {config} | {worst / best['ms']:.2f} |"
            )
    net = first_use_net(data) if data.get("first_use") else None
    if net:
        lines += [
            "",
            "## First-use safety net",
            "",
            f"{len(net.get('checked', []))} first uses checked, "
            f"{len(net.get('failed', []))} failed: {', '.join(f['op'] for f in net.get('failed', [])) or 'none'}",
        ]
    if env.get("checks"):
        lines += ["", "## Environment", ""] + [f"- {c['name']}: {c['status']}: {c['summary']}" for c in env["checks"]]
    if env.get("sdpa"):
        lines.append(f"- SDPA: {env['sdpa']}")
    lines += ["", "max-autotune is left out of the compile phase: it tunes 16 GEMM shapes of ViT-B/16, minutes each."]
    return seal_markdown("\n".join(lines) + "\n\n", data.get("vit_fast_version") or "?")


# --------------------------------------------------------------------------------------------- running
def run_phase(ev: Evidence, phases: Phases, name: str, continuing: bool = False) -> None:
    """Every step of phase ``name`` that fits the time left, the files rewritten after each. ``continuing``: a
    restart of the phase (after a CUDA error, a hang or a crash in its earlier child): its record is kept and the
    steps it already logged are not run again. Raises CudaBroken after a step whose CUDA error leaves the context
    unusable (the step's record saved first)."""
    from vit_fast.backend import first_use

    first_use.reset()  # a first-use fallback of an earlier phase never turns this phase's rows into "fallback"
    earlier = next((p for p in ev.data["phases"] if p["name"] == name), None)
    if continuing and earlier is not None:
        info = earlier
    else:
        info = {
            "name": name, "status": "planning", "steps": 0, "done": 0, "seconds": 0.0, "estimate_s": 0.0,
            "compiles": 0, "log": [],
        }  # fmt: skip
        # a phase run again (a follow-up) replaces its earlier record
        ev.data["phases"] = [p for p in ev.data["phases"] if p["name"] != name] + [info]
        for table in TABLES:
            ev.data[table] = [r for r in ev.data[table] if r.get("phase") != name]
    start = time.monotonic() - info["seconds"]
    try:
        steps = phases.steps(name)
    except Exception as err:
        info.update(status=f"error: {failure(err)['error']}", seconds=time.monotonic() - start)
        ev.log(f"{name}: could not plan its steps: {failure(err)['error']}")
        ev.save()
        return
    logged = {entry["step"] for entry in info["log"]}
    todo = [s for s in steps if s.name not in logged]
    estimate = sum(s.estimate(ev.compile_s()) for s in steps)
    info.update(status="running", steps=len(steps), estimate_s=round(estimate, 1))
    ev.log(
        f"== {name}{' (continued)' if continuing else ''}: {len(todo)} of {len(steps)} steps to run, about "
        f"{sum(s.estimate(ev.compile_s()) for s in todo):.0f} s with compilations; {ev.left():.0f} s left"
    )
    ev.save()
    skipped = [e["step"] for e in info["log"] if str(e.get("status", "")).startswith("skipped")]
    from vit_fast.util.interrupts import INTERRUPTS

    try:
        _run_steps(ev, name, todo, info, skipped, start)
    except INTERRUPTS as err:
        from vit_fast.util.interrupts import signal_name

        info["status"] = f"cut by {signal_name(err)} after {info['done']} of {len(steps)} steps"
        info["seconds"] = round(time.monotonic() - start, 1)
        raise
    except CudaBroken:
        info["status"] = f"restarting after a CUDA error: {info['done']} of {len(steps)} steps done"
        ev.save()
        raise
    info["status"] = f"cut: {len(skipped)} of {len(steps)} steps skipped for time" if skipped else "done"
    info["seconds"] = round(time.monotonic() - start, 1)
    ev.save()


class CudaBroken(Exception):
    """A step's CUDA error left this process's context unusable: the phase goes on in a new child process."""


def cuda_broken(err: BaseException, device) -> bool:
    """Whether ``err`` (a step's failure) leaves the CUDA context unusable: an illegal address, a launch failure or
    any CUDA error after which a synchronize fails too."""
    text = f"{type(err).__name__}: {err}".lower()
    if any(k in text for k in ("illegal memory access", "illegal address", "unspecified launch failure",
                                "cuda error", "acceleratorerror", "misaligned address")):  # fmt: skip
        return True
    if getattr(device, "type", None) != "cuda":
        return False
    import torch

    try:
        torch.cuda.synchronize(device)
    except Exception:
        return True
    return False


def inject_fault(ev: Evidence, step: Step) -> None:
    """--inject-fault KIND:TEXT (a stubbed rehearsal only): the first step whose name holds TEXT fails as a GPU
    would fail it: ``cuda`` raises an illegal-address CUDA error, ``hang`` blocks SIGTERM and SIGINT and sleeps,
    as a process blocked in a CUDA synchronize does."""
    fault = getattr(ev.args, "inject_fault", None)
    if not fault or fault[1] not in step.name:
        return
    if fault[0] == "cuda":
        raise RuntimeError("CUDA error: an illegal memory access was encountered (injected by --inject-fault)")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    time.sleep(3600)


def _expected_compiles(info: dict, step: Step) -> float:
    """The compilations a step is expected to make: once three steps of the phase have run, the phase's own
    mean so far (a kernel check compiles when its shape class is new), else the step's own guess."""
    ran = [e for e in info["log"] if "compiles" in e]
    if len(ran) >= 3 and step.compiles:
        return sum(e["compiles"] for e in ran) / len(ran)
    return step.compiles


def _run_steps(ev: Evidence, name: str, steps: list[Step], info: dict, skipped: list[str], start: float) -> None:
    for step in steps:
        need = step.estimate(ev.compile_s(), _expected_compiles(info, step))
        if ev.left() < need:  # skipped, not stopped: a later, shorter step may still fit
            skipped.append(step.name)
            with held():
                info["log"].append(
                    {"step": step.name, "status": f"skipped: {ev.left():.0f} s left, needs about {need:.0f} s"}
                )
                ev.log(f"{name}: {step.name}: skipped, {ev.left():.0f} s left and it needs about {need:.0f} s")
            continue
        # logged (and the files saved) before it starts: a hang names the step it hangs in
        ev.data["running"] = {"phase": name, "step": step.name, "since_utc": _utc_now(), "estimate_s": round(need, 1)}
        ev.log(f"{name}: {step.name}: starting, about {need:.1f} s")
        ev.save()
        before, t0 = ev.compiles, time.monotonic()
        broken = False
        try:
            inject_fault(ev, step)
            records = step.run()
        except Exception as err:  # the step's failure is its record; the run goes on
            records = [{"name": step.name, **failure(err)}]
            broken = cuda_broken(err, getattr(ev, "device", None))
        seconds, compiles = time.monotonic() - t0, ev.compiles - before
        with held():  # the step's records, its count and the files change together, or not at all
            if ev.simulated:
                ev.data["simulated_s"] += step.estimate(ev.compile_s(), compiles)
            elif compiles:
                own = step.estimate(compiles=0)
                measured = max(0.05, (seconds - own) / compiles)
                ev.data["compile_s"] = round(0.5 * ev.compile_s() + 0.5 * measured, 3)
            ev.data.pop("running", None)
            _record(ev, name, step, records, info, seconds, compiles, start)
        if broken:
            ev.log(f"{name}: {step.name}: a CUDA error left this process's context unusable: the phase goes on "
                   "in a new process")  # fmt: skip
            raise CudaBroken(step.name)


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _record(
    ev: Evidence, name: str, step: Step, records: list[dict], info: dict, seconds: float, compiles: int, start: float
) -> None:
    table = "perf" if name == "tuned" else name
    for r in records:
        r.setdefault("name", step.name)
        r.setdefault("phase", name)
        r.setdefault("seconds", seconds)
        if step.rows and table in TABLES:
            ev.data[table].append(r)
    status = ", ".join(sorted({str(r.get("status")) for r in records}))
    text = "; ".join(str(r.get("summary") or r.get("error") or r.get("notes") or "") for r in records)[:300]
    info["log"].append({"step": step.name, "status": status, "seconds": round(seconds, 2), "compiles": compiles})
    info.update(done=info["done"] + 1, seconds=round(time.monotonic() - start, 1), compiles=info["compiles"] + compiles)
    ev.log(f"{name}: {step.name}: {status} ({seconds:.1f} s, {compiles} compilations) {text}")
    from vit_fast.backend import first_use

    net = first_use.report()
    if net["checked"] or net["failed"]:
        ev.data["first_use"][name] = net  # per phase: each phase starts with the net reset
    ev.save()


def plan(ev: Evidence, phases: Phases, names: tuple[str, ...]) -> int:
    """The dry run: every phase's steps, with the compilations each makes counted under the stubbed driver, and the
    estimated seconds on an H100 (the steps' own estimates plus COMPILE_SECONDS per compilation)."""
    import triton

    # the stub's benchmarker runs each config once, so tuning compiles every candidate as a GPU's would
    def run_once(fn, quantiles=None, **kwargs):
        fn()
        return [1.0, 1.0, 1.0] if quantiles else 1.0

    triton.runtime.driver.active.get_benchmarker = lambda: run_once
    import host_overhead

    def forget() -> None:
        host_overhead.forget_arguments()
        gc.collect()

    rows = []
    for name in PHASES:
        steps = phases.steps(name)
        compiles = 0
        seconds = 0.0
        for step in steps:
            before = ev.compiles
            if step.launch is not None:
                with contextlib.redirect_stderr(io.StringIO()):
                    step.launch()
                forget()  # each launch's inputs go before the next: the plan stays small
            compiles += ev.compiles - before
            seconds += step.plan(ev.compiles - before)
        rows.append((name, len(steps), compiles, seconds, name in names))
        phases.forget()
        release(phases.device)
    print(f"{'phase':<9} {'steps':>6} {'compilations':>13} {'est. s (H100)':>14}  runs")
    for name, n, compiles, seconds, chosen in rows:
        print(f"{name:<9} {n:>6} {compiles:>13} {seconds:>14.0f}  {'yes' if chosen else 'no'}")
    chosen = sum(r[3] for r in rows if r[4])
    print(
        f"chosen phases ({','.join(names)}): about {chosen:.0f} s of a {ev.budget:.0f} s budget"
        f" ({'fits' if chosen <= ev.budget else 'does NOT fit: later steps will be cut'})"
    )
    print(
        f"estimates: {COMPILE_SECONDS:g} s per compilation (counted with Triton's driver stubbed) plus each step's "
        "own seconds on an H100; the run checks each step against the time left with its expected compilations, "
        "at the seconds per compilation it has measured"
    )
    return 0


def dry_run(args: argparse.Namespace) -> int:
    """The plan (:func:`plan`) under the stubbed driver, on the CPU: nothing is written."""
    sys.path.insert(0, str(HERE))
    import host_overhead

    host_overhead.install_stub_driver()
    import torch

    ev = Evidence(Path("."), args.budget, args, "stub")
    count_compiles(ev)
    return plan(ev, Phases(ev, args, torch.device("cpu")), args.phases)


def first_output_child(spec: str, dtype_name: str) -> int:
    """The fresh process of the perf phase's first-output step: prints one JSON line."""
    import torch

    from vit_fast.interop.loading import load_model

    counter = Evidence(Path("."), 0.0, argparse.Namespace(), "cuda")
    count_compiles(counter)
    imported = time.monotonic() - START
    from vit_fast.util.dtypes import DTYPES

    model = load_model(spec, backend="triton").to(device="cuda", dtype=DTYPES[dtype_name]).eval()
    h, w = model.cfg.img_hw
    x = torch.randn(1, model.cfg.in_chans, h, w, device="cuda", dtype=model.dtype)
    built = time.monotonic() - START
    with torch.no_grad():
        model(x)
    torch.cuda.synchronize()
    result = {
        "import_s": imported,
        "model_s": built,
        "first_output_s": time.monotonic() - START,
        "compiles": counter.compiles,
    }
    print(json.dumps(result))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, every value checked and bounded before any work (benchmarks/script_args.py)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from script_args import ScriptParser, bounded

    from vit_fast.util.batches import parse_batch_list

    def batches(text: str) -> list[int]:
        try:
            chosen = parse_batch_list(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        if max(chosen) > 4096:
            raise argparse.ArgumentTypeError(f"batch sizes go up to 4096, got {max(chosen)}")
        return chosen

    def names(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
        def parse(text: str) -> tuple[str, ...]:
            chosen = tuple(t.strip() for t in text.split(",") if t.strip())
            bad = [t for t in chosen if t not in allowed]
            if bad or not chosen:
                raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)}, comma-separated")
            return chosen

        return parse

    def fault(text: str) -> tuple[str, str]:
        kind, _, where = text.partition(":")
        if kind not in ("cuda", "hang") or not where:
            raise argparse.ArgumentTypeError(f"{text!r}: cuda:TEXT or hang:TEXT (TEXT: part of a step's name)")
        return kind, where

    doc = __doc__.split("\n\n")
    parser = ScriptParser(
        description=doc[0], epilog="\n\n".join(doc[1:]), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="folder for the five files (the wrapper adds preflight.txt)")
    parser.add_argument(
        "--budget",
        type=bounded(float, 10, 86400),
        default=PLANNED_BUDGET,
        help=f"seconds from start to the last step ({PLANNED_BUDGET:g})",
    )
    parser.add_argument(
        "--phases",
        type=names(PHASES),
        default=DEFAULT_PHASES,
        help="phases, in order (default: all: " + ",".join(DEFAULT_PHASES) + ")",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan with estimated seconds; run nothing")
    parser.add_argument(
        "--stub-driver",
        action="store_true",
        help="Triton's driver stubbed (benchmarks/host_overhead.py): a CPU rehearsal, nothing computed",
    )
    parser.add_argument("--resume", type=Path, help="an earlier run's results.json: its records are carried on")
    parser.add_argument("--overwrite", action="store_true", help="replace files in --out that are not an earlier run's")
    parser.add_argument(
        "--models",
        type=lambda t: [m.strip() for m in t.split(",") if m.strip()],
        default=["vit_base_patch16_224"],
        help="kernels and model phases (vit_base_patch16_224; add vit_small_patch16_224 where time allows)",
    )
    parser.add_argument("--perf-model", default="vit_base_patch16_224", help="perf, tma, compile and tuned phases")
    parser.add_argument("--perf-dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--dtypes", type=names(("bf16", "fp16", "fp32")), default=("bf16", "fp16", "fp32"))
    parser.add_argument("--kernel-batches", type=batches, default=[1, 64], help="bf16 kernel checks (1,64)")
    parser.add_argument("--fp16-batches", type=batches, default=[1], help="fp16 kernel checks (1)")
    parser.add_argument("--fp32-batches", type=batches, default=[1], help="fp32 kernel checks (1)")
    parser.add_argument("--tma-batches", type=batches, default=[256])
    parser.add_argument("--perf-batches", type=batches, default=[1, 8, 64, 256])
    parser.add_argument(
        "--pipeline-images",
        type=bounded(int, 0, 1000),
        default=32,
        help="image files the perf phase's pipeline rows run from disk to top-k (32; 0: no pipeline rows)",
    )
    parser.add_argument("--pipeline-batch", type=bounded(int, 1, 1024), default=32, help="the predict row's batch")
    parser.add_argument("--compile-batches", type=batches, default=[1])
    parser.add_argument(
        "--compile-sources", type=names(("torch", "timm")), default=("torch",), help="torch.compile of these (torch)"
    )
    parser.add_argument("--tuned-batches", type=batches, default=[1])
    parser.add_argument(
        "--min-time", type=bounded(float, 0.001, 60), default=0.3, help="seconds timed per perf case (0.3)"
    )
    parser.add_argument("--seed", type=bounded(int, 0), default=0)
    parser.add_argument(
        "--step-timeout",
        type=bounded(float, 1, 3600),
        default=120.0,
        help="the watchdog: seconds a step may run beyond 3x its estimate before its phase process is killed (120)",
    )
    parser.add_argument("--first-output-child", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--phase-child", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--continue-phase", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--inject-fault", type=fault, help=argparse.SUPPRESS)  # a stubbed rehearsal's GPU failure
    parser.add_argument("--simulated-clock", action="store_true", help=argparse.SUPPRESS)  # a test's clock
    args = parser.parse_args(argv)
    if args.out is None and not (args.dry_run or args.first_output_child):
        parser.error("--out DIR is required (the folder the files are written to)")
    if (args.inject_fault or args.simulated_clock) and not args.stub_driver:
        parser.error("--inject-fault and --simulated-clock are for a stubbed rehearsal (--stub-driver) only")
    return args


def step_limit(args: argparse.Namespace, estimate: float) -> float:
    """The watchdog's limit for a step: ``--step-timeout`` beyond three times its estimate."""
    return 3 * estimate + args.step_timeout


def child_command(argv: list[str], name: str, deadline: float, started: float, continuing: bool) -> list[str]:
    """The phase child's command: this script with the run's own arguments (less --resume, --overwrite: the child
    carries on the record in --out)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--resume",):
            skip = True
            continue
        if arg.startswith("--resume=") or arg == "--overwrite":
            continue
        kept.append(arg)
    extra = ["--phase-child", name, "--deadline", repr(deadline), "--started", repr(started)]
    extra += ["--continue-phase"] if continuing else []
    return [sys.executable, str(Path(__file__).resolve()), *kept, *extra]


def watch_child(ev: Evidence, cmd: list[str]) -> tuple[int, str | None]:
    """Run one phase child, its output passed through; the watchdog kills it (SIGTERM, then SIGKILL after 10 s: a
    process blocked in a CUDA synchronize acts on neither until it returns) when the step it logged as started
    runs past its limit, or the budget is spent. Returns its exit status and, when killed, why."""
    import re
    import threading

    started = re.compile(r"\] (\w+): (.+): starting, about ([0-9.]+) s$")
    current: dict[str, Any] = {}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def pump() -> None:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            match = started.search(line.rstrip("\n"))
            if match:
                current.update(step=match.group(2), since=time.monotonic(), estimate=float(match.group(3)))
            elif current.get("step") and f": {current['step']}: " in line:
                current.clear()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    why = None
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            step = current.get("step")
            if step and time.monotonic() - current["since"] > step_limit(ev.args, current["estimate"]):
                why = f"hung in {step!r}: killed by the watchdog after {time.monotonic() - current['since']:.0f} s"
            elif not ev.simulated and ev.left() < -10:
                why = f"past the budget in {step!r}: killed by the watchdog" if step else "past the budget"
            if why:
                stop_child(proc)
                break
    except BaseException:
        stop_child(proc)
        raise
    finally:
        proc.wait()
        reader.join(timeout=5)
    if why:
        why_step = current.get("step")
        return proc.returncode, f"{why_step}\n{why}" if why_step else f"\n{why}"
    return proc.returncode, None


def stop_child(proc: subprocess.Popen) -> None:
    """SIGTERM (the child saves and ends), then SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def note_failure(ev: Evidence, name: str, step: str | None, status: str) -> None:
    """The phase child died or was killed in ``step``: its record says so, as a row of the phase's table, so a
    restart of the phase goes on after it."""
    info = next((p for p in ev.data["phases"] if p["name"] == name), None)
    if info is None:
        info = {"name": name, "status": status, "steps": 0, "done": 0, "seconds": 0.0, "estimate_s": 0.0,
                "compiles": 0, "log": []}  # fmt: skip
        ev.data["phases"].append(info)
    info["status"] = status
    if step:
        info["log"].append({"step": step, "status": status})
        info["done"] += 1
        table = "perf" if name == "tuned" else name
        if table in TABLES:
            ev.data[table].append({"phase": name, "name": step, "label": step, "status": "error", "error": status})
    ev.data.pop("running", None)
    ev.log(f"{name}: {step or '(between steps)'}: {status}")
    ev.save()


def run_phases(ev: Evidence, argv: list[str]) -> None:
    """Each phase in a child process of its own (a CUDA error, a hang or a crash there ends that process only),
    restarted after the step that ended it while time and MAX_RESTARTS allow; each phase's deadline keeps
    RESERVE_S for every later one."""
    names = list(ev.args.phases)
    for i, name in enumerate(names):
        # kept for the phases after this one (RESERVE_S is for the planned budget; a smaller one keeps its share)
        reserve = sum(RESERVE_S[later] for later in names[i + 1 :]) * min(1.0, ev.budget / PLANNED_BUDGET)
        continuing = False
        for _ in range(MAX_RESTARTS + 1):
            deadline = ev.deadline - reserve
            if ev.left() - reserve <= 1:
                note_failure(ev, name, None, f"not started: {ev.left():.0f} s left, {reserve:.0f} s kept for later")
                break
            code, killed = watch_child(ev, child_command(argv, name, deadline, ev.started, continuing))
            ev.reload()
            if code == 0 and not killed:
                break
            if code in (130, 143) and not killed:  # the child was interrupted with us
                from vit_fast.util.interrupts import Terminated

                raise KeyboardInterrupt if code == 130 else Terminated("SIGTERM")
            if killed:
                step, why = killed.split("\n", 1)
                note_failure(ev, name, step or None, why)
            elif code != EXIT_BROKEN:
                running = (ev.data.get("running") or {}).get("step")
                note_failure(ev, name, running, f"the phase process died (exit {code})")
                if running is None:  # it died before any step: a restart would die the same way
                    break
            continuing = True
        else:
            note_failure(ev, name, None, f"given up after {MAX_RESTARTS} restarts")


def child_main(args: argparse.Namespace) -> int:
    """One phase in this process (started by run_phases): the record in --out carried on."""
    from vit_fast.util.interrupts import INTERRUPTS, exit_status, handled

    stub = args.stub_driver
    if stub:
        sys.path.insert(0, str(HERE))
        import host_overhead

        host_overhead.install_stub_driver()
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not stub else "cpu")
    mode = "stub" if stub else "cuda"
    ev = Evidence(args.out, args.budget, args, mode, deadline=args.deadline, started=args.started)
    ev.device = device
    with handled():
        try:
            ev.reload()  # the run's own files, claimed for this process's writes
            count_compiles(ev)
            phases = Phases(ev, args, device)
            if "perf_model" not in ev.data:
                ev.data["perf_model"] = phases.perf_model_info()
            try:
                run_phase(ev, phases, args.phase_child, continuing=args.continue_phase)
            finally:
                phases.close()
        except INTERRUPTS as err:
            ev.data.pop("running", None)
            ev.save()
            return exit_status(err)
        except CudaBroken:
            return EXIT_BROKEN
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from vit_fast.base.interpret import interpreter_enabled
    from vit_fast.util.interrupts import INTERRUPTS, exit_status, handled, signal_name

    if interpreter_enabled():
        print(
            "gpu_evidence: unset TRITON_INTERPRET: the interpreter would take hours here (--stub-driver rehearses "
            "the run on a CPU)",
            file=sys.stderr,
        )
        return 2
    if args.first_output_child:
        return first_output_child(args.first_output_child, args.perf_dtype)
    if args.phase_child:
        return child_main(args)
    # a fresh Triton cache (unless one is given) shared by the phase children: compilations and first outputs
    # are counted from nothing; removed when the run ends
    fresh_cache = tempfile.TemporaryDirectory(prefix="vit-fast-triton-cache-")
    os.environ.setdefault("TRITON_CACHE_DIR", fresh_cache.name)
    if args.dry_run:
        with handled():
            try:
                print(f"planning every phase with Triton's driver stubbed (budget {args.budget:g} s) ...", flush=True)
                return dry_run(args)
            except INTERRUPTS as err:
                print(f"gpu_evidence: interrupted by {signal_name(err)}", file=sys.stderr)
                return exit_status(err)
    lock = None
    try:
        if not args.stub_driver:
            import torch

            if not torch.cuda.is_available():
                raise UsageError("no CUDA GPU here; --stub-driver rehearses the run on a CPU (nothing is computed)")
        check_out(args.out, args.overwrite)
        if args.resume is not None:
            read_record(args.resume, "--resume")  # refused before anything is made
        from vit_fast.util.files import hold_lock, make_folders

        make_folders(args.out, "--out folder")
        lock = hold_lock(args.out / LOCK_NAME, f"gpu_evidence.py, process {os.getpid()}\n")
        if lock is None:
            raise UsageError(f"another gpu_evidence.py run is writing to {str(args.out)!r}: wait for it, or give "
                             "another --out")  # fmt: skip
        mode = "stub" if args.stub_driver else "cuda"
        ev = Evidence(args.out, args.budget, args, mode)
        if args.resume is not None:
            ev.resume(args.resume)
            ev.data.pop("running", None)  # the earlier run's last step, ended one way or another
    except (UsageError, ValueError, OSError) as err:
        print(f"gpu_evidence: {err}", file=sys.stderr)
        return 2
    ev.data["runs"].append({"argv": argv, "phases": list(args.phases), "mode": mode, "budget_s": args.budget})
    code = 0
    with handled():
        try:
            ev.save()
            run_phases(ev, argv)
        except INTERRUPTS as err:
            ev.reload() if (args.out / "results.json").is_file() else None
            ev.log(f"stopped by {signal_name(err)}: the files hold every step that ended")
            code = exit_status(err)
        finally:
            ev.data.pop("running", None)
            ev.save()
    ev.log(f"done in {time.monotonic() - START:.0f} s: {args.out}")
    ev.save()
    return code


if __name__ == "__main__":
    sys.exit(main())
