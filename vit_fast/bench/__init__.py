"""The benchmark harness behind ``vit-fast bench``: every backend timed side by side, in one process,
on the same inputs, each output checked against the eager torch backend's; or an existing ONNX file
or TensorRT engine timed by its own runtime.

From Python, ``benchmark(model, batch=..., dtypes=..., backends=...)`` returns a :class:`BenchResult`
(rows, Markdown, CSV) and writes nothing; ``run_benchmark(settings)`` is the command line's run, which
writes JSON, Markdown, CSV and PNG files that never replace an earlier run's unless asked.

One home per job: ``settings`` (the request, its defaults, parsers and checks), ``timing`` (how many
calls, each timed, many summarized), ``ceilings`` (measured bandwidth and matrix rate, the floor),
``backends`` (what is timed; ONNX Runtime and TensorRT through ``vit_fast.export.runners``), ``harness``
(the run), ``artifacts`` (an existing ONNX file or engine timed through the harness), ``api``
(``benchmark`` and ``run_benchmark``), ``report`` (ratios, JSON, Markdown, CSV, PNG). The environment
comes from ``vit_fast.env``, the progress bar from ``vit_fast.progress``, dtypes from ``vit_fast.dtypes``.
Nothing here touches a GPU at import time.
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
