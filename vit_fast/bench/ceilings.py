"""The physical ceilings of the device the bench runs on, measured there, and the floor they set.

:func:`measure_bandwidth` (a large same-device copy, bytes read plus written) and :func:`measure_matrix_rate` (a
large square matmul per dtype); :func:`floor_ms` is ``max(weight bytes / bandwidth, FLOPs / matrix rate)``. On CPU
the same is measured with CPU tensors and labelled so. Sizes and how to read the floor: docs/benchmarks.md."""

from __future__ import annotations

from typing import Any

import torch

from vit_fast.util.dtypes import DTYPES

from .timing import summarize, time_callable


def measure_bandwidth(device: torch.device, nbytes: int | None = None, iters: int | None = None) -> dict[str, Any]:
    """Copy bandwidth in GB/s: a large same-device copy, counting the bytes read plus the bytes written."""
    if nbytes is None:
        nbytes = 2 * 2**30 if device.type == "cuda" else 128 * 2**20
    iters = iters or (20 if device.type == "cuda" else 5)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    ms = summarize(time_callable(lambda: dst.copy_(src), device, warmup=2, iters=iters))["median_ms"]
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
    ms = summarize(times)["median_ms"]
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
