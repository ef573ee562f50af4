"""Timing one call and summarizing many: CUDA events or ``perf_counter``, an L2 flush, statistics.

On CUDA: warm-up calls, then one pair of CUDA events around each of many calls with the input
already resident on the GPU; optionally an L2 flush (a write of a buffer larger than L2) before
each call, outside the timed interval. On CPU: ``time.perf_counter`` around each call. Statistics:
median, p90, p99 (``numpy.percentile``, linear interpolation), mean, min, max, standard deviation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(times_ms: Sequence[float]) -> dict[str, float]:
    """Median, p90, p99, mean, min, max, standard deviation (sample, n - 1; all ms) and the count ``n``."""
    if not len(times_ms):
        raise ValueError("no timings to summarize")
    t = np.asarray(times_ms, dtype=np.float64)
    p50, p90, p99 = (float(v) for v in np.percentile(t, [50, 90, 99]))
    return {
        "n": int(t.size),
        "median_ms": p50,
        "p90_ms": p90,
        "p99_ms": p99,
        "mean_ms": float(t.mean()),
        "min_ms": float(t.min()),
        "max_ms": float(t.max()),
        "std_ms": float(t.std(ddof=1)) if t.size > 1 else 0.0,
    }


def l2_cache_bytes(device: torch.device) -> int | None:
    """The GPU's L2 size, or the CPU's last-level cache (Linux sysfs), in bytes; None when unknown."""
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
