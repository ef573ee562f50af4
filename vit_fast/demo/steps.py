"""The demo's steps, each composed from the library: held-out accuracy, triton on a GPU, the ONNX export
verified on ONNX Runtime, CPU timings, a CUDA graph's replay, ViT-B/16 latency, the figures."""

from __future__ import annotations

import copy
import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vit_fast.backend.env import install_hint
from vit_fast.backend.graphs import CUDAGraphRunner
from vit_fast.bench import summarize, time_callable
from vit_fast.bench.settings import cpu_threads_for_load
from vit_fast.export import VerifyOptions, to_onnx, verify
from vit_fast.export.runners import OrtRunner
from vit_fast.interop.loading import load_model
from vit_fast.util.dtypes import dtype_name, native_dtype
from vit_fast.util.files import read_json
from vit_fast.util.numerics import FLOOR, max_err, scale_of
from vit_fast.util.progress import Stages, plural

from . import plots
from .base import step_record, verified_step
from .settings import ONNX_NAME, ONNX_REPORT, DemoSettings

#: held-out accuracy must reproduce the recorded value within this many percentage points
ACCURACY_TOLERANCE_PP = 0.5


def accuracy_step(
    model: Any, images: torch.Tensor, labels: torch.Tensor, recorded: float
) -> tuple[dict[str, Any], torch.Tensor]:
    """The step, and the predicted labels ``[N]`` it counted (confusion.png is drawn from them)."""
    t = time.perf_counter()
    with torch.no_grad():
        predictions = model(images).argmax(-1)
    acc = (predictions == labels).double().mean().item()
    delta_pp = 100 * (acc - recorded)
    summary = (
        f"torch backend: {acc:.2%} on {len(labels)} held-out images (recorded {recorded:.2%}, "
        f"delta {round(delta_pp, 2) + 0.0:+.2f} pp)"
    )
    step = step_record(
        "accuracy",
        abs(delta_pp) <= ACCURACY_TOLERANCE_PP,
        summary,
        accuracy=acc,
        recorded_accuracy=recorded,
        delta_pp=delta_pp,
        images=len(labels),
        seconds=time.perf_counter() - t,
    )
    return step, predictions


def triton_on_gpu(model: Any, images: torch.Tensor, labels: torch.Tensor, seed: int) -> dict[str, Any]:
    """The triton step on a GPU: the compiled kernels verified against eager PyTorch on the labelled images."""
    report = verify(model, "triton", data=(images, labels), seed=seed, print_table=False, raise_on_failure=False)
    head = f"compiled on {torch.cuda.get_device_name()}, {len(labels)} images: "
    return verified_step("triton", report.to_dict(), head, mode="compiled")


def onnx_step(model: Any, images: torch.Tensor, labels: torch.Tensor, s: DemoSettings, stages: Stages) -> dict:
    """The ONNX step: the model exported and verified against eager PyTorch (skipped without onnx/onnxruntime)."""
    for module in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(module) is None:
            return step_record("onnx", "skipped", f"{module} is not installed: {install_hint('onnx')}")
    # the dynamo exporter warns that torchvision's detection ops are not registered: noise for a ViT
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    t = time.perf_counter()
    # verified in its staging folder with the labelled held-out set, published only when it passed, with the
    # record in its metadata and the full report beside it (a failure raises: the step fails, nothing appears)
    options = VerifyOptions(data=(images, labels), seed=s.seed, print_table=False)
    path = to_onnx(
        model, Path(s.out) / ONNX_NAME, batch=(1, len(images)), opset=s.opset, exporter=s.exporter,
        source="default", progress=False, verify=options, report=Path(s.out) / ONNX_REPORT,
        overwrite=s.overwrite,
    )  # fmt: skip
    export_s = time.perf_counter() - t  # the export and its verification
    stages.note(f"  exported and verified {path.name} ({path.stat().st_size / 1e6:.2f} MB) in {export_s:.1f} s")
    report = read_json(Path(s.out) / ONNX_REPORT, "the export's report")
    accuracy = report["accuracy"]
    delta_pp = 100 * (accuracy["artifact_accuracy"] - accuracy["eager_accuracy"])
    head = (
        f"{s.exporter}, opset {s.opset}: accuracy {accuracy['artifact_accuracy']:.2%} "
        f"(delta {round(delta_pp, 2) + 0.0:+.2f} pp), "
    )
    worst = max(r["max_abs_err"] / r["bound"] if r["bound"] > 0 else float("inf") for r in report["rows"])
    extra = dict(artifact=str(path), exporter=s.exporter, opset=s.opset, export_s=export_s, accuracy_delta_pp=delta_pp)
    return verified_step("onnx", report, head, verify_worst_ratio=worst, **extra)


def timing_step(model: Any, images: torch.Tensor, onnx_path: Path | None, s: DemoSettings, stages: Stages) -> dict:
    """The timing step: eager PyTorch (and ONNX Runtime, given ``onnx_path``) timed on the same threads."""
    # torch and ONNX Runtime run on the same threads, chosen as the bench chooses them (the cores the load average
    # leaves free, or --threads): on a busy machine torch's default threads wait on each other and the ratio
    # would measure the load, not the runtimes
    threads, threads_note = (s.threads, "--threads") if s.threads else cpu_threads_for_load()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _timed(model, images, onnx_path, s, stages, threads, threads_note)
    finally:
        torch.set_num_threads(previous)


