"""The benchmark's pacing: the progress bar over its cases, the time left from the cases timed so far, the line
printed as each case ends, and on a CPU the note before GPU-sized work (:class:`CasePacing`, a part of
:class:`vit_fast.bench.harness.Harness`)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Collection
from typing import Any

import torch

from vit_fast.util.dtypes import DTYPES
from vit_fast.util.interrupts import held
from vit_fast.util.progress import LONG_CPU_GFLOP, about, duration, long_cpu_note
from vit_fast.util.progress import bar as progress_bar

from .settings import BenchSettings
from .timing import Sampling


def bench_input(cfg: Any, batch: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    """The images a benchmark times: ``[batch, in_chans, H, W]`` standard normal, the same for a given ``seed`` and
    ``batch`` on every backend."""
    h, w = cfg.img_hw
    gen = torch.Generator().manual_seed(seed * 100003 + batch)
    return torch.randn(batch, cfg.in_chans, h, w, generator=gen).to(dtype).to(device)


def case_line(row: dict[str, Any], index: int, total: int) -> str:
    """The line printed as a case finishes: ``[bench] 3/12 fp32 torch batch 8: median 12.300 ms (p10 12.100, p90
    13.000; n 100), 650.4 img/s, err 0``, or its status and reason."""
    head = f"[bench] {index}/{total} {row['dtype']} {row['label']} batch {row['batch']}"
    if row.get("status") != "ok":
        why = " ".join(str(row.get("reason") or row.get("error") or "").split())
        return f"{head}: {row.get('status')}" + (f": {why[:160]}" if why else "")
    err = row.get("max_abs_err_vs_torch")
    return (
        f"{head}: median {row['median_ms']:.3f} ms (p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}; n {row['n']}), "
        f"{row['images_per_s']:.1f} img/s" + (f", err {err:.2g}" if err is not None else "")
    )


class CasePacing:
    """The harness's bookkeeping of its cases (the attributes below are set by :class:`Harness`)."""

    s: BenchSettings
    log: Callable[[str], None]
    on_case: Callable[[dict[str, Any]], None]
    partial_report: Callable[[list[dict[str, Any]]], dict[str, Any]]
    bar: Any
    cases: list[tuple[str, str, int]]
    sampling: Sampling
    batches: list[int]
    dtypes: list[str]
    device: torch.device
    _rates: dict[str, float]
    _flops: float

    def start_cases(self, flops_per_image: int | None, skipped: Collection[int] = ()) -> None:
        """Open the progress bar over the cases of ``self.cases``, each with its expected cost for the time left
        (``skipped``: the indices of those that will not run)."""
        self._flops = flops_per_image or 1  # an artifact without metadata: its batch size stands for its work
        costs = [self._expected_cost(d, label, b) for d, label, b in self.cases]
        self.bar = progress_bar(len(self.cases), "bench", self.s.progress, costs=costs)
        for j in skipped:
            self.bar.remaining.skip(j)

    def _expected_cost(self, dtype_name: str, label: str, batch: int) -> float:
        """FLOPs x calls of one case: the calls the sampling rule makes at the time per call the cases timed so
        far predict (the same backend's in that dtype, else the dtype's, else the last one timed), the warm-up and
        the checked call included; before any case is timed, the minimum number of samples."""
        flops = float(self._flops) * batch
        rates = self._rates
        rate = rates.get(f"{dtype_name} {label}") or rates.get(dtype_name) or rates.get("")
        if rate:
            timed = self.sampling.expected_calls(rate * flops)
        else:
            timed = min(self.sampling.min_samples, self.sampling.max_samples)
        return flops * (self.sampling.warmup + 1 + timed)

    def _expect_the_rest(self) -> None:
        remaining = self.bar.remaining
        for j, (d, label, b) in enumerate(self.cases):
            if not remaining.settled(j):
                remaining.expect(j, self._expected_cost(d, label, b))

    def _predicted_seconds(self, per_call_s: float) -> float:
        return per_call_s * (self.sampling.warmup + 1 + self.sampling.expected_calls(per_call_s))

    def case_done(self, rows: list[dict[str, Any]], row: dict[str, Any], seconds: float) -> None:
        """Record the finished case ``row`` (it took ``seconds``): into ``rows``, the time left, a printed line, and
        the report so far handed to ``on_case`` (all under held signals: an interrupt never splits them)."""
        index = len(rows)
        remaining = self.bar.remaining
        with held():
            rows.append(row)
            if row.get("status") == "ok":
                flops = float(self._flops) * row["batch"]
                rate = row["median_ms"] * 1e-3 / flops
                self._rates.update({f"{row['dtype']} {row['label']}": rate, row["dtype"]: rate, "": rate})
                cost = flops * (self.sampling.warmup + 1 + row["n"])
                remaining.finished(index, seconds=seconds, cost=cost)
                self._expect_the_rest()
            else:
                remaining.skip(index)
            self.bar.write(case_line(row, index + 1, len(self.cases)))
            self.bar.update(1)
            self.on_case(self.partial_report(rows))

    def _cpu_note(self, base: Any, flops_per_image: int, skipped: Collection[int]) -> None:
        """On a CPU, before GPU-sized work: what it is, how long it should take (from one forward at batch 1 timed
        here in each dtype, which also seeds the estimate of the time left) and the smaller command, with its time.
        """
        runs = [(d, b) for j, (d, _, b) in enumerate(self.cases) if j not in skipped]
        calls = self.sampling.warmup + self.sampling.floor  # the fewest calls a case makes
        refs = sum(self.batches) * sum(1 if d == "fp32" else 2 for d in self.dtypes)  # reference passes, in images
        gflop = flops_per_image * (calls * sum(b for _, b in runs) + refs) / 1e9
        if gflop < LONG_CPU_GFLOP:
            return
        per_image = {d: self._time_one_image(base, d) for d in dict.fromkeys(["fp32", *self.dtypes])}
        self._rates.update({d: t / flops_per_image for d, t in per_image.items()})
        images = sum(self.batches)  # each dtype's reference outputs, and the fp32 ones for its error column
        total = sum(per_image[d] * images + (per_image["fp32"] * images if d != "fp32" else 0.0) for d in self.dtypes)
        total += sum(self._predicted_seconds(per_image[d] * b) for d, b in runs)
        small = sum(self._predicted_seconds(per_image[d]) for d in self.dtypes)
        cap = self.sampling.max_seconds
        left_out = len(self.cases) - len(runs)
        rates = ", ".join(f"{d} {flops_per_image / per_image[d] / 1e9:.1f}" for d in self.dtypes)
        sizes = f"{flops_per_image / 1e9:.1f} GFLOP an image"
        sizes += f", each timed for up to {duration(cap)} after its warm-up" if cap else ""
        sizes += f"; {left_out} more cannot run here" if left_out else ""
        what = f"{len(runs)} cases at batches {','.join(map(str, self.batches))} ({sizes})"
        expected = (
            f"expected {about(total)} from one batch-1 forward timed here in each dtype (GFLOP/s: "
            f"{rates}), builds and compilations not counted"
        )
        smaller = f"--batch 1 --backends torch: {about(small)}; or vit-fast bench default --out DIR"
        self.log(long_cpu_note(gflop, what, smaller, expected) or "")

    def _time_one_image(self, base: Any, dtype_name: str) -> float:
        """Seconds of one forward of ``base`` at batch 1 in ``dtype_name`` (the faster of two calls)."""
        model = base if dtype_name == "fp32" else copy.deepcopy(base).to(DTYPES[dtype_name])
        x = bench_input(base.cfg, 1, DTYPES[dtype_name], self.device, self.s.seed)
        times = []
        with torch.no_grad():
            for _ in range(2):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
        return min(times)
