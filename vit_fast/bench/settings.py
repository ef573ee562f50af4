"""What a benchmark run is asked to do, and the checks on it: the backend names, the settings
dataclass (with the device's defaults for what is left unset), the parsers of the ``--batch`` /
``--dtype`` / ``--backends`` lists, the device, and whether a dtype can run on it. Every bad request
is a :class:`BenchError` that says what to change.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vit_fast.util.batches import parse_batch_list
from vit_fast.util.dtypes import DTYPE_NAMES, DTYPES, check_dtype_on_device, native_dtype, parse_dtype_list
from vit_fast.util.progress import plural

BACKENDS: tuple[str, ...] = (
    "torch",
    "triton",
    "triton-graph",
    "compile",
    "compile-max-autotune",
    "compile-reduce-overhead",
    "timm",
    "hf",
    "onnxruntime",
    "tensorrt",
)
#: backends that --graph also runs captured in a CUDA graph (triton's captured form is "triton-graph";
#: compile-max-autotune and compile-reduce-overhead are graphed by inductor already)
GRAPHABLE: tuple[str, ...] = ("torch", "triton", "compile", "timm", "hf")
SCHEMA_VERSION = 2
#: per device type: warm-up calls, and the sampling of each case: at least ``min_samples`` calls and
#: ``min_time_s`` seconds of them (so a p99 rests on 100+ samples even on CPU), at most ``iters`` calls
#: or about ``max_seconds`` of wall time
SAMPLING_DEFAULTS: dict[str, dict[str, Any]] = {
    "cuda": {"warmup": 20, "min_samples": 200, "min_time_s": 1.0, "iters": 10_000, "max_seconds": 10.0},
    "cpu": {"warmup": 2, "min_samples": 100, "min_time_s": 1.0, "iters": 10_000, "max_seconds": 30.0},
}
BATCH_DEFAULTS = {"cuda": [1, 8, 64, 256], "cpu": [1, 8]}


class BenchError(ValueError):
    """A bad request (argument, device, dtype): the message says what to change."""


class Unavailable(Exception):
    """A backend that cannot run here; the message is the reason."""


@dataclass
class BenchSettings:
    """One benchmark run: which model, batch sizes, dtype names, backends, how to sample, where to write.
    ``model``: a model name (preset, checkpoint, ``timm:``/``hf:`` name), a ``VisionTransformer`` (or the Hugging Face
    drop-in), or an ``.onnx`` / ``.plan`` / ``.engine`` / ``.trt`` artifact. ``batches`` / ``dtypes`` / ``backends``
    left None take the device's defaults. ``out_dir``: where :func:`run_benchmark` writes (None: nothing). Every
    field in detail: docs/benchmarks.md, section "From Python"."""

    model: Any
    batches: list[int] | None = None
    dtypes: list[str] | None = None
    backends: list[str] | None = None
    out_dir: Path | None = None
    device: str = "auto"
    warmup: int | None = None
    iters: int | None = None  # at most this many timed calls per case
    max_seconds: float | None = None  # and at most about this long
    min_samples: int | None = None  # at least this many timed calls per case ...
    min_time_s: float | None = None  # ... and at least this many seconds of them
    flush_l2: bool = False
    h2d: bool = False
    graph: bool = False
    onnx_exporter: str = "dynamo"
    seed: int = 0
    progress: bool | None = None  # None: a bar only when stderr is a terminal
    measure_ceilings: bool = True
    threads: int | None = None  # CPU: torch.set_num_threads and ONNX Runtime's intra-op threads
    overwrite: bool = False
    tune: bool = False  # the triton backends tuned before they are timed (default: the heuristic configs)

    def resolved(self, device: torch.device) -> dict[str, Any]:
        """Warm-up calls and the sampling of each case, with the device's defaults filled in."""
        defaults = SAMPLING_DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
        given = {
            "warmup": self.warmup,
            "min_samples": self.min_samples,
            "min_time_s": self.min_time_s,
            "iters": self.iters,
            "max_seconds": self.max_seconds,
        }
        out = {k: v if v is not None else defaults[k] for k, v in given.items()}
        if out["warmup"] < 0 or out["iters"] < 1 or out["min_samples"] < 1 or out["min_time_s"] < 0:
            raise BenchError(
                "need warmup >= 0, iters >= 1, min_samples >= 1 and min_time_s >= 0, got "
                f"{out['warmup']}, {out['iters']}, {out['min_samples']}, {out['min_time_s']}"
            )
        if out["max_seconds"] is not None and out["max_seconds"] <= 0:
            raise BenchError(f"max_seconds must be > 0, got {out['max_seconds']}")
        return out


def parse_batches(text: str) -> list[int]:
    """``"1,8,64"`` -> ``[1, 8, 64]``: positive ints, no duplicates, order kept (``vit_fast.util.batches``)."""
    try:
        return parse_batch_list(text)
    except ValueError as err:
        raise BenchError(str(err)) from None


def parse_dtypes(text: str) -> list[str]:
    """``"bf16,fp16"`` -> ``["bf16", "fp16"]`` (aliases such as ``float16`` accepted, duplicates dropped)."""
    try:
        return parse_dtype_list(text)
    except ValueError as err:
        raise BenchError(str(err)) from None


def parse_backends(text: str) -> list[str]:
    """``"torch,triton"`` -> ``["torch", "triton"]``; ``"all"`` means every backend."""
    if str(text).strip() == "all":
        return list(BACKENDS)
    out: list[str] = []
    for t in str(text).split(","):
        name = t.strip()
        if name not in BACKENDS:
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


def default_dtypes(device: torch.device) -> list[str]:
    """The ``--dtype`` a run on ``device`` takes when none is given: one the card runs natively (bf16 where it
    is native, fp16 on a CUDA card without it such as the T4), fp32 on a CPU."""
    return [DTYPE_NAMES[native_dtype(device)]]


def check_dtype_supported(device: torch.device, dtype_name: str) -> None:
    """Raise BenchError when ``dtype_name`` cannot run a ViT's ops (conv, matmul, layer norm) on ``device``, or
    would run there emulated (bf16 on a CUDA card without native bf16: timing it would mislead)."""
    dtype = DTYPES[dtype_name]
    if device.type == "cuda":
        try:
            check_dtype_on_device(dtype, device, "use --dtype fp16 or fp32")
        except ValueError as err:
            raise BenchError(str(err)) from None
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
        return default, f"torch default ({default}); load average {load:.1f} on {plural(cores, 'core')}"
    return free, f"{free} of {default}: load average {load:.1f} on {plural(cores, 'core')}; --threads chooses"
