"""The two ways to run the benchmark from code: :func:`benchmark` (Python: arguments in, a
:class:`BenchResult` out, nothing written) and :func:`run_benchmark` (the command line's run: settings in,
JSON / Markdown / CSV / PNG reports written into ``settings.out_dir``, the first three rewritten as each case
ends, so an interrupt keeps the finished cases). Both run a
:class:`vit_fast.bench.harness.Harness` and restore torch's thread count afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .harness import Harness, model_label
from .report import BenchResult, free_stem, model_slug, write_reports
from .settings import BenchError, BenchSettings


def report_stem(model: Any, name: str | None = None) -> str:
    """``bench_<model>``: the one file-name stem of every bench report, whichever way it was started (the command
    line, ``run_benchmark``, ``BenchResult.write``): ``name`` (the model as the user named it) when given, else the
    model spec, else the module's description."""
    if name is None:
        name = str(model) if isinstance(model, (str, Path)) else model_label(model)
    return f"bench_{model_slug(str(name))}"


def _run(settings: BenchSettings, log: Callable[[str], None] | None) -> dict[str, Any]:
    threads = torch.get_num_threads()
    try:
        return Harness(settings, log=log).run()
    finally:
        torch.set_num_threads(threads)  # --threads is for this run only


def run_benchmark(
    settings: BenchSettings, log: Callable[[str], None] | None = None, name: str | None = None
) -> tuple[dict[str, Any], dict]:
    """Run the benchmark and write its reports (``bench_<model>.{json,md,csv,png}``) into ``settings.out_dir``,
    checked before anything runs; returns (report, paths). The files are rewritten after each case; Ctrl-C or SIGTERM
    writes them once more with the cases that finished (if any), then goes on with ``bench_report`` and
    ``bench_paths`` set on the exception. In detail: docs/benchmarks.md, section "From Python"."""
    from vit_fast.util import interrupts
    from vit_fast.util.files import check_output_dir

    if settings.out_dir is None:
        raise BenchError("run_benchmark writes reports: give out_dir (or call vit_fast.bench.benchmark)")
    try:
        check_output_dir(settings.out_dir, "bench output folder")
    except ValueError as err:
        raise BenchError(str(err)) from None
    log = log or (lambda msg: None)
    latest: dict[str, Any] = {}
    threads = torch.get_num_threads()
    try:
        with interrupts.handled():
            harness = Harness(settings, log=log)
            # the stem is taken once, before any work: every rewrite of the run replaces this run's own files
            out_dir = Path(settings.out_dir)
            run_id = harness.started.strftime("%Y%m%dT%H%M%SZ")
            stem = free_stem(out_dir, report_stem(settings.model, name), run_id, settings.overwrite)

            def write(report: dict[str, Any], png: bool = False) -> dict[str, Path]:
                with interrupts.held():
                    latest.update(report=report, paths=write_reports(report, out_dir, stem, overwrite=True, png=png))
                return latest["paths"]

            harness.on_case = write
            try:
                report = harness.run()
            except interrupts.INTERRUPTS as err:
                _keep_partial(err, latest.get("report"), write, log)
                raise
            try:
                paths = write(report, png=True)
            except interrupts.INTERRUPTS as err:  # it came while the files were written: they are whole
                err.bench_report, err.bench_paths = report, latest.get("paths") or {}
                raise
    finally:
        torch.set_num_threads(threads)  # --threads is for this run only
    return report, paths


def _keep_partial(
    err: BaseException, partial: dict[str, Any] | None, write: Callable[..., dict], log: Callable[[str], None]
) -> None:
    """The report of the cases that finished before ``err`` (an interrupt), written once more saying so (the
    picture too), and set on ``err`` as ``bench_report`` / ``bench_paths``."""
    from vit_fast.util import interrupts

    paths: dict[str, Path] = {}
    if partial is not None:
        partial["interrupted"] = interrupts.cut_note(err, partial["cases"]["done"], partial["cases"]["total"], "case")
        paths = write(partial, png=True)
        log(f"{partial['interrupted']}: the report files keep the cases that finished")
    else:
        log(f"interrupted by {interrupts.signal_name(err)} before any case finished: no report written")
    err.bench_report, err.bench_paths = partial, paths


def benchmark(
    model: Any,
    batch: int | Sequence[int] | None = None,
    dtypes: str | Sequence[str] | None = None,
    backends: str | Sequence[str] | None = None,
    device: str = "auto",
    *,
    threads: int | None = None,
    min_samples: int | None = None,
    min_time_s: float | None = None,
    max_samples: int | None = None,
    max_seconds: float | None = None,
    warmup: int | None = None,
    seed: int = 0,
    graph: bool = False,
    h2d: bool = False,
    flush_l2: bool = False,
    ceilings: bool = True,
    onnx_exporter: str = "dynamo",
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    tune: bool = False,
) -> BenchResult:
    """Time ``model`` (a model name, a ``VisionTransformer`` or the Hugging Face drop-in, or an ``.onnx`` / ``.plan``
    path) from Python; nothing is written (``result.write(folder)`` does). ``batch``, ``dtypes``, ``backends``: one
    value, a sequence or a comma list (``"all"``: every backend); None takes the device's defaults. Returns a
    :class:`BenchResult` (``.rows``, ``.report``, ``.markdown()``, ``.csv()``, ``.write(folder)``). The sampling
    arguments, their defaults and ``threads`` / ``tune``: docs/benchmarks.md, section "From Python"."""
    from .settings import parse_backends, parse_batches, parse_dtypes

    def listed(value: Any, parse: Callable[[str], list]) -> list | None:
        if value is None:
            return None
        if isinstance(value, (str, int)):
            return parse(str(value))
        return parse(",".join(str(v) for v in value))

    settings = BenchSettings(
        model=model,
        batches=listed(batch, parse_batches),
        dtypes=listed(dtypes, parse_dtypes),
        backends=listed(backends, parse_backends),
        device=device,
        warmup=warmup,
        iters=max_samples,
        max_seconds=max_seconds,
        min_samples=min_samples,
        min_time_s=min_time_s,
        flush_l2=flush_l2,
        h2d=h2d,
        graph=graph,
        onnx_exporter=onnx_exporter,
        seed=seed,
        progress=progress,
        measure_ceilings=ceilings,
        threads=threads,
        tune=tune,
    )
    return BenchResult(_run(settings, log))


__all__ = ["benchmark", "model_slug", "report_stem", "run_benchmark"]
