"""Timing one call and summarizing many: CUDA events or ``perf_counter``, an L2 flush, statistics.

:class:`Sampling` decides how many calls a case times (targets and caps, as trtexec's ``--iterations`` /
``--duration``), :func:`sample` times them and says what ended the case, :class:`L2Flusher` writes past L2 before each
call, :func:`summarize` gives median, p10, p90, p99, mean, min, max, std and the count. Rules: docs/benchmarks.md."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(times_ms: Sequence[float]) -> dict[str, float]:
    """Median, p10, p90, p99, mean, min, max, standard deviation (sample, n - 1; all ms) and the count ``n``."""
    if not len(times_ms):
        raise ValueError("no timings to summarize")
    t = np.asarray(times_ms, dtype=np.float64)
    p10, p50, p90, p99 = (float(v) for v in np.percentile(t, [10, 50, 90, 99]))
    return {
        "n": int(t.size),
        "median_ms": p50,
        "p10_ms": p10,
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


@dataclass(frozen=True)
class Sampling:
    """How many calls one case times (docs/benchmarks.md, "How it times"); seconds are wall-clock, times ms."""

    warmup: int
    min_samples: int
    min_time_s: float = 0.0
    max_samples: int = 10_000
    max_seconds: float | None = None
    floor: int = 3

    def __post_init__(self) -> None:
        if self.min_samples < 1 or self.max_samples < 1 or self.warmup < 0:
            raise ValueError(
                f"need min_samples >= 1, max_samples >= 1 and warmup >= 0, got {self.min_samples}, "
                f"{self.max_samples}, {self.warmup}"
            )
        if self.min_time_s < 0 or (self.max_seconds is not None and self.max_seconds <= 0):
            raise ValueError(f"need min_time_s >= 0 and max_seconds > 0, got {self.min_time_s}, {self.max_seconds}")

    def stop(self, n: int, timed_s: float, wall_s: float) -> str | None:
        """Why to stop after ``n`` calls (``timed_s`` seconds timed, ``wall_s`` elapsed), or None to go on."""
        if n >= self.min_samples and timed_s >= self.min_time_s:
            return "target"
        if n >= self.max_samples:
            return "sample cap"
        if self.max_seconds is not None and wall_s >= self.max_seconds and n >= min(self.floor, self.max_samples):
            return "time cap"
        return None

    def expected_calls(self, per_call_s: float) -> int:
        """How many calls :func:`sample` times for a case whose call takes ``per_call_s`` seconds (the warm-up
        not counted): the targets, cut by the caps, by the rule :meth:`stop` applies."""
        per_call_s = max(per_call_s, 1e-9)
        n = max(self.min_samples, math.ceil(self.min_time_s / per_call_s))
        if self.max_seconds is not None:
            n = min(n, max(min(self.floor, self.max_samples), math.ceil(self.max_seconds / per_call_s)))
        return min(n, self.max_samples)

    def more(self, n: int, timed_s: float, wall_s: float, per_call_s: float) -> int:
        """How many more calls to queue (at least 1) to reach the targets without passing a cap."""
        per_call_s = max(per_call_s, 1e-7)
        want = max(self.min_samples - n, math.ceil((self.min_time_s - timed_s) / per_call_s), 1)
        room = self.max_samples - n
        if self.max_seconds is not None:
            room = min(room, max(self.floor - n, int((self.max_seconds - wall_s) / per_call_s), 1))
        return max(1, min(want, room))


def sample(
    fn: Callable[[], Any], device: torch.device, sampling: Sampling, flush: Callable[[], None] | None = None
) -> tuple[list[float], str]:
    """Milliseconds of each timed call of ``fn`` after the warm-up, and why the sampling stopped (``"target"``,
    ``"sample cap"`` or ``"time cap"``). CUDA: one pair of events per call on the current stream (GPU time from the
    start of the call's first kernel slot to its last, launch gaps included), queued in chunks sized from the time
    per call so far. CPU: ``time.perf_counter`` around each call, the stopping rule checked after each."""
    for _ in range(sampling.warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    start = time.perf_counter()
    if device.type != "cuda":
        while True:
            if flush is not None:
                flush()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            why = sampling.stop(len(times), sum(times) / 1e3, time.perf_counter() - start)
            if why:
                return times, why
    t0 = time.perf_counter()  # one synchronized call sizes the first chunk
    fn()
    synchronize(device)
    per_call = time.perf_counter() - t0
    while True:
        k = sampling.more(len(times), sum(times) / 1e3, time.perf_counter() - start, per_call)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        for i in range(k):
            if flush is not None:
                flush()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize(device)
        times.extend(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
        per_call = sum(times) / len(times) / 1e3
        why = sampling.stop(len(times), sum(times) / 1e3, time.perf_counter() - start)
        if why:
            return times, why


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
    """Milliseconds of each of ``iters`` calls of ``fn`` after ``warmup`` calls; with ``max_seconds`` the
    count is cut so the timed loop takes about that long, but never below ``min_iters``. (A fixed count:
    :func:`sample` with ``min_samples = max_samples = iters``.)"""
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    plan = Sampling(
        warmup=max(0, warmup), min_samples=iters, max_samples=iters, max_seconds=max_seconds, floor=min_iters
    )
    return sample(fn, device, plan, flush)[0]