def _timed(
    model: Any,
    images: torch.Tensor,
    onnx_path: Path | None,
    s: DemoSettings,
    stages: Stages,
    threads: int,
    threads_note: str,
) -> dict:
    cpu = torch.device("cpu")
    stages.note(f"  torch and ONNX Runtime on {plural(threads, 'CPU thread')} each ({threads_note})")
    ort = OrtRunner(onnx_path, provider="CPUExecutionProvider", threads=threads) if onnx_path is not None else None
    cases, parts = {}, []
    for batch, iters in ((1, 4 * s.repeats), (len(images), s.repeats)):
        x = images[:batch].contiguous()
        with torch.inference_mode():
            row = {"torch": summarize(time_callable(lambda x=x: model(x), cpu, warmup=2, iters=iters))}
        if ort is not None:
            row["onnxruntime"] = summarize(time_callable(lambda x=x: ort.run(x), cpu, warmup=2, iters=iters))
        cases[str(batch)] = row
        stages.note(f"  batch {batch}: " + ", ".join(f"{k} {v['median_ms']:.2f} ms" for k, v in row.items()))
        t = row["torch"]["median_ms"]
        parts.append(f"b={batch}: torch {t:.2f} ms")
        if ort is not None:
            o = row["onnxruntime"]["median_ms"]
            parts[-1] += f", ORT {o:.2f} ms (torch/ORT {t / o:.2f}x)"
    note = "" if ort is not None else " (ONNX Runtime not timed: step 3 did not produce an artifact)"
    summary = f"CPU wall-clock, median, {plural(threads, 'thread')} each: " + "; ".join(parts) + note
    return step_record(
        "timing", "ok", summary, clock="CPU wall-clock", threads=threads, threads_note=threads_note, cases=cases
    )


def _median_ms(fn: Callable[[], Any], iters: int) -> float:
    """Median CUDA-event time of ``fn`` in ms, after 10 warm-up calls."""
    return summarize(time_callable(fn, torch.device("cuda"), warmup=10, iters=iters))["median_ms"]


def cuda_graph_step(model: Any, images: torch.Tensor) -> dict[str, Any]:
    """The CUDA-graph step: a graph replay of the triton model at batch 1, timed against the eager call, and checked
    to compute what it computed."""
    gpu = copy.deepcopy(model).cuda().set_backend("triton")
    x = images[:1].cuda()
    with torch.no_grad():
        eager = gpu(x)
        graph = CUDAGraphRunner(gpu, x)
        out = graph(x)
        eager_ms, graph_ms = _median_ms(lambda: gpu(x), 50), _median_ms(graph.replay, 50)
    diff = max_err(out, eager)
    return step_record(
        "cuda graph",
        diff <= FLOOR[torch.float32] * scale_of(eager),  # a replay computes what the eager call computed
        f"digits model, triton, batch 1: eager {eager_ms:.3f} ms, graph replay {graph_ms:.3f} ms "
        f"({eager_ms / graph_ms:.1f}x); max|graph - eager| {diff:.1e}",
        eager_ms=eager_ms,
        graph_ms=graph_ms,
        max_abs_diff=diff,
    )


def vit_b16_step(seed: int) -> dict[str, Any]:
    """The ViT-B/16 latency step on the current GPU: torch and triton backends at batches 1 and 32, CUDA events."""
    cuda = torch.device("cuda", torch.cuda.current_device())
    dtype = native_dtype(cuda)  # bf16 where the card has it, fp16 on one that would emulate bf16 (T4)
    model = load_model("vit_base_patch16_224", backend="torch", seed=seed).to(cuda, dtype).eval()
    gen = torch.Generator(device=cuda).manual_seed(seed)
    cases = {}
    with torch.no_grad():
        for batch in (1, 32):
            x = torch.randn(batch, 3, 224, 224, device=cuda, dtype=dtype, generator=gen)
            cases[str(batch)] = {}
            for backend in ("torch", "triton"):  # the backend is set outside the timed call
                model.set_backend(backend)
                cases[str(batch)][backend] = _median_ms(lambda x=x: model(x), 30)
    summary = f"{dtype_name(dtype)}, CUDA events, median: " + "; ".join(
        f"b={b}: torch {r['torch']:.3f} ms, triton {r['triton']:.3f} ms ({r['torch'] / r['triton']:.2f}x)"
        for b, r in cases.items()
    )
    name = torch.cuda.get_device_name(cuda)
    dtype_field = str(dtype).removeprefix("torch.")  # "bfloat16" / "float16"
    return step_record("vit-b/16 latency", "ok", summary, dtype=dtype_field, cases_ms=cases, device=name)


def figures_step(
    model: Any, images: torch.Tensor, labels: torch.Tensor, predictions: torch.Tensor, steps: list[dict], out: Path
) -> dict[str, Any]:
    """The four pictures, drawn from the steps' own numbers; ``figures`` holds each file and the data it shows."""
    t = time.perf_counter()
    by_name = {step["name"]: step for step in steps}
    accuracy, timing = by_name["accuracy"]["accuracy"], by_name["timing"]
    figures = plots.write_figures(out, model, images, labels, predictions, accuracy, timing)
    files = [f["file"] for f in figures.values() if f["file"]]
    summary = f"{', '.join(files)} in {out}"
    summary += "".join(f"; no {plots.FILES[n]}: {f['skipped']}" for n, f in figures.items() if not f["file"])
    return step_record("figures", "ok", summary, files=files, figures=figures, seconds=time.perf_counter() - t)
