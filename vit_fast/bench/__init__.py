"""The benchmark harness behind ``vit-fast bench``: every backend timed side by side, in one process,
on the same inputs, each output checked against the eager torch backend's.

One home per job: ``settings`` (the request, its parsers and checks), ``timing`` (one call timed,
many summarized), ``ceilings`` (measured bandwidth and matrix rate, the floor), ``backends`` (what
is timed; ONNX Runtime and TensorRT through ``vit_fast.export.runners``), ``harness`` (the run),
``report`` (ratios, JSON, Markdown, PNG). The environment comes from ``vit_fast.env``, the progress
bar from ``vit_fast.progress``, dtypes from ``vit_fast.dtypes``. Nothing here touches a GPU at
import time.
"""

from __future__ import annotations

from .backends import Variant, plan_variants
from .ceilings import floor_ms, measure_bandwidth, measure_matrix_rate
from .harness import Harness, run_benchmark
from .report import add_ratios, markdown_report, plot_report, write_reports
from .settings import (
    BACKENDS,
    BenchError,
    BenchSettings,
    parse_backends,
    parse_batches,
    parse_dtypes,
    resolve_device,
)
from .timing import L2Flusher, summarize, time_callable

__all__ = [
    "BACKENDS",
    "BenchError",
    "BenchSettings",
    "Harness",
    "L2Flusher",
    "Variant",
    "add_ratios",
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
    "summarize",
    "time_callable",
    "write_reports",
]
