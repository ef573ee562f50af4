"""The benchmark harness behind ``vit-fast bench``: every backend timed side by side, in one process, on the same
inputs, each output checked against the eager torch backend's; or an existing ONNX file or TensorRT engine timed
by its own runtime. ``benchmark(...)`` returns a :class:`BenchResult` and writes nothing; ``run_benchmark`` is the
command line's run, which writes its files. Which module holds each job: docs/benchmarks.md.
"""

from __future__ import annotations

from .api import benchmark, run_benchmark
from .backends import Variant, plan_variants
from .ceilings import floor_ms, measure_bandwidth, measure_matrix_rate
from .harness import Harness
from .report import BenchResult, add_ratios, csv_report, markdown_report, plot_report, write_reports
from .settings import (
    BACKENDS,
    SAMPLING_DEFAULTS,
    BenchError,
    BenchSettings,
    parse_backends,
    parse_batches,
    parse_dtypes,
    resolve_device,
)
from .timing import L2Flusher, Sampling, sample, summarize, time_callable

__all__ = [
    "BACKENDS",
    "SAMPLING_DEFAULTS",
    "BenchError",
    "BenchResult",
    "BenchSettings",
    "Harness",
    "L2Flusher",
    "Sampling",
    "Variant",
    "add_ratios",
    "benchmark",
    "csv_report",
    "floor_ms",
    "markdown_report",
    "measure_bandwidth",
    "measure_matrix_rate",
    "parse_backends",
    "parse_batches",
    "parse_dtypes",
    "plan_variants",
    "plot_report",
    "resolve_device",
    "run_benchmark",
    "sample",
    "summarize",
    "time_callable",
    "write_reports",
]
