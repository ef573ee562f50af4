"""The benchmark harness behind ``vit-fast bench``: timing, statistics, ceilings, backends, reports.

Every backend runs in this one process on the same input tensors, and every output is compared
with the eager ``"torch"`` backend's on that input, so a fast wrong answer shows.

Timing. On CUDA: warm-up calls, then one pair of CUDA events around each of many calls with the
input already resident on the GPU; optionally an L2 flush (a write of a buffer larger than L2)
before each call, outside the timed interval; the host-to-device copy of the input is timed on
its own (``h2d=True``). On CPU: ``time.perf_counter`` around each call. Statistics: median, p90,
p99 (linear interpolation between order statistics, as ``numpy.percentile``).

Ceilings. The harness measures the device's own copy bandwidth (a large device-to-device copy,
counting bytes read plus bytes written) and matrix rate (a large square matmul in each dtype),
and reports each result next to its physical floor:
``floor = max(weight bytes / bandwidth, FLOPs / matrix rate)``. On CPU the same is measured with
CPU tensors and labelled so.

Nothing here touches a GPU at import time.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import gc
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .env import git_commit, module_version
from .files import write_atomic

BACKENDS: tuple[str, ...] = (
    "torch",
    "triton",
    "triton-graph",
    "compile",
    "compile-max-autotune",
    "compile-reduce-overhead",
    "timm",
    "onnxruntime",
    "tensorrt",
)
#: backends that --graph also runs captured in a CUDA graph (triton's captured form is "triton-graph";
#: compile-max-autotune and compile-reduce-overhead are graphed by inductor already)
GRAPHABLE: tuple[str, ...] = ("torch", "triton", "compile", "timm")
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
SCHEMA_VERSION = 1


class BenchError(ValueError):
    """A bad request (argument, device, dtype): the message says what to change."""


class Unavailable(Exception):
    """A backend that cannot run here; the message is the reason."""


# =========================================================================== argument parsing
def parse_batches(text: str) -> list[int]:
    """``"1,8,64"`` -> ``[1, 8, 64]``: positive ints, no duplicates, order kept."""
    items = [t.strip() for t in str(text).split(",")]
    if not text or any(not t for t in items):
        raise BenchError(f"batch list {text!r} has an empty entry: give comma-separated positive ints, e.g. 1,8,64")
    out: list[int] = []
    for t in items:
        try:
            b = int(t)
        except ValueError:
            raise BenchError(
                f"batch size {t!r} in {text!r} is not an int: give comma-separated positive ints, e.g. 1,8,64"
            ) from None
        if b < 1:
            raise BenchError(f"batch size {b} in {text!r} must be >= 1")
        if b in out:
            raise BenchError(f"batch size {b} appears twice in {text!r}")
        out.append(b)
    return out


def parse_dtypes(text: str) -> list[str]:
    """``"bf16,fp16"`` -> ``["bf16", "fp16"]`` (aliases such as ``float16`` accepted)."""
    out: list[str] = []
    for t in str(text).split(","):
        name = DTYPE_ALIASES.get(t.strip().lower(), t.strip().lower())
        if name not in DTYPES:
            raise BenchError(f"unknown dtype {t.strip()!r} in {text!r}: choose from {', '.join(DTYPES)}")
        if name not in out:
            out.append(name)
    return out


def parse_backends(text: str) -> list[str]:
    """``"torch,triton"`` -> ``["torch", "triton"]``; ``"all"`` means every backend."""
    if str(text).strip() == "all":
        return list(BACKENDS)
    out: list[str] = []
    for t in str(text).split(","):
        name = t.strip()
        if name not in BACKENDS:
            import difflib

            close = difflib.get_close_matches(name, BACKENDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BenchError(f"unknown backend {name!r}{hint}: choose from {', '.join(BACKENDS)}, or 'all'")
        if name not in out:
            out.append(name)
    return out


def resolve_device(spec: str | None) -> torch.device:
    """``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""
    spec = (spec or "auto").strip()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise BenchError(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BenchError(
                f"device {spec!r} asked for, but no CUDA GPU is visible to torch {torch.__version__}: use --device cpu"
            )
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise BenchError(f"device {spec!r} does not exist: {torch.cuda.device_count()} GPU(s) visible")
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise BenchError(f"device type {dev.type!r} is not supported: use cpu or cuda")
    return dev


def check_dtype_supported(device: torch.device, dtype_name: str) -> None:
    """Raise BenchError when ``dtype_name`` cannot run a ViT's ops (conv, matmul, layer norm) on ``device``."""
    dtype = DTYPES[dtype_name]
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise BenchError(f"bf16 is not supported on {torch.cuda.get_device_name(device)}: use --dtype fp16 or fp32")
    try:
        with torch.no_grad():
            x = torch.randn(1, 3, 8, 8, device=device).to(dtype)
            w = torch.randn(4, 3, 4, 4, device=device).to(dtype)
            y = torch.nn.functional.conv2d(x, w, stride=4).flatten(1)
            y = torch.nn.functional.layer_norm(y @ y.t(), (1,))
            y.softmax(-1)
    except Exception as err:  # e.g. "not implemented for 'BFloat16'"
        raise BenchError(
            f"{dtype_name} is not supported on {device.type} here ({type(err).__name__}: {err}); "
            "choose another --dtype, e.g. fp32"
        ) from err


# =========================================================================== statistics
def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between order statistics (numpy's default)."""
    if not len(values):
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    data = sorted(float(v) for v in values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(times_ms: Sequence[float]) -> dict[str, float]:
    """Median, p90, p99, mean, min, max, standard deviation (all ms) and the count."""
    if not len(times_ms):
        raise ValueError("no timings to summarize")
    n = len(times_ms)
    mean = sum(times_ms) / n
    var = sum((t - mean) ** 2 for t in times_ms) / (n - 1) if n > 1 else 0.0
    return {
        "n": n,
        "median_ms": percentile(times_ms, 50),
        "p90_ms": percentile(times_ms, 90),
        "p99_ms": percentile(times_ms, 99),
        "mean_ms": mean,
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
        "std_ms": math.sqrt(var),
    }


# =========================================================================== timing
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def l2_cache_bytes(device: torch.device) -> int | None:
    """The GPU's L2 size, or the CPU's last-level cache (Linux sysfs), or None when unknown."""
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or None
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        with contextlib.suppress(OSError, ValueError):
            text = (idx / "size").read_text().strip().upper()
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
    return best or None


class L2Flusher:
    """Write a buffer larger than the last-level cache, so the next call starts with a cold cache."""

    def __init__(self, device: torch.device) -> None:
        cache = l2_cache_bytes(device)
        self.nbytes = max(2 * (cache or 0), (256 if device.type == "cuda" else 64) * 2**20)
        self.cache_bytes = cache
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()

    def describe(self) -> str:
        cache = f"{self.cache_bytes / 2**20:.0f} MiB" if self.cache_bytes else "unknown"
        return f"write {self.nbytes / 2**20:.0f} MiB before each call (cache {cache})"


def time_callable(
    fn: Callable[[], Any],
    device: torch.device,
    *,
    warmup: int,
    iters: int,
    flush: Callable[[], None] | None = None,
    max_seconds: float | None = None,
    min_iters: int = 5,
) -> list[float]:
    """Milliseconds of each of up to ``iters`` calls of ``fn`` after ``warmup`` calls.

    CUDA: one pair of events per call on the current stream (GPU time from the start of the call's
    first kernel slot to its last, launch gaps included). CPU: ``time.perf_counter``. With
    ``max_seconds``, the count is cut so the timed loop takes about that long, but never below
    ``min_iters`` (and never above ``iters``).
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    for _ in range(max(0, warmup)):
        fn()
    synchronize(device)
    if max_seconds is not None:
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        one = max(time.perf_counter() - t0, 1e-7)
        iters = max(min(iters, min_iters), min(iters, int(max_seconds / one)))
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            if flush is not None:
                flush()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    times = []
    for _ in range(iters):
        if flush is not None:
            flush()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


# =========================================================================== environment
def _version(module: str) -> str:
    return module_version(module) or "not installed"


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {cpu_name()} ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)"


def driver_version(device: torch.device) -> str:
    """The NVIDIA driver version from nvidia-smi, else the CUDA driver API version torch sees; 'n/a' on CPU."""
    if device.type != "cuda":
        return "n/a"
    smi = shutil.which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            query = [smi, "--query-gpu=driver_version", "--format=csv,noheader", "-i", str(device.index or 0)]
            out = subprocess.run(query, capture_output=True, text=True, timeout=15)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
    with contextlib.suppress(Exception):
        v = int(torch._C._cuda_getDriverVersion())
        return f"unknown (nvidia-smi unavailable; CUDA driver API {v // 1000}.{(v % 1000) // 10})"
    return "unknown (nvidia-smi unavailable)"


def collect_environment(device: torch.device) -> dict[str, Any]:
    from . import __version__

    env: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "driver_version": driver_version(device),
        "cuda_runtime": torch.version.cuda or "n/a",
        "vit_fast": __version__,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "tensorrt": _version("tensorrt"),
        "timm": _version("timm"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "torch_threads": torch.get_num_threads(),
        "hostname": platform.node(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return env


# =========================================================================== ceilings
def measure_bandwidth(device: torch.device, nbytes: int | None = None, iters: int | None = None) -> dict[str, Any]:
    """Copy bandwidth in GB/s: a large same-device copy, counting the bytes read plus the bytes written."""
    if nbytes is None:
        nbytes = 2 * 2**30 if device.type == "cuda" else 128 * 2**20
    iters = iters or (20 if device.type == "cuda" else 5)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    times = time_callable(lambda: dst.copy_(src), device, warmup=2, iters=iters)
    ms = percentile(times, 50)
    kind = "device-to-device copy" if device.type == "cuda" else "CPU memory copy (host RAM, CPU tensors)"
    return {
        "GBps": 2 * nbytes / (ms * 1e-3) / 1e9,
        "bytes": nbytes,
        "median_ms": ms,
        "method": f"{kind} of {nbytes / 2**20:.0f} MiB, (read + write bytes) / median time over {iters} runs",
    }


def measure_matrix_rate(
    device: torch.device, dtype_name: str, n: int | None = None, iters: int | None = None
) -> dict[str, Any]:
    """Matrix rate in TFLOP/s: an n x n x n matmul in the dtype, 2 n^3 FLOPs per product."""
    dtype = DTYPES[dtype_name]
    if n is None:
        n = 8192 if device.type == "cuda" else (1024 if dtype == torch.float32 else 512)
    iters = iters or (20 if device.type == "cuda" else 3)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times = time_callable(lambda: torch.mm(a, b), device, warmup=2 if device.type == "cuda" else 1, iters=iters)
    ms = percentile(times, 50)
    where = "GPU" if device.type == "cuda" else "CPU (CPU tensors)"
    note = ""
    if device.type == "cuda" and dtype == torch.float32:
        note = f", TF32 {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}"
    return {
        "TFLOPs": 2 * n**3 / (ms * 1e-3) / 1e12,
        "n": n,
        "median_ms": ms,
        "method": f"{where} torch.mm {n}x{n}x{n} {dtype_name}{note}, median over {iters} runs",
    }


def floor_ms(weight_bytes: int, flops: float, ceilings: dict[str, Any], dtype_name: str) -> tuple[float, str] | None:
    """The physical floor in ms and what bounds it ('memory' or 'compute'), or None without ceilings."""
    bw = (ceilings.get("bandwidth") or {}).get("GBps")
    rate = ((ceilings.get("matrix") or {}).get(dtype_name) or {}).get("TFLOPs")
    if not bw or not rate:
        return None
    mem = weight_bytes / (bw * 1e9) * 1e3
    comp = flops / (rate * 1e12) * 1e3
    return (mem, "memory") if mem >= comp else (comp, "compute")


# =========================================================================== backends
@dataclass
class Variant:
    """One thing to time: a backend, optionally captured in a CUDA graph by us."""

    backend: str
    graph: bool = False

    @property
    def label(self) -> str:
        return f"{self.backend}+graph" if self.graph and self.backend != "triton-graph" else self.backend


def plan_variants(backends: Iterable[str], graph: bool) -> list[Variant]:
    """The variants to time: each backend as it is, and with ``graph`` also its CUDA-graph form."""
    backends = list(backends)
    out = [Variant(b, graph=(b == "triton-graph")) for b in backends]
    if graph:
        for b in backends:
            if b == "triton":
                if "triton-graph" not in backends:
                    out.append(Variant("triton-graph", graph=True))
            elif b in GRAPHABLE:
                out.append(Variant(b, graph=True))
    return out


def graph_mode(variant: Variant, device: torch.device) -> str:
    if variant.graph:
        return "cuda-graph (CUDAGraphRunner)"
    if device.type == "cuda" and variant.backend in ("compile-reduce-overhead", "compile-max-autotune"):
        return "cuda-graph (inductor cudagraph trees)"
    return "none"


def static_unavailable(variant: Variant, device: torch.device, dtype_name: str) -> str | None:
    """Why ``variant`` cannot run on ``device`` in ``dtype_name``, known without building it; None if it may run."""
    b = variant.backend
    cuda = device.type == "cuda"
    if variant.graph and not cuda:
        return "CUDA graphs need a CUDA GPU; none here"
    if b in ("triton", "triton-graph"):
        from . import runtime

        if not runtime.triton_importable():
            return "the triton package is not installed"
        if not cuda:
            return (
                "needs a CUDA GPU: on CPU the kernels only run in Triton's interpreter (TRITON_INTERPRET=1), "
                "which is far too slow to time"
            )
    if b == "compile-reduce-overhead" and not cuda:
        return "mode='reduce-overhead' is CUDA graphs; needs a CUDA GPU"
    if b == "timm" and importlib.util.find_spec("timm") is None:
        return "timm is not installed (it needs torchvision, which has no CPU build on these machines)"
    if b == "onnxruntime":
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed: pip install 'vit-fast[onnx]'"
        import onnxruntime as ort

        providers = ort.get_available_providers()
        if cuda and "CUDAExecutionProvider" not in providers:
            return (
                f"onnxruntime has no CUDAExecutionProvider here (providers: {', '.join(providers)}): install "
                "onnxruntime-gpu; CPU-EP timings would not compare with GPU backends"
            )
        if dtype_name == "bf16" and not cuda:
            return "bf16 cannot be fed to the CPU execution provider (it takes numpy arrays; numpy has no bfloat16)"
    if b == "tensorrt":
        if importlib.util.find_spec("tensorrt") is None:
            return "tensorrt is not installed (pip install tensorrt; needs a CUDA GPU)"
        if not cuda:
            return "TensorRT needs a CUDA GPU"
    return None


@dataclass
class Case:
    """A prepared call: ``run()`` computes one forward on the shared input; ``fetch(out)`` gives a torch tensor."""

    run: Callable[[], Any]
    fetch: Callable[[Any], torch.Tensor] = field(default=lambda out: out)
    notes: str = ""


class Backend:
    """A built backend for one dtype; ``prepare(x)`` returns the :class:`Case` for one input batch."""

    notes = ""

    def prepare(self, x: torch.Tensor) -> Case:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ModuleBackend(Backend):
    """Any callable PyTorch module, eager or compiled; optionally captured with CUDAGraphRunner per batch."""

    def __init__(self, module: Any, graph: bool, mark_step: bool = False, notes: str = "") -> None:
        self.module = module
        self.graph = graph
        self.mark_step = mark_step  # inductor cudagraph trees: a new step each call
        self.notes = notes
        self.runners: list[Any] = []

    def prepare(self, x: torch.Tensor) -> Case:
        if self.graph:
            from .graphs import CUDAGraphRunner

            self.runners.clear()  # one graph alive at a time: free the previous batch's pool
            gc.collect()
            torch.cuda.empty_cache()
            runner = CUDAGraphRunner(self.module, x, warmup=3)
            self.runners.append(runner)
            return Case(run=runner.replay, fetch=lambda out: out.clone(), notes=self.notes)
        module = self.module
        if self.mark_step:

            def run() -> Any:
                torch.compiler.cudagraph_mark_step_begin()
                return module(x)

            return Case(run=run, fetch=lambda out: out.clone(), notes=self.notes)
        return Case(run=lambda: module(x), notes=self.notes)

    def close(self) -> None:
        self.runners.clear()
        self.module = None


def build_timm(model: Any) -> Any:
    """timm's VisionTransformer for ``model.cfg`` with ``model``'s weights (timm uses fused SDPA attention)."""
    import functools

    from timm.models.vision_transformer import VisionTransformer as TimmViT

    cfg = model.cfg
    act = functools.partial(torch.nn.GELU, approximate="tanh") if cfg.act == "gelu_tanh" else torch.nn.GELU
    timm_model = TimmViT(
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        global_pool=cfg.global_pool,
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        qkv_bias=cfg.qkv_bias,
        init_values=cfg.init_values,
        class_token=cfg.class_token,
        reg_tokens=cfg.reg_tokens,
        no_embed_class=cfg.no_embed_class,
        pre_norm=cfg.pre_norm,
        fc_norm=cfg.fc_norm,
        dynamic_img_size=cfg.dynamic_img_size,
        act_layer=act,
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=cfg.layer_norm_eps),
    )
    timm_model.load_state_dict(model.state_dict(), strict=True)
    return timm_model.to(device=model.device, dtype=model.dtype).eval()


def export_onnx(
    model: Any, path: Path, dtype_name: str, max_batch: int, exporter: str, source: str | None = None
) -> str:
    """Write ``model`` (torch backend) as ONNX with a dynamic batch; returns how it was exported."""
    from .export import to_onnx

    to_onnx(
        model,
        str(path),
        batch=(1, max(2, max_batch)),
        dtype=DTYPES[dtype_name],
        opset=18,
        exporter=exporter,
        source=source,
        progress=False,
    )
    return f"vit_fast.export.to_onnx (exporter={exporter})"


_ORT_TYPES = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16}


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime: CUDA EP with I/O binding on torch's device buffers when the input is on a GPU, else CPU EP."""

    def __init__(self, onnx_path: Path, device: torch.device, dtype_name: str, export_note: str) -> None:
        import onnxruntime as ort

        self.device = device
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if device.type == "cuda":
            providers: list[Any] = [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=providers)
        used = self.session.get_providers()
        if device.type == "cuda" and "CUDAExecutionProvider" not in used:
            raise RuntimeError(f"onnxruntime did not enable the CUDA EP (session providers: {used})")
        inp, out = self.session.get_inputs()[0], self.session.get_outputs()[0]
        self.input_name, self.output_name = inp.name, out.name
        for what, t in (("input", inp.type), ("output", out.type)):
            if t not in _ORT_TYPES:
                raise RuntimeError(f"unsupported ONNX {what} type {t}")
        self.in_dtype, self.out_dtype = _ORT_TYPES[inp.type], _ORT_TYPES[out.type]
        ep = "CUDA EP, I/O binding on torch's buffers (Run blocks until done)" if device.type == "cuda" else "CPU EP"
        self.notes = f"{ep}; {export_note}"

    @staticmethod
    def _element_type(dtype: torch.dtype) -> Any:
        import numpy as np

        if dtype == torch.bfloat16:
            from onnx import TensorProto

            return TensorProto.BFLOAT16
        return {torch.float16: np.float16, torch.float32: np.float32}[dtype]

    def prepare(self, x: torch.Tensor) -> Case:
        import numpy as np

        session = self.session
        if self.device.type == "cuda":
            xin = x.to(self.in_dtype).contiguous()
            out = torch.empty(self._output_shape(x.shape[0]), dtype=self.out_dtype, device=x.device)
            binding = session.io_binding()
            idx = self.device.index or 0
            binding.bind_input(
                self.input_name, "cuda", idx, self._element_type(self.in_dtype), tuple(xin.shape), xin.data_ptr()
            )
            binding.bind_output(
                self.output_name, "cuda", idx, self._element_type(self.out_dtype), tuple(out.shape), out.data_ptr()
            )

            def run() -> torch.Tensor:
                _ = xin  # keep the bound input alive
                session.run_with_iobinding(binding)
                return out

            return Case(run=run, fetch=lambda o: o.clone(), notes=self.notes)
        if self.in_dtype == torch.bfloat16:
            raise RuntimeError("the CPU EP takes numpy inputs, and numpy has no bfloat16")
        feed = {self.input_name: x.detach().to(self.in_dtype).cpu().numpy()}
        names = [self.output_name]
        return Case(
            run=lambda: session.run(names, feed)[0], fetch=lambda o: torch.from_numpy(np.asarray(o)), notes=self.notes
        )

    def _output_shape(self, batch: int) -> tuple[int, ...]:
        shape = self.session.get_outputs()[0].shape
        dims = [d if isinstance(d, int) else None for d in shape]
        dims[0] = batch
        if any(d is None for d in dims):
            raise RuntimeError(f"cannot size the output buffer from the ONNX output shape {shape}")
        return tuple(dims)

    def close(self) -> None:
        self.session = None


_TRT_TORCH_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32}


class TensorRTBackend(Backend):
    """A TensorRT engine per batch size (min = opt = max = the batch), built by vit_fast.export.to_tensorrt."""

    def __init__(self, onnx_path: Path, workdir: Path, device: torch.device, dtype_name: str, model: Any) -> None:
        import tensorrt as trt

        from .export import to_tensorrt

        self.trt = trt
        self.to_tensorrt = to_tensorrt
        self.onnx_path = onnx_path
        self.workdir = workdir
        self.device = device
        self.precision = dtype_name
        self.model = model
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = None
        self.context = None
        self.notes = (
            f"engine per batch (min=opt=max), precision={dtype_name}, execute_async_v3 on its own "
            "stream, ordered with torch's current stream"
        )

    def prepare(self, x: torch.Tensor) -> Case:
        trt = self.trt
        batch = int(x.shape[0])
        engine_path = self.workdir / f"model_b{batch}_{self.precision}.plan"
        self.context = self.engine = None
        # verify=False: every backend's output is already checked against the torch backend here, and
        # verify's float64 CPU reference would take minutes for ViT-L at batch 256
        self.to_tensorrt(
            str(self.onnx_path),
            str(engine_path),
            batch=(batch, batch, batch),
            precision=self.precision,
            model=self.model,
            progress=False,
            verify=False,
        )
        self.engine = self.runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {engine_path}")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if len(inputs) != 1 or not outputs:
            raise RuntimeError(f"expected one input and some outputs; engine inputs {inputs}, outputs {outputs}")
        in_dtype = _TRT_TORCH_DTYPES[self.engine.get_tensor_dtype(inputs[0]).name]
        xin = x.to(in_dtype).contiguous()
        # set_input_shape / set_tensor_address return False (and log why) on failure
        if not self.context.set_input_shape(inputs[0], tuple(xin.shape)):
            raise RuntimeError(f"TensorRT engine {engine_path} rejects input shape {tuple(xin.shape)}")
        buffers = [xin]
        for name in outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            buffers.append(
                torch.empty(shape, dtype=_TRT_TORCH_DTYPES[self.engine.get_tensor_dtype(name).name], device=x.device)
            )
        for name, buf in zip([inputs[0], *outputs], buffers, strict=True):
            if not self.context.set_tensor_address(name, buf.data_ptr()):
                raise RuntimeError(f"TensorRT rejected the buffer for tensor {name!r} of {engine_path}")
        out = buffers[1]
        context = self.context
        # enqueueV3 on the legacy default stream makes TensorRT add cudaStreamSynchronize calls ("Using default
        # stream in enqueueV3() may lead to performance issues"), which would be timed too: run on a stream of
        # our own, ordered after the current stream's work and before its later work (the timing events).
        stream = torch.cuda.Stream(device=x.device)

        def run() -> torch.Tensor:
            current = torch.cuda.current_stream(x.device)
            stream.wait_stream(current)
            if not context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 returned False")
            current.wait_stream(stream)
            _ = buffers  # keep the bound buffers alive
            return out

        return Case(run=run, fetch=lambda o: o.clone(), notes=self.notes)

    def close(self) -> None:
        self.context = self.engine = self.model = None


# =========================================================================== the run
@dataclass
class BenchSettings:
    model: str
    batches: list[int]
    dtypes: list[str]
    backends: list[str]
    out_dir: Path
    device: str = "auto"
    warmup: int | None = None
    iters: int | None = None
    max_seconds: float | None = None
    flush_l2: bool = False
    h2d: bool = False
    graph: bool = False
    onnx_exporter: str = "dynamo"
    seed: int = 0
    progress: bool | None = None  # None: tqdm decides (off when stderr is not a terminal)
    measure_ceilings: bool = True
    threads: int | None = None  # CPU: torch.set_num_threads (None: torch's default)

    def resolved(self, device: torch.device) -> dict[str, Any]:
        cuda = device.type == "cuda"
        return {
            "warmup": self.warmup if self.warmup is not None else (20 if cuda else 2),
            "iters": self.iters if self.iters is not None else (200 if cuda else 10),
            "max_seconds": self.max_seconds if self.max_seconds is not None else (10.0 if cuda else 3.0),
        }


def cpu_threads_for_load() -> tuple[int, str]:
    """CPU threads for timing: torch's default, cut to the cores the load average leaves free (at least 1).

    On a shared machine, OpenMP threads that wait on a descheduled sibling make each call many
    times slower and noisy; fewer threads than busy cores avoid that.
    """
    default = torch.get_num_threads()
    cores = os.cpu_count() or default
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return default, "torch default"
    free = max(1, int(cores - load + 0.5))
    if free >= default:
        return default, f"torch default ({default}); load average {load:.1f} on {cores} cores"
    return free, f"{free} of {default}: load average {load:.1f} on {cores} cores (use --threads to choose)"


def model_slug(spec: str) -> str:
    stem = Path(spec).stem if Path(spec).suffix else spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_") or "model"


def _weight_bytes(model: Any, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(p.numel() for p in model.parameters()) * elem


def _make_input(cfg: Any, batch: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    h, w = cfg.img_hw
    gen = torch.Generator().manual_seed(seed * 100003 + batch)
    return torch.randn(batch, cfg.in_chans, h, w, generator=gen).to(dtype).to(device)


def _max_abs_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.detach().float().cpu()
    ref = ref.detach().float().cpu()
    if out.shape != ref.shape:
        raise RuntimeError(f"output shape {tuple(out.shape)} differs from the torch backend's {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out - ref).abs().max())


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _short_error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    first = text.splitlines()[0] if text else type(err).__name__
    return first[:500]


class Harness:
    """Runs :class:`BenchSettings` and returns the report dict (see :func:`write_reports`)."""

    def __init__(self, settings: BenchSettings, log: Callable[[str], None] | None = None) -> None:
        self.s = settings
        self.log = log or (lambda msg: None)
        self.device = resolve_device(settings.device)
        self.threads_note = "torch default"
        if settings.threads is not None:
            if settings.threads < 1:
                raise BenchError(f"--threads must be >= 1, got {settings.threads}")
            torch.set_num_threads(settings.threads)
            self.threads_note = "--threads"
        elif self.device.type == "cpu":
            threads, self.threads_note = cpu_threads_for_load()
            torch.set_num_threads(threads)
        for d in settings.dtypes:
            check_dtype_supported(self.device, d)
        self.opts = settings.resolved(self.device)
        if self.opts["iters"] < 1 or self.opts["warmup"] < 0:
            raise BenchError(f"--iters must be >= 1 and --warmup >= 0, got {self.opts['iters']}, {self.opts['warmup']}")
        self.variants = plan_variants(settings.backends, settings.graph)

    # ------------------------------------------------------------------ building one backend
    def _build(self, variant: Variant, ref_model: Any, dtype_name: str, workdir: Path) -> Backend:
        b = variant.backend
        cuda = self.device.type == "cuda"
        if b == "torch":
            return ModuleBackend(
                copy.deepcopy(ref_model).set_backend("torch"),
                variant.graph,
                notes="eager PyTorch (vit_fast torch backend)",
            )
        if b in ("triton", "triton-graph"):
            try:
                importlib.import_module("vit_fast.triton_path")
            except ImportError as err:
                raise Unavailable(f"vit_fast.triton_path is not importable ({err})") from err
            model = copy.deepcopy(ref_model).set_backend("triton")
            return ModuleBackend(model, variant.graph, notes="vit_fast Triton kernels")
        if b.startswith("compile"):
            import torch._dynamo as dynamo

            dynamo.reset()  # each compiled variant starts from empty caches
            mode = {
                "compile": None,
                "compile-max-autotune": "max-autotune",
                "compile-reduce-overhead": "reduce-overhead",
            }[b]
            model = copy.deepcopy(ref_model).set_backend("torch")
            compiled = torch.compile(model, mode=mode, dynamic=False)
            graphed_by_inductor = cuda and mode in ("max-autotune", "reduce-overhead")
            return ModuleBackend(
                compiled,
                variant.graph,
                mark_step=graphed_by_inductor,
                notes=f"torch.compile(mode={mode!r}, dynamic=False) of the torch backend",
            )
        if b == "timm":
            timm_model = build_timm(ref_model)
            fused = getattr(getattr(timm_model.blocks[0], "attn", None), "fused_attn", "?")
            return ModuleBackend(timm_model, variant.graph, notes=f"timm VisionTransformer, fused_attn={fused}")
        if b in ("onnxruntime", "tensorrt"):
            onnx_path, note = self._onnx(ref_model, dtype_name, workdir)
            if b == "onnxruntime":
                return OnnxRuntimeBackend(onnx_path, self.device, dtype_name, note)
            return TensorRTBackend(onnx_path, workdir, self.device, dtype_name, ref_model)
        raise BenchError(f"unknown backend {b!r}")

    def _onnx(self, ref_model: Any, dtype_name: str, workdir: Path) -> tuple[Path, str]:
        key = (dtype_name, "onnx")
        if key not in self._onnx_cache:
            path = workdir / f"model_{dtype_name}.onnx"
            model = copy.deepcopy(ref_model).set_backend("torch")
            note = export_onnx(model, path, dtype_name, max(self.s.batches), self.s.onnx_exporter, source=self.s.model)
            del model
            self._onnx_cache[key] = (path, note)
        return self._onnx_cache[key]

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        from .loading import load_model
        from .model import count_flops

        s, device = self.s, self.device
        env = collect_environment(device)
        self.log(f"device: {env['device_name']}")
        base = load_model(s.model, backend="torch", seed=s.seed).float().eval()
        cfg = base.cfg
        flops_img = count_flops(cfg)
        ceilings: dict[str, Any] = {"device": env["device_name"], "bandwidth": None, "matrix": {}}
        if s.measure_ceilings:
            self.log("measuring ceilings (copy bandwidth, matmul rate)")
            ceilings["bandwidth"] = measure_bandwidth(device)
            for d in s.dtypes:
                ceilings["matrix"][d] = measure_matrix_rate(device, d)
            _release(device)
        flusher = L2Flusher(device) if s.flush_l2 else None

        common = {
            "model": s.model,
            "img_size": list(cfg.img_hw),
            "patch_size": cfg.patch_size,
            "tokens": cfg.num_tokens,
            "gelu": cfg.act,
            "params": sum(p.numel() for p in base.parameters()),
            "flops_per_image": flops_img,
            "device": str(device),
            "device_name": env["device_name"],
            "driver_version": env["driver_version"],
            "cuda_runtime": env["cuda_runtime"],
            "torch": env["torch"],
            "triton": env["triton"],
            "onnxruntime": env["onnxruntime"],
            "tensorrt": env["tensorrt"],
            "timm": env["timm"],
            "git_commit": env["git_commit"],
            "timer": "cuda-events" if device.type == "cuda" else "perf_counter",
            "flush_l2": bool(flusher),
            "warmup": self.opts["warmup"],
        }
        rows: list[dict[str, Any]] = []
        transfers: list[dict[str, Any]] = []
        total = len(s.dtypes) * len(self.variants) * len(s.batches)
        bar = _progress(total, s.progress)
        self._onnx_cache: dict[Any, tuple[Path, str]] = {}
        workdir = Path(tempfile.mkdtemp(prefix="vit-fast-bench-"))
        try:
            with torch.no_grad():
                for dtype_name in s.dtypes:
                    rows.extend(self._run_dtype(dtype_name, base, common, ceilings, flusher, workdir, bar, transfers))
                    self._onnx_cache.clear()
                    _release(device)
        finally:
            bar.close()
            shutil.rmtree(workdir, ignore_errors=True)
        add_ratios(rows)
        return {
            "schema": SCHEMA_VERSION,
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "model": s.model,
            "config": cfg.to_dict(),
            "environment": env,
            "ceilings": ceilings,
            "settings": {
                "batches": s.batches,
                "dtypes": s.dtypes,
                "backends": s.backends,
                "graph": s.graph,
                "h2d": s.h2d,
                "flush_l2": flusher.describe() if flusher else False,
                "onnx_exporter": s.onnx_exporter,
                "seed": s.seed,
                "threads": torch.get_num_threads() if device.type == "cpu" else None,
                "threads_note": self.threads_note if device.type == "cpu" else None,
                **self.opts,
            },
            "unavailable": unavailable_summary(rows),
            "transfers": transfers,
            "rows": rows,
        }

    def _run_dtype(
        self,
        dtype_name: str,
        base: Any,
        common: dict[str, Any],
        ceilings: dict[str, Any],
        flusher: L2Flusher | None,
        workdir: Path,
        bar: Any,
        transfers: list[dict[str, Any]],
    ) -> list[dict]:
        s, device = self.s, self.device
        dtype = DTYPES[dtype_name]
        ref_model = copy.deepcopy(base).to(device=device, dtype=dtype).set_backend("torch").eval()
        weight_bytes = _weight_bytes(ref_model, dtype)
        inputs = {b: _make_input(base.cfg, b, dtype, device, s.seed) for b in s.batches}
        refs = {b: ref_model(x).detach().clone() for b, x in inputs.items()}
        fp32_err: dict[int, float] = {}
        if dtype != torch.float32:
            ref32 = copy.deepcopy(base).to(device=device).set_backend("torch").eval()
            for b, x in inputs.items():
                fp32_err[b] = _max_abs_err(refs[b], ref32(x.float()))
            del ref32
            _release(device)
        h2d: dict[int, dict[str, Any]] = {}
        if s.h2d:
            for b, x in inputs.items():
                h2d[b] = self._time_h2d(x)
                transfers.append({"dtype": dtype_name, "batch": b, **h2d[b]})
        out_rows = []
        for variant in self.variants:
            base_row = {
                **common,
                "backend": variant.backend,
                "label": variant.label,
                "graph_mode": graph_mode(variant, device),
                "dtype": dtype_name,
                "weight_bytes": weight_bytes,
            }
            reason = static_unavailable(variant, device, dtype_name)
            backend: Backend | None = None
            build_error = None
            if reason is None:
                try:
                    bar.set_postfix_str(f"{dtype_name} {variant.label}: building")
                    backend = self._build(variant, ref_model, dtype_name, workdir)
                except Unavailable as err:
                    reason = str(err)
                except Exception as err:  # reported in every row of this backend; the others go on
                    build_error = (_short_error(err), traceback.format_exc(limit=8))
            for b in s.batches:
                row = {**base_row, "batch": b, "torch_max_abs_err_vs_fp32": fp32_err.get(b, 0.0)}
                fl = floor_ms(weight_bytes, flops_img_total(common, b), ceilings, dtype_name)
                row["floor_ms"], row["floor_bound"] = fl if fl else (None, None)
                if b in h2d:
                    row["h2d_median_ms"] = h2d[b].get("median_ms")
                if reason is not None:
                    row.update(status="unavailable", reason=reason)
                elif build_error is not None:
                    row.update(status="error", error=build_error[0], traceback=build_error[1])
                elif variant.backend == "compile-reduce-overhead" and b != 1:
                    row.update(status="skipped", reason="compile-reduce-overhead is timed at batch 1 only")
                else:
                    bar.set_postfix_str(f"{dtype_name} {variant.label} batch {b}")
                    row.update(self._measure(backend, inputs[b], refs[b], flusher))
                out_rows.append(row)
                bar.update(1)
            if backend is not None:
                backend.close()
            del backend
            _release(device)
        del ref_model, inputs, refs
        return out_rows

    def _measure(self, backend: Backend, x: torch.Tensor, ref: torch.Tensor, flusher: L2Flusher | None) -> dict:
        device = self.device
        try:
            case = backend.prepare(x)
            out = case.fetch(case.run())
            synchronize(device)
            err = _max_abs_err(out, ref)
            del out
            times = time_callable(
                case.run,
                device,
                warmup=self.opts["warmup"],
                iters=self.opts["iters"],
                flush=flusher,
                max_seconds=self.opts["max_seconds"],
                min_iters=5 if device.type == "cuda" else 3,
            )
        except Exception as err:
            _release(device)
            return {"status": "error", "error": _short_error(err), "traceback": traceback.format_exc(limit=8)}
        stats = summarize(times)
        batch = int(x.shape[0])
        return {
            "status": "ok",
            "max_abs_err_vs_torch": err,
            "iters": stats["n"],
            **stats,
            "images_per_s": batch / (stats["median_ms"] * 1e-3),
            "notes": case.notes,
        }

    def _time_h2d(self, x: torch.Tensor) -> dict[str, Any]:
        nbytes = x.numel() * x.element_size()
        if self.device.type != "cuda":
            return {"bytes": nbytes, "median_ms": None, "note": "n/a on CPU: the input already lies in host memory"}
        host = x.cpu().pin_memory()
        dst = torch.empty_like(x)
        times = time_callable(
            lambda: dst.copy_(host, non_blocking=True), self.device, warmup=3, iters=min(self.opts["iters"], 50)
        )
        st = summarize(times)
        return {
            "bytes": nbytes,
            "median_ms": st["median_ms"],
            "p90_ms": st["p90_ms"],
            "p99_ms": st["p99_ms"],
            "GBps": nbytes / (st["median_ms"] * 1e-3) / 1e9,
            "note": "pinned host -> device, non_blocking copy",
        }


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool | None) -> Any:
    """A tqdm bar on stderr (None: only when stderr is a terminal); a no-op without tqdm."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="bench", unit="case", disable=None if enabled is None else not enabled, leave=False)


def flops_img_total(common: dict[str, Any], batch: int) -> float:
    return float(common["flops_per_image"]) * batch


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Fill achieved TFLOP/s, the ratio to the best peer (same dtype and batch) and to the floor."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        r["tflops"] = r["flops_per_image"] * r["batch"] / (r["median_ms"] * 1e-3) / 1e12
        r["vs_floor"] = r["median_ms"] / r["floor_ms"] if r.get("floor_ms") else None
        key = (r["dtype"], r["batch"])
        if key not in best or r["median_ms"] < best[key]["median_ms"]:
            best[key] = r
    for r in rows:
        if r.get("status") != "ok":
            continue
        b = best[(r["dtype"], r["batch"])]
        r["vs_best"] = r["median_ms"] / b["median_ms"]
        r["best_peer"] = b["label"]


def unavailable_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (label, status, reason) not run (unavailable, error, skipped), with its dtypes and batches."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r.get("status") == "ok":
            continue
        why = r.get("reason") or r.get("error") or ""
        key = (r["label"], r["status"], why)
        entry = seen.get(key)
        if entry is None:
            entry = {
                "backend": r["backend"],
                "label": r["label"],
                "status": r["status"],
                "reason": why,
                "dtypes": [],
                "batches": [],
            }
            seen[key] = entry
            out.append(entry)
        if r["dtype"] not in entry["dtypes"]:
            entry["dtypes"].append(r["dtype"])
        if r["batch"] not in entry["batches"]:
            entry["batches"].append(r["batch"])
    return out


# =========================================================================== reports
def _fmt(v: Any, spec: str = ".3g", none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none if v is None else "nan"
    return format(v, spec)


def markdown_report(report: dict[str, Any]) -> str:
    env, ceil, cfg = report["environment"], report["ceilings"], report["config"]
    rows = report["rows"]
    t = rows[0] if rows else {}
    lines = [
        f"# vit-fast bench: {report['model']}",
        "",
        f"- device: {env['device_name']} (driver {env['driver_version']}, CUDA runtime {env['cuda_runtime']})",
        f"- versions: torch {env['torch']}, triton {env['triton']}, onnxruntime {env['onnxruntime']}, "
        f"tensorrt {env['tensorrt']}, timm {env['timm']}, vit-fast {env['vit_fast']}",
        f"- commit: {env['git_commit']}; created {report['created_utc']}",
        f"- model: {cfg['embed_dim']}d x {cfg['depth']} blocks, {t.get('tokens', '?')} tokens, GELU {cfg['act']}, "
        f"{_fmt(t.get('params', 0) / 1e6, '.1f')} M params, {_fmt(t.get('flops_per_image', 0) / 1e9, '.2f')} "
        f"GFLOP/image",
        f"- timing: {t.get('timer', '?')}, warm-up {report['settings']['warmup']}, up to "
        f"{report['settings']['iters']} runs (capped at ~{report['settings']['max_seconds']} s per case), "
        f"L2 flush: {report['settings']['flush_l2'] or 'off'}",
    ]
    if report["settings"].get("threads"):
        lines.append(f"- CPU threads: {report['settings']['threads']} ({report['settings']['threads_note']})")
    if ceil.get("bandwidth"):
        lines.append(f"- measured bandwidth: {ceil['bandwidth']['GBps']:.1f} GB/s ({ceil['bandwidth']['method']})")
    for d, m in (ceil.get("matrix") or {}).items():
        lines.append(f"- measured matrix rate {d}: {m['TFLOPs']:.3g} TFLOP/s ({m['method']})")
    lines += [
        "",
        "Latencies in ms per batch (median, p90, p99). `x best` = median / fastest median at the same dtype and "
        "batch; `x floor` = median / max(weight bytes / bandwidth, FLOPs / matrix rate); `err` = max |output - "
        "torch backend output| on the same input (`torch err` = torch backend vs fp32).",
        "",
        "| backend | graph | dtype | batch | median | p90 | p99 | img/s | TFLOP/s | x best | floor ms | x floor "
        "| err | torch err |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("status") != "ok":
            continue
        graph = "-" if r["graph_mode"] == "none" else r["graph_mode"].split(" ")[0]
        best = _fmt(r.get("vs_best"), ".2f") + ("x" if r.get("vs_best") is not None else "")
        if r.get("vs_best") == 1.0:
            best = f"**{best}**"
        lines.append(
            f"| {r['label']} | {graph} | {r['dtype']} | {r['batch']} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} "
            f"| {r['p99_ms']:.3f} | {r['images_per_s']:.1f} | {_fmt(r.get('tflops'))} | {best} "
            f"| {_fmt(r.get('floor_ms'), '.3f')} ({(r.get('floor_bound') or '-')[:3]}) "
            f"| {_fmt(r.get('vs_floor'), '.1f')}x | {_fmt(r.get('max_abs_err_vs_torch'), '.2g')} "
            f"| {_fmt(r.get('torch_max_abs_err_vs_fp32'), '.2g')} |"
        )
    if not any(r.get("status") == "ok" for r in rows):
        lines.append("| (nothing ran) |||||||||||||| ")
    if report.get("transfers"):
        lines += [
            "",
            "Host-to-device copy of the input (timed apart from the forward):",
            "",
            "| dtype | batch | MB | median ms | GB/s |",
            "|---|---:|---:|---:|---:|",
        ]
        for tr in report["transfers"]:
            lines.append(
                f"| {tr['dtype']} | {tr['batch']} | {tr['bytes'] / 1e6:.2f} "
                f"| {_fmt(tr.get('median_ms'), '.4f')} | {_fmt(tr.get('GBps'), '.1f', tr.get('note', '-'))} |"
            )
    if report["unavailable"]:
        lines += ["", "Not run:", ""]
        for u in report["unavailable"]:
            lines.append(
                f"- **{u['label']}** ({','.join(u['dtypes'])}; batch {','.join(map(str, u['batches']))}): "
                f"{u['status']}: {u['reason']}"
            )
    return "\n".join(lines) + "\n"


def plot_report(report: dict[str, Any]) -> bytes:
    """PNG bytes: median latency and images/s against batch size, one line per backend and dtype."""
    import io

    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    fig, (ax_lat, ax_thr) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in report["rows"]:
        if r.get("status") == "ok":
            series.setdefault((r["label"], r["dtype"]), []).append(r)
    styles = ["-", "--", ":", "-."]
    dstyle = {d: styles[i % len(styles)] for i, d in enumerate(report["settings"]["dtypes"])}
    labels = sorted({label for label, _ in series})
    palette = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    color = {label: palette(i % palette.N) for i, label in enumerate(labels)}  # one colour per backend
    for (label, dtype), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["batch"])
        xs = [r["batch"] for r in rs]
        kw = {"marker": "o", "linestyle": dstyle.get(dtype, "-"), "color": color[label], "label": f"{label} {dtype}"}
        ax_lat.plot(xs, [r["median_ms"] for r in rs], **kw)
        ax_thr.plot(xs, [r["images_per_s"] for r in rs], **kw)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    batches = sorted(report["settings"]["batches"])
    for ax, ylabel, key in ((ax_lat, "median latency (ms)", "median_ms"), (ax_thr, "images / s", "images_per_s")):
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.xaxis.set_minor_locator(NullLocator())
        values = [r[key] for rs in series.values() for r in rs if r.get(key)]
        # a log axis only pays off over a decade or more; inside one it would show no tick labels at all
        if values and max(values) / min(values) >= 10:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_locator(NullLocator())
        ax.grid(True, alpha=0.3)
    if series:
        ax_thr.legend(fontsize=8, loc="best")
    else:
        ax_lat.text(0.5, 0.5, "no backend ran", ha="center", va="center", transform=ax_lat.transAxes)
    env = report["environment"]
    fig.suptitle(
        f"{report['model']} on {env['device_name'][:80]}  (torch {env['torch']}, {env['git_commit'][:12]})", fontsize=10
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.dtype):
        return str(obj)
    return repr(obj)


def _json_clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # "nan" / "inf": visible, and still valid JSON
    if isinstance(obj, dict):
        return {k: _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_clean(v) for v in obj]
    return obj


def write_reports(report: dict[str, Any], out_dir: Path, stem: str) -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` into ``out_dir`` atomically; returns the paths."""
    out_dir = Path(out_dir)
    paths = {
        "json": write_atomic(
            out_dir / f"{stem}.json", json.dumps(_json_clean(report), indent=2, default=_json_default) + "\n"
        ),
        "markdown": write_atomic(out_dir / f"{stem}.md", markdown_report(report)),
    }
    try:
        png = plot_report(report)
    except ImportError as err:  # matplotlib is an optional extra (vit-fast[bench])
        print(f"vit-fast bench: no plot written: {err} (pip install 'vit-fast[bench]')", file=sys.stderr)
    else:
        paths["png"] = write_atomic(out_dir / f"{stem}.png", png)
    return paths


def run_benchmark(settings: BenchSettings, log: Callable[[str], None] | None = None) -> tuple[dict[str, Any], dict]:
    """Run the benchmark and write its reports; returns (report, paths)."""
    threads = torch.get_num_threads()
    try:
        harness = Harness(settings, log=log)
        report = harness.run()
    finally:
        torch.set_num_threads(threads)  # --threads is for this run only
    paths = write_reports(report, settings.out_dir, f"bench_{model_slug(settings.model)}")
    return report, paths


__all__ = [
    "BACKENDS",
    "DTYPES",
    "BenchError",
    "BenchSettings",
    "Harness",
    "L2Flusher",
    "collect_environment",
    "markdown_report",
    "measure_bandwidth",
    "measure_matrix_rate",
    "parse_backends",
    "parse_batches",
    "parse_dtypes",
    "percentile",
    "plot_report",
    "run_benchmark",
    "summarize",
    "time_callable",
    "write_reports",
]
