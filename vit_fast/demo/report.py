"""``run_demo``: every step in order, ``report.json`` and ``report.md`` rewritten as each ends (an interrupt keeps
the steps that ended), the table the command prints, and the check of the output folder before any step."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vit_fast.assets import default_model_info, load_default_eval_set
from vit_fast.backend import runtime
from vit_fast.backend.env import collect_environment
from vit_fast.export import is_vit_fast_artifact
from vit_fast.interop.loading import load_default_model
from vit_fast.util import interrupts
from vit_fast.util.files import check_files_in, json_text, make_folders, seal_markdown, write_atomic
from vit_fast.util.progress import Stages, plural

from . import plots
from .base import guarded_step, step_record
from .interpreter import InterpreterVerify
from .settings import ONNX_NAME, ONNX_REPORT, DemoSettings
from .steps import (
    accuracy_step,
    cuda_graph_step,
    figures_step,
    onnx_step,
    timing_step,
    triton_on_gpu,
    vit_b16_step,
)

STEPS = 6


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
            lines += [f"### {name}", "", plots.CAPTIONS[name], "", f"![{name}]({file})", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the run
@interrupts.handled()
def run_demo(s: DemoSettings) -> dict[str, Any]:
    """Run every step, write ``report.json`` and ``report.md`` into ``s.out``; returns the report, whose
    ``exit_code`` is 0 when no step failed, else 1. Raises (before any step) when the embedded model or its data
    cannot be loaded (scikit-learn missing: ImportError) or when ``s.device`` is ``"cuda"`` and no GPU is visible.
    The two files are rewritten as each step ends (``complete: false``); Ctrl-C or SIGTERM writes them once more
    with the steps that ended and ``interrupted`` saying so, then lets the interrupt go on."""
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
        accuracy, predictions = accuracy_step(model, images, labels, float(info["heldout_accuracy"]))
        steps.append(accuracy)
        save()
        stages.note(f"  {steps[0]['summary']}")
        triton = None
        if triton_skip is not None:
            triton = step_record("triton", "skipped", triton_skip)
            stages.note(f"2/{STEPS} triton: skipped ({triton_skip})")
        elif use_gpu:
            stages.note(f"2/{STEPS} triton backend, compiled on the GPU")
            triton = guarded_step("triton", triton_on_gpu, model, images, labels, s.seed)
            stages.note(f"  {triton['summary']}")
        else:  # the slow interpreter run starts now, in a child process, and overlaps step 3
            n = min(s.subset, len(labels))
            stages.note(
                f"2/{STEPS} triton: `vit-fast verify default triton` on {n} images, started in a child process "
                "(it runs beside step 3; its result follows step 3)"
            )
            child = InterpreterVerify(n, s.seed, s.triton_timeout)
        if s.skip_onnx:
            onnx = step_record("onnx", "skipped", "--skip-onnx")
            stages.note(f"3/{STEPS} ONNX: skipped (--skip-onnx)")
        else:
            stages.note(f"3/{STEPS} exporting to ONNX ({s.exporter}, opset {s.opset}), verifying on ONNX Runtime")
            onnx = guarded_step("onnx", onnx_step, model, images, labels, s, stages)
            stages.note(f"  {onnx['summary']}")
        if child is not None:
            stages.note("  (step 2) waiting for the triton interpreter child process")
            triton = guarded_step("triton", child.collect)
            stages.note(f"  {triton['summary']}")
        steps += [triton, onnx]
        save()
        if s.skip_timing:
            steps.append(step_record("timing", "skipped", "--skip-timing"))
            stages.note(f"4/{STEPS} timing: skipped (--skip-timing)")
        else:
            stages.note(f"4/{STEPS} timing eager torch vs ONNX Runtime (CPU wall-clock, the same threads)")
            onnx_path = Path(onnx["artifact"]) if onnx["status"] == "ok" else None
            steps.append(guarded_step("timing", timing_step, model, images, onnx_path, s, stages))
            save()
        if use_gpu:
            stages.note(f"5/{STEPS} GPU: CUDA graph and ViT-B/16 latency")
            steps.append(guarded_step("cuda graph", cuda_graph_step, model, images))
            save()
            steps.append(guarded_step("vit-b/16 latency", vit_b16_step, s.seed))
        else:
            why = "--device cpu" if cuda else "no CUDA GPU visible"
            steps += [step_record("cuda graph", "skipped", why), step_record("vit-b/16 latency", "skipped", why)]
            stages.note(f"5/{STEPS} GPU: skipped ({why})")
        missing = "--no-plots" if s.no_plots else plots.matplotlib_missing()
        if missing is not None:
            steps.append(step_record("figures", "skipped", missing))
            stages.note(f"6/{STEPS} figures: skipped")
        else:
            stages.note(f"6/{STEPS} drawing the figures (patches, attention, confusion, timing)")
            steps.append(guarded_step("figures", figures_step, model, images, labels, predictions, steps, out_dir))
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
OUTPUT_FILES = ("report.json", "report.md", ONNX_NAME, ONNX_NAME + ".json", ONNX_REPORT, *plots.FILES.values())


def check_demo_outputs(out_dir: Path, overwrite: bool = False) -> None:
    """Before any step: none of the demo's files in ``out_dir`` is a FIFO, device or folder, and each one that
    exists proves vit-fast wrote it (its own marker), unless ``overwrite``. A ValueError names the file and the fix."""
    check_files_in(out_dir, OUTPUT_FILES, "demo --out", overwrite=overwrite, ours={ONNX_NAME: is_vit_fast_artifact})
