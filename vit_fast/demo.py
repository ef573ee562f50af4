"""The demo's steps: the main job end to end on the embedded default model, composed from the library.

Each step is a dict ``{"name", "status": ok | failed | skipped, "summary", ...measured fields}``;
:func:`run_demo` runs them, writes ``report.json`` and ``report.md`` into the output folder and
returns the report. Nothing here measures or judges on its own: the model and data come from
vit_fast.assets, every comparison is vit_fast.export's ``verify`` (max |error| of its worst
random-input row against the numerics rule; top-1 agreement with eager on held-out images), the
ONNX file is ``to_onnx``'s, timings are the bench timer's, the environment is vit_fast.env's.

  1. accuracy   held-out accuracy with the torch backend, against the recorded value
  2. triton     ``verify(model, "triton")``: on a GPU directly (compiled, the whole held-out set);
                without one, ``vit-fast verify default triton`` in a child process started with
                TRITON_INTERPRET=1, on the first ``subset`` held-out images
  3. onnx       ``to_onnx``, then ``verify`` on ONNX Runtime, with the accuracy delta
  4. timing     eager torch vs ONNX Runtime, batch 1 and the whole held-out batch (CPU wall-clock)
  5. gpu        on a CUDA machine only: a CUDA-graph replay of the triton model, ViT-B/16 latency in the
                card's native dtype (bf16; fp16 where bf16 is emulated, as on the T4)
  6. figures    vit_fast.demo_plots draws patches.png, attention.png, confusion.png and timing.png from the
                numbers above (and the class token's attention, recomputed on the torch backend); report.md
                shows them. Skipped, with a one-line note, under --no-plots or without matplotlib.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import os
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from . import demo_plots, interrupts, runtime
from .assets import default_model_info, load_default_eval_set, load_default_model
from .bench import summarize, time_callable
from .bench.settings import cpu_threads_for_load
from .children import guarded_python
from .demo_settings import ONNX_NAME, ONNX_REPORT, DemoSettings
from .dtypes import dtype_name, native_dtype
from .env import collect_environment, install_hint, module_version
from .export import VerifyOptions, is_vit_fast_artifact, to_onnx, verify
from .export.runners import OrtRunner
from .files import check_files_in, json_text, make_folders, read_json, seal_markdown, temp_staging, write_atomic
from .graphs import CUDAGraphRunner
from .loading import load_model
from .numerics import FLOOR, max_err, scale_of
from .progress import Stages, plural

#: held-out accuracy must reproduce the recorded value within this many percentage points
ACCURACY_TOLERANCE_PP = 0.5
#: the random-input batches the interpreter child verifies beside the held-out subset (small: it is slow)
INTERPRETER_BATCHES = "1,3"
STEPS = 6


def _step(name: str, status: str | bool, summary: str, **fields: Any) -> dict[str, Any]:
    """One step's record; ``status`` True / False stands for "ok" / "failed"."""
    if not isinstance(status, str):
        status = "ok" if status else "failed"
    return {"name": name, "status": status, "summary": summary, **fields}


def _guarded(name: str, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run a step; an exception becomes a failed step naming it (never a made-up number)."""
    try:
        return fn(*args)
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0]
        return _step(name, False, f"{type(err).__name__}: {first}".rstrip(": "), traceback=traceback.format_exc())


def _verified(name: str, report: dict[str, Any], head: str, **fields: Any) -> dict[str, Any]:
    """A step from a verify report (``VerifyReport.to_dict()``): ok when every random-input row is within the
    rule and top-1 agrees with eager on every labelled image. Reports the worst row and the labelled figures."""
    worst = max(report["rows"], key=lambda r: r["max_abs_err"] / r["bound"] if r["bound"] > 0 else float("inf"))
    labelled = report["accuracy"]
    agreement = labelled["top1_agreement"]
    summary = (
        f"{head}max|err| {worst['max_abs_err']:.2e} (torch {worst['eager_max_abs_err']:.2e}, bound "
        f"{worst['bound']:.2e}), top-1 agreement {agreement:.0%}; verify {'PASSED' if report['passed'] else 'FAILED'}"
    )
    numbers = {k: worst[k] for k in ("max_abs_err", "eager_max_abs_err", "bound")}
    return _step(
        name,
        report["passed"] and agreement == 1.0,
        summary,
        images=labelled["n"],
        accuracy=labelled["artifact_accuracy"],
        eager_accuracy=labelled["eager_accuracy"],
        top1_agreement=agreement,
        batches=sorted({r["batch"] for r in report["rows"]}),
        verify_passed=report["passed"],
        runtime=report["runtime"],
        **numbers,
        **fields,
    )


class _InterpreterVerify:
    """The triton step on a CPU: ``vit-fast verify default triton`` in a child process with TRITON_INTERPRET=1,
    so that the variable is set before triton is first imported whatever this process imported already, a
    crash or hang in the interpreter cannot take the demo down, and it runs while this process exports.

    The child dies with the demo, even by SIGKILL (:func:`vit_fast.children.guarded_python`), and removes the
    demo's temporary folder then (a staging folder in ``$TMPDIR``: :func:`vit_fast.files.temp_staging`); the log
    is an unnamed file (nothing to leave behind)."""

    def __init__(self, images: int, seed: int, timeout: float) -> None:
        self.images, self.timeout = images, timeout
        self.scope = contextlib.ExitStack()
        self.tmp = self.scope.enter_context(temp_staging("vit-fast-demo"))
        self.json = self.tmp / "triton.json"
        self.log = self.scope.enter_context(tempfile.TemporaryFile("w+"))
        cmd = guarded_python(["vit_fast", "verify", "default", "triton", "--limit", str(images)], cleanup=self.tmp)
        cmd += ["--batch", INTERPRETER_BATCHES, "--seed", str(seed), "--json", str(self.json)]
        # one thread, so the export running beside it keeps its cores; no GPU, so the kernels run interpreted
        env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        self.started = time.perf_counter()
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        except BaseException:
            self.scope.close()
            raise

    def collect(self) -> dict[str, Any]:
        """The triton step, once the child has ended (at most ``timeout`` seconds after its start)."""
        try:
            self.proc.wait(timeout=max(1.0, self.timeout - (time.perf_counter() - self.started)))
        except subprocess.TimeoutExpired:
            why = f"the run on {self.images} images took longer than {self.timeout:g} s"
            return _step("triton", False, f"interpreter: {why} (lower --subset or raise --triton-timeout)")
        wall = time.perf_counter() - self.started
        report = read_json(self.json, "the interpreter run's report") if self.json.is_file() else None
        if report is None or report.get("complete") is False:  # it could not run (or finish): its last line says why
            self.log.seek(0)
            last = (self.log.read().strip().splitlines() or ["no output"])[-1]
            return _step("triton", False, f"interpreter: vit-fast verify exited {self.proc.returncode}: {last}")
        head = f"interpreter, {report['accuracy']['n']} images: "
        version = module_version("triton")
        return _verified("triton", report, head, mode="interpreter", wall_s=wall, triton_version=version)

    def close(self) -> None:
        """Stop the child if it still runs (the demo ended before collecting it); remove its files."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.scope.close()


# --------------------------------------------------------------------------- the steps
def _accuracy_step(
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
    step = _step(
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


def _triton_on_gpu(model: Any, images: torch.Tensor, labels: torch.Tensor, seed: int) -> dict[str, Any]:
    report = verify(model, "triton", data=(images, labels), seed=seed, print_table=False, raise_on_failure=False)
    head = f"compiled on {torch.cuda.get_device_name()}, {len(labels)} images: "
    return _verified("triton", report.to_dict(), head, mode="compiled")


def _onnx_step(model: Any, images: torch.Tensor, labels: torch.Tensor, s: DemoSettings, stages: Stages) -> dict:
    for module in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(module) is None:
            return _step("onnx", "skipped", f"{module} is not installed: {install_hint('onnx')}")
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
    return _verified("onnx", report, head, verify_worst_ratio=worst, **extra)


def _timing_step(model: Any, images: torch.Tensor, onnx_path: Path | None, s: DemoSettings, stages: Stages) -> dict:
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
    return _step(
        "timing", "ok", summary, clock="CPU wall-clock", threads=threads, threads_note=threads_note, cases=cases
    )


def _median_ms(fn: Callable[[], Any], iters: int) -> float:
    """Median CUDA-event time of ``fn`` in ms, after 10 warm-up calls."""
    return summarize(time_callable(fn, torch.device("cuda"), warmup=10, iters=iters))["median_ms"]


def _cuda_graph_step(model: Any, images: torch.Tensor) -> dict[str, Any]:
    gpu = copy.deepcopy(model).cuda().set_backend("triton")
    x = images[:1].cuda()
    with torch.no_grad():
        eager = gpu(x)
        graph = CUDAGraphRunner(gpu, x)
        out = graph(x)
        eager_ms, graph_ms = _median_ms(lambda: gpu(x), 50), _median_ms(graph.replay, 50)
    diff = max_err(out, eager)
    return _step(
        "cuda graph",
        diff <= FLOOR[torch.float32] * scale_of(eager),  # a replay computes what the eager call computed
        f"digits model, triton, batch 1: eager {eager_ms:.3f} ms, graph replay {graph_ms:.3f} ms "
        f"({eager_ms / graph_ms:.1f}x); max|graph - eager| {diff:.1e}",
        eager_ms=eager_ms,
        graph_ms=graph_ms,
        max_abs_diff=diff,
    )


def _vit_b16_step(seed: int) -> dict[str, Any]:
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
    return _step("vit-b/16 latency", "ok", summary, dtype=dtype_field, cases_ms=cases, device=name)


def _figures_step(
    model: Any, images: torch.Tensor, labels: torch.Tensor, predictions: torch.Tensor, steps: list[dict], out: Path
) -> dict[str, Any]:
    """The four pictures, drawn from the steps' own numbers; ``figures`` holds each file and the data it shows."""
    t = time.perf_counter()
    by_name = {step["name"]: step for step in steps}
    accuracy, timing = by_name["accuracy"]["accuracy"], by_name["timing"]
    figures = demo_plots.write_figures(out, model, images, labels, predictions, accuracy, timing)
    files = [f["file"] for f in figures.values() if f["file"]]
    summary = f"{', '.join(files)} in {out}"
    summary += "".join(f"; no {demo_plots.FILES[n]}: {f['skipped']}" for n, f in figures.items() if not f["file"])
    return _step("figures", "ok", summary, files=files, figures=figures, seconds=time.perf_counter() - t)


# --------------------------------------------------------------------------- report
def format_table(steps: list[dict[str, Any]]) -> str:
    """The summary table the CLI prints: one line per step."""
    width = max(len(s["name"]) for s in steps)
    head = f"{'step':<{width}}  {'status':<7}  result"
    lines = [head, "-" * max(len(head), 100)]
    lines += [f"{s['name']:<{width}}  {s['status']:<7}  {s['summary']}" for s in steps]
    return "\n".join(lines)


def _verdict(report: dict[str, Any]) -> str:
    verdict = "FAILED" if report["failed"] else "OK"
    if report.get("complete", True):
        return verdict
    ran = f"{len(report['steps'])} steps so far"
    return f"INCOMPLETE ({report['interrupted'] or ran}; {verdict.lower()} so far)"


def _markdown(report: dict[str, Any]) -> str:
    env, model = report["environment"], report["model"]
    gpu = env["device_name"] if env["device"].startswith("cuda") else "no GPU"
    lines = [
        "# vit-fast demo",
        "",
        f"{report['created']} · vit-fast {report['vit_fast_version']} · torch {env['torch']} · "
        f"triton {env['triton']} · onnxruntime {env['onnxruntime']} · {gpu} · "
        f"{plural(env['torch_threads'], 'CPU thread')}",
        "",
        f"Model: `{model['name']}` ({model['num_params']:,} parameters, {model['tokens']} tokens); "
        f"held-out set: {model['heldout_size']} images.",
        "",
        "| step | status | result |",
        "|---|---|---|",
    ]
    lines += [f"| {s['name']} | {s['status']} | {s['summary'].replace('|', chr(92) + '|')} |" for s in report["steps"]]
    lines += [
        "",
        f"**{_verdict(report)}** (exit code {report['exit_code']}), "
        f"{report['wall_s']:.1f} s. Timings in the timing step are CPU wall-clock.",
        "",
    ]
    figures = next((s.get("figures", {}) for s in report["steps"] if s["name"] == "figures"), {})
    drawn = [(name, f["file"]) for name, f in figures.items() if f["file"]]
    if drawn:
        lines += ["## Figures", ""]
        for name, file in drawn:
            lines += [f"### {name}", "", demo_plots.CAPTIONS[name], "", f"![{name}]({file})", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the run
@interrupts.handled()
def run_demo(s: DemoSettings) -> dict[str, Any]:
    """Run every step, write ``report.json`` and ``report.md`` into ``s.out``; returns the report.

    ``report["exit_code"]`` is 0 when no step failed, else 1. Raises (before any step) when the
    embedded model or its data cannot be loaded (scikit-learn missing: ImportError) or when
    ``s.device`` is ``"cuda"`` and no GPU is visible. The two files are rewritten as each step ends
    (``complete: false``); Ctrl-C or SIGTERM writes them once more with the steps that ended and
    ``interrupted`` saying so, then lets the interrupt go on.
    """
    start = time.perf_counter()
    stages = Stages("vit-fast demo")
    if s.threads:
        torch.set_num_threads(s.threads)
    cuda = torch.cuda.is_available()
    if s.device == "cuda" and not cuda:
        raise ValueError("device 'cuda' asked for, but no CUDA GPU is visible to torch: use cpu or auto")
    use_gpu = cuda and s.device != "cpu"
    out_dir = Path(s.out)
    check_demo_outputs(out_dir, s.overwrite)
    make_folders(out_dir, "demo --out")

    stages.note(f"1/{STEPS} loading the embedded model and the held-out digits")
    model = load_default_model(backend="torch")
    images, labels = load_default_eval_set()
    info = default_model_info()
    no_triton = "the 'triton' package is not installed (Linux: pip install triton)"
    triton_skip = "--skip-triton" if s.skip_triton else (None if runtime.triton_importable() else no_triton)
    child = None
    steps: list[dict[str, Any]] = []

    def save(complete: bool = False, interrupted: str | None = None) -> dict[str, Any]:
        """The report of the steps so far, written (the files change together: signals held)."""
        report = _report(s, start, use_gpu, info, model, len(labels), steps, complete, interrupted)
        with interrupts.held():
            write_atomic(out_dir / "report.json", json_text(report, sort_keys=False))
            write_atomic(out_dir / "report.md", seal_markdown(_markdown(report), report["vit_fast_version"]))
        return report

    try:
        save()  # from here on the files are this run's: "in progress", then each step as it ends
        accuracy, predictions = _accuracy_step(model, images, labels, float(info["heldout_accuracy"]))
        steps.append(accuracy)
        save()
        stages.note(f"  {steps[0]['summary']}")
        triton = None
        if triton_skip is not None:
            triton = _step("triton", "skipped", triton_skip)
            stages.note(f"2/{STEPS} triton: skipped ({triton_skip})")
        elif use_gpu:
            stages.note(f"2/{STEPS} triton backend, compiled on the GPU")
            triton = _guarded("triton", _triton_on_gpu, model, images, labels, s.seed)
            stages.note(f"  {triton['summary']}")
        else:  # the slow interpreter run starts now, in a child process, and overlaps step 3
            n = min(s.subset, len(labels))
            stages.note(
                f"2/{STEPS} triton: `vit-fast verify default triton` on {n} images, started in a child process "
                "(it runs beside step 3; its result follows step 3)"
            )
            child = _InterpreterVerify(n, s.seed, s.triton_timeout)
        if s.skip_onnx:
            onnx = _step("onnx", "skipped", "--skip-onnx")
            stages.note(f"3/{STEPS} ONNX: skipped (--skip-onnx)")
        else:
            stages.note(f"3/{STEPS} exporting to ONNX ({s.exporter}, opset {s.opset}), verifying on ONNX Runtime")
            onnx = _guarded("onnx", _onnx_step, model, images, labels, s, stages)
            stages.note(f"  {onnx['summary']}")
        if child is not None:
            stages.note("  (step 2) waiting for the triton interpreter child process")
            triton = _guarded("triton", child.collect)
            stages.note(f"  {triton['summary']}")
        steps += [triton, onnx]
        save()
        if s.skip_timing:
            steps.append(_step("timing", "skipped", "--skip-timing"))
            stages.note(f"4/{STEPS} timing: skipped (--skip-timing)")
        else:
            stages.note(f"4/{STEPS} timing eager torch vs ONNX Runtime (CPU wall-clock, the same threads)")
            onnx_path = Path(onnx["artifact"]) if onnx["status"] == "ok" else None
            steps.append(_guarded("timing", _timing_step, model, images, onnx_path, s, stages))
            save()
        if use_gpu:
            stages.note(f"5/{STEPS} GPU: CUDA graph and ViT-B/16 latency")
            steps.append(_guarded("cuda graph", _cuda_graph_step, model, images))
            save()
            steps.append(_guarded("vit-b/16 latency", _vit_b16_step, s.seed))
        else:
            why = "--device cpu" if cuda else "no CUDA GPU visible"
            steps += [_step("cuda graph", "skipped", why), _step("vit-b/16 latency", "skipped", why)]
            stages.note(f"5/{STEPS} GPU: skipped ({why})")
        missing = "--no-plots" if s.no_plots else demo_plots.matplotlib_missing()
        if missing is not None:
            steps.append(_step("figures", "skipped", missing))
            stages.note(f"6/{STEPS} figures: skipped")
        else:
            stages.note(f"6/{STEPS} drawing the figures (patches, attention, confusion, timing)")
            steps.append(_guarded("figures", _figures_step, model, images, labels, predictions, steps, out_dir))
        stages.note(f"  {steps[-1]['summary']}")
    except interrupts.INTERRUPTS as err:
        note = interrupts.cut_note(err, len(steps), None, "step")
        save(interrupted=note)
        stages.note(f"{note}: {out_dir / 'report.json'} and {out_dir / 'report.md'} keep them")
        raise
    finally:
        if child is not None:
            child.close()
    return save(complete=True)


def _report(
    s: DemoSettings,
    start: float,
    use_gpu: bool,
    info: dict[str, Any],
    model: Any,
    heldout_size: int,
    steps: list[dict[str, Any]],
    complete: bool,
    interrupted: str | None,
) -> dict[str, Any]:
    """The demo's report: its steps so far, the verdict and the exit code (None until it is complete)."""
    failed = [step["name"] for step in steps if step["status"] == "failed"]
    env = collect_environment(torch.device("cuda" if use_gpu else "cpu"))
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "vit_fast_version": env["vit_fast"],
        "environment": env,
        "model": {
            "name": info.get("name", "digits_vit"),
            "config": model.cfg.to_dict(),
            "tokens": model.cfg.num_tokens,
            "num_params": sum(p.numel() for p in model.parameters()),
            "recorded_heldout_accuracy": float(info["heldout_accuracy"]),
            "heldout_size": heldout_size,
        },
        "args": asdict(s),
        "complete": complete,
        "interrupted": interrupted,
        "steps": list(steps),
        "failed": failed,
        "ok": complete and not failed,
        "exit_code": (1 if failed else 0) if complete else None,
        "wall_s": time.perf_counter() - start,
    }


#: every file the demo writes into its --out folder
OUTPUT_FILES = ("report.json", "report.md", ONNX_NAME, ONNX_NAME + ".json", ONNX_REPORT, *demo_plots.FILES.values())


def check_demo_outputs(out_dir: Path, overwrite: bool = False) -> None:
    """Before any step: none of the demo's files in ``out_dir`` is a FIFO, device or folder, and each one that
    exists proves vit-fast wrote it (its own marker), unless ``overwrite``. A ValueError names the file and the fix."""
    check_files_in(out_dir, OUTPUT_FILES, "demo --out", overwrite=overwrite, ours={ONNX_NAME: is_vit_fast_artifact})
