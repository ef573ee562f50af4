"""Run the main job end to end on the embedded default model (a small ViT trained on
scikit-learn's handwritten digits, shipped in vit_fast/assets) and report what it measured.

Steps, each reported as ok / failed / skipped (with the reason):

  1. accuracy   held-out accuracy with the torch backend, against the recorded value
  2. triton     our Triton kernels against torch: max |error| and top-1 agreement. On a GPU:
                compiled, on the whole held-out set. Without one: Triton's interpreter on a small
                subset (--subset), in a child process started with TRITON_INTERPRET=1
  3. onnx       export with vit_fast.export.to_onnx, verify on ONNX Runtime (accuracy delta,
                max |error|, top-1 agreement)
  4. timing     eager torch vs ONNX Runtime, batch 1 and the whole held-out batch (CPU wall-clock,
                median of --repeats runs)
  5. gpu        on a CUDA machine only: a CUDA-graph replay of the triton model and ViT-B/16
                latency, torch vs triton (CUDA events)

Prints a summary table (stdout; progress goes to stderr) and writes report.json and report.md
(plus the ONNX artifact) into --out. Exits 0 when no step failed, 1 when one did, 2 for bad
arguments. Needs scikit-learn (pip install 'vit-fast[demo]') and, for step 3, the onnx extra.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from .env import module_version
from .files import write_atomic

DEFAULT_OUT = "vit-fast-out/demo"
DEFAULT_SUBSET = 16
#: held-out accuracy must reproduce the recorded value within this many percentage points
ACCURACY_TOLERANCE_PP = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"folder for report.json, report.md and the ONNX file (default {DEFAULT_OUT})",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the triton and GPU steps run (auto: cuda when a GPU is visible)",
    )
    parser.add_argument(
        "--subset",
        type=int,
        default=DEFAULT_SUBSET,
        metavar="N",
        help=f"held-out images for the triton step under the CPU interpreter (default "
        f"{DEFAULT_SUBSET}; ~1.5 s each on an idle 2-core CPU); on a GPU the whole set runs",
    )
    parser.add_argument(
        "--triton-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds the interpreter child process may take before the step fails (default 300)",
    )
    parser.add_argument("--skip-triton", action="store_true", help="skip step 2")
    parser.add_argument("--skip-onnx", action="store_true", help="skip step 3 (and ONNX Runtime in step 4)")
    parser.add_argument("--skip-timing", action="store_true", help="skip step 4")
    parser.add_argument(
        "--exporter", choices=("dynamo", "torchscript"), default="dynamo", help="ONNX exporter (default dynamo)"
    )
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset (default 18)")
    parser.add_argument(
        "--repeats", type=int, default=15, metavar="R", help="timed runs per case (batch 1 runs 4x as many); default 15"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="T",
        help="CPU threads for torch and ONNX Runtime (default: torch's current setting)",
    )


# --------------------------------------------------------------------------- helpers
def _progress(text: str) -> None:
    print(f"[vit-fast demo] {text}", file=sys.stderr, flush=True)


def _step(name: str, status: str, summary: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "summary": summary, **fields}


def _why(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def _compare(out: Any, eager: Any, ref: Any) -> dict[str, Any]:
    """``out`` and ``eager`` (fp32 logits) against the float64 ``ref`` under verify's rule; top-1 vs eager."""
    import torch

    from .export.verify import compare

    cmp = compare(out, eager, ref, torch.float32)
    vs_torch = float((out.double() - eager.double()).abs().max())
    return {
        "max_abs_err": cmp["max_abs_err"],
        "max_abs_err_vs_torch": vs_torch,
        "eager_max_abs_err": cmp["eager_max_abs_err"],
        "bound": cmp["bound"],
        "top1_agreement": (out.argmax(-1) == eager.argmax(-1)).double().mean().item(),
        "within_bound": cmp["passed"],
    }


def _median_ms(fn: Any, repeats: int, warmup: int = 2) -> dict[str, float]:
    import statistics

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "runs": repeats}


# --------------------------------------------------------------------------- step 2: triton
def _triton_worker_main(argv: list[str]) -> int:
    """Child process: ``python -m vit_fast.demo --triton-worker N OUT.json`` (TRITON_INTERPRET set by the parent).

    Runs the first N held-out images through the triton backend and writes the logits (or the
    error) as JSON; the parent compares them with torch itself.
    """
    n, out = int(argv[0]), Path(argv[1])
    result: dict[str, Any] = {}
    try:
        import torch

        torch.set_num_threads(1)
        from . import runtime
        from .assets import load_default_eval_set, load_default_model

        result["interpreter"] = runtime.interpreter_enabled()
        model = load_default_model(backend="triton")
        images, _ = load_default_eval_set()
        t = time.perf_counter()
        with torch.no_grad():
            logits = model(images[:n])
        result["seconds"] = time.perf_counter() - t
        result["logits"] = logits.tolist()
        import triton

        result["triton_version"] = triton.__version__
        code = 0
    except BaseException as err:  # report every failure, import errors included, to the parent
        result = {"error": _why(err), "traceback": traceback.format_exc()[-4000:]}
        code = 1
    out.write_text(json.dumps(result))
    return code


def _triton_skip_reason() -> str | None:
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "the 'triton' package is not installed (Linux: pip install triton)"
    return None


class _InterpreterChild:
    """The triton step on a CPU: a child process with TRITON_INTERPRET=1, so that the variable is set
    before triton is first imported whatever this process has imported already, a crash or hang in the
    interpreter cannot take the demo down, and it runs while this process exports to ONNX."""

    def __init__(self, subset: int, timeout: float) -> None:
        self.subset, self.timeout = subset, timeout
        self.traceback: str | None = None
        self.tmpdir = tempfile.TemporaryDirectory(prefix="vit-fast-demo-")
        self.result_path = Path(self.tmpdir.name) / "triton.json"
        env = dict(os.environ, TRITON_INTERPRET="1")
        self.log = open(Path(self.tmpdir.name) / "stderr.txt", "w+")  # noqa: SIM115 (closed in collect)
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vit_fast.demo", "--triton-worker", str(subset), str(self.result_path)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """Stop the child if it still runs (the demo was interrupted before collecting it); clean up."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self.log.close()
        self.tmpdir.cleanup()

    def collect(self) -> tuple[dict[str, Any] | None, str | None, float]:
        """``(result, error, wall seconds)``: waits up to the timeout counted from the start."""
        left = max(1.0, self.timeout - (time.perf_counter() - self.started))
        try:
            try:
                self.proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                return (
                    None,
                    (
                        f"the interpreter run of {self.subset} images took longer than {self.timeout:g} s "
                        "(lower --subset or raise --triton-timeout)"
                    ),
                    time.perf_counter() - self.started,
                )
            wall = time.perf_counter() - self.started
            self.log.seek(0)
            tail = self.log.read()[-2000:]
            try:
                result = json.loads(self.result_path.read_text())
            except (OSError, ValueError):
                result = None
        finally:
            self.kill()
        if result is None:
            last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
            return None, f"the interpreter child process exited {self.proc.returncode} without a result: {last}", wall
        if "error" in result:
            self.traceback = result.get("traceback")
            return None, result["error"], wall
        return result, None, wall


def _triton_from_child(child: _InterpreterChild, model: Any, images: Any) -> dict[str, Any]:
    import torch

    result, error, wall = child.collect()
    if error is not None:
        return _step(
            "triton",
            "failed",
            f"triton (interpreter): {error}",
            mode="interpreter",
            wall_s=wall,
            traceback=child.traceback,
        )
    logits = torch.tensor(result["logits"], dtype=torch.float32)
    x = images[: logits.shape[0]]
    with torch.no_grad():
        eager = model(x)
        ref = _reference(model, x)
    cmp = _compare(logits, eager, ref)
    ok = cmp["within_bound"] and cmp["top1_agreement"] == 1.0
    summary = (
        f"interpreter, {len(x)} images: max|err| {cmp['max_abs_err']:.2e} "
        f"(torch {cmp['eager_max_abs_err']:.2e}, bound {cmp['bound']:.2e}), "
        f"top-1 agreement {cmp['top1_agreement']:.0%}"
    )
    return _step(
        "triton",
        "ok" if ok else "failed",
        summary,
        mode="interpreter",
        images=len(x),
        seconds=result["seconds"],
        wall_s=wall,
        triton_version=result.get("triton_version"),
        **cmp,
    )


def _reference(model: Any, x: Any) -> Any:
    import copy

    import torch

    ref_model = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).set_backend("torch")
    with torch.no_grad():
        return ref_model(x.detach().cpu().double())


def _triton_on_gpu(model: Any, images: Any, labels: Any) -> dict[str, Any]:
    import copy

    import torch

    gpu = copy.deepcopy(model).cuda().set_backend("triton")
    eager_model = copy.deepcopy(model).cuda().set_backend("torch")
    x = images.cuda()
    with torch.no_grad():
        out = gpu(x)  # compiles the kernels
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = gpu(x)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        eager = eager_model(x)
    cmp = _compare(out.cpu(), eager.cpu(), _reference(model, images))
    acc = (out.argmax(-1).cpu() == labels).double().mean().item()
    ok = cmp["within_bound"] and cmp["top1_agreement"] == 1.0
    summary = (
        f"compiled on {torch.cuda.get_device_name()}, {len(images)} images: accuracy {acc:.2%}, "
        f"max|err| {cmp['max_abs_err']:.2e} (bound {cmp['bound']:.2e}), top-1 agreement "
        f"{cmp['top1_agreement']:.0%}"
    )
    return _step(
        "triton",
        "ok" if ok else "failed",
        summary,
        mode="compiled",
        images=len(images),
        accuracy=acc,
        seconds=seconds,
        **cmp,
    )


# --------------------------------------------------------------------------- step 3: onnx
def _onnx_step(model: Any, images: Any, labels: Any, out_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    import importlib.util

    import torch

    for mod in ("onnx", "onnxruntime"):
        if importlib.util.find_spec(mod) is None:
            return _step("onnx", "skipped", f"{mod} is not installed: pip install 'vit-fast[onnx]'")
    try:
        from . import export
    except ImportError as err:
        return _step("onnx", "failed", f"vit_fast.export cannot be imported: {_why(err)}")
    path = out_dir / "digits_vit.onnx"
    n = len(images)
    # the dynamo exporter warns that torchvision's detection ops are not registered: noise for a ViT
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    t = time.perf_counter()
    try:
        export.to_onnx(
            model,
            path,
            batch=(1, n),
            dtype=torch.float32,
            opset=args.opset,
            exporter=args.exporter,
            source="default",
            progress=False,
        )
    except Exception as err:
        return _step("onnx", "failed", f"export failed: {_why(err)}")
    export_s = time.perf_counter() - t
    _progress(f"  exported {path.name} ({path.stat().st_size / 1e6:.2f} MB) in {export_s:.1f} s; verifying")
    try:
        report = export.verify(model, path, data=(images, labels), seed=0, print_table=False, raise_on_failure=False)
    except Exception as err:
        return _step("onnx", "failed", f"verification could not run: {_why(err)}", export_s=export_s)
    # the whole held-out set in one ONNX Runtime call, against torch and the float64 reference
    session = _ort_session(path, args.threads)
    ort_logits = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: images.numpy()})[0])
    with torch.no_grad():
        eager = model(images)
    cmp = _compare(ort_logits, eager, _reference(model, images))
    acc = report.accuracy or {}
    ort_acc = (ort_logits.argmax(-1) == labels).double().mean().item()
    eager_acc = (eager.argmax(-1) == labels).double().mean().item()
    delta_pp = 100 * (ort_acc - eager_acc)
    ok = report.passed and cmp["within_bound"] and cmp["top1_agreement"] == 1.0
    summary = (
        f"{args.exporter}, opset {args.opset}: accuracy {ort_acc:.2%} "
        f"(delta {round(delta_pp, 2) + 0.0:+.2f} pp), "
        f"max|err| {cmp['max_abs_err']:.2e} (bound {cmp['bound']:.2e}), top-1 agreement "
        f"{cmp['top1_agreement']:.0%}; verify {'PASSED' if report.passed else 'FAILED'}"
    )
    return _step(
        "onnx",
        "ok" if ok else "failed",
        summary,
        artifact=str(path),
        exporter=args.exporter,
        opset=args.opset,
        export_s=export_s,
        accuracy=ort_acc,
        eager_accuracy=eager_acc,
        accuracy_delta_pp=delta_pp,
        verify_passed=report.passed,
        verify_accuracy=acc,
        verify_worst_ratio=report.worst().ratio if report.rows else None,
        **cmp,
    )


def _ort_session(path: Path, threads: int | None) -> Any:
    import onnxruntime as ort
    import torch

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- step 4: timing
def _timing_step(model: Any, images: Any, onnx_path: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    session = _ort_session(onnx_path, args.threads) if onnx_path is not None else None
    name = session.get_inputs()[0].name if session is not None else None
    cases = {}
    for batch, repeats in ((1, 4 * args.repeats), (len(images), args.repeats)):
        x = images[:batch].contiguous()
        xn = x.numpy()
        with torch.inference_mode():
            row = {"torch": _median_ms(lambda x=x: model(x), repeats)}
        if session is not None:
            row["onnxruntime"] = _median_ms(lambda xn=xn: session.run(None, {name: xn}), repeats)
        cases[str(batch)] = row
        text = f"  batch {batch}: torch {row['torch']['median_ms']:.2f} ms"
        if session is not None:
            text += f", onnxruntime {row['onnxruntime']['median_ms']:.2f} ms"
        _progress(text)
    parts = []
    for batch, row in cases.items():
        t = row["torch"]["median_ms"]
        p = f"b={batch}: torch {t:.2f} ms"
        if "onnxruntime" in row:
            o = row["onnxruntime"]["median_ms"]
            p += f", ORT {o:.2f} ms (torch/ORT {t / o:.2f}x)"
        parts.append(p)
    threads = args.threads or torch.get_num_threads()
    note = "" if session is not None else " (ONNX Runtime not timed: step 3 did not produce an artifact)"
    return _step(
        "timing",
        "ok",
        "CPU wall-clock, median: " + "; ".join(parts) + note,
        clock="CPU wall-clock",
        threads=threads,
        cases=cases,
    )


# --------------------------------------------------------------------------- step 5: GPU only
def _cuda_ms(fn: Any, repeats: int = 50, warmup: int = 10) -> float:
    import statistics

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _cuda_graph_step(model: Any, images: Any) -> dict[str, Any]:
    import copy

    import torch

    import vit_fast

    try:
        runner_cls = vit_fast.CUDAGraphRunner
    except (AttributeError, ImportError) as err:
        return _step("cuda graph", "skipped", f"vit_fast.CUDAGraphRunner is not available: {_why(err)}")
    gpu = copy.deepcopy(model).cuda().set_backend("triton")
    x = images[:1].cuda()
    with torch.no_grad():
        eager = gpu(x)
        runner = runner_cls(gpu, x)
        out = runner(x)
        eager_ms = _cuda_ms(lambda: gpu(x))
        graph_ms = _cuda_ms(runner.replay)
    err = float((out - eager).abs().max())
    ok = err <= 1e-5 * max(1.0, float(eager.abs().max()))
    return _step(
        "cuda graph",
        "ok" if ok else "failed",
        f"digits model, triton, batch 1: eager {eager_ms:.3f} ms, graph replay {graph_ms:.3f} ms "
        f"({eager_ms / graph_ms:.1f}x); max|graph - eager| {err:.1e}",
        eager_ms=eager_ms,
        graph_ms=graph_ms,
        max_abs_diff=err,
    )


def _vit_b16_step() -> dict[str, Any]:
    import torch

    from .config import ViTConfig
    from .model import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig.from_name("vit_base_patch16_224"), backend="torch")
    model.init_weights(seed=0)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    cases = {}
    with torch.no_grad():
        for batch in (1, 32):
            x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
            row = {}
            for backend in ("torch", "triton"):
                model.set_backend(backend)
                row[backend] = _cuda_ms(lambda x=x: model(x), repeats=30)
            cases[str(batch)] = row
    summary = "bf16, CUDA events, median: " + "; ".join(
        f"b={b}: torch {r['torch']:.3f} ms, triton {r['triton']:.3f} ms ({r['torch'] / r['triton']:.2f}x)"
        for b, r in cases.items()
    )
    return _step(
        "vit-b/16 latency", "ok", summary, dtype="bfloat16", cases_ms=cases, device=torch.cuda.get_device_name()
    )


def _guarded(name: str, fn: Any, *a: Any) -> dict[str, Any]:
    """Run a step; an exception becomes a failed step naming it (never a made-up number)."""
    try:
        return fn(*a)
    except Exception as err:
        return _step(name, "failed", f"{_why(err)}", traceback=traceback.format_exc()[-4000:])


# --------------------------------------------------------------------------- report
def _format_table(steps: list[dict[str, Any]]) -> str:
    width = max(len(s["name"]) for s in steps)
    head = f"{'step':<{width}}  {'status':<7}  result"
    lines = [head, "-" * max(len(head), 100)]
    for s in steps:
        lines.append(f"{s['name']:<{width}}  {s['status']:<7}  {s['summary']}")
    return "\n".join(lines)


def _markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# vit-fast demo",
        "",
        f"{report['created']} · vit-fast {report['vit_fast_version']} · torch {env['torch']} · "
        f"triton {env['triton'] or 'absent'} · onnxruntime {env['onnxruntime'] or 'absent'} · "
        f"{env['gpu'] or 'no GPU'} · {env['cpu_threads']} CPU threads",
        "",
        f"Model: `{report['model']['name']}` ({report['model']['num_params']:,} parameters, "
        f"{report['model']['tokens']} tokens); held-out set: {report['model']['heldout_size']} images.",
        "",
        "| step | status | result |",
        "|---|---|---|",
    ]
    for s in report["steps"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['summary'].replace('|', chr(92) + '|')} |")
    lines += [
        "",
        f"**{'OK' if report['ok'] else 'FAILED'}** (exit code {report['exit_code']}), "
        f"{report['wall_s']:.1f} s. Timings in the timing step are CPU wall-clock.",
        "",
    ]
    return "\n".join(lines)


def _environment() -> dict[str, Any]:
    import platform

    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": module_version("triton"),
        "onnxruntime": module_version("onnxruntime"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpu_threads": torch.get_num_threads(),
    }


# --------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> int:
    if getattr(args, "subset", 1) < 1:
        print("vit-fast demo: --subset must be >= 1", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        print("vit-fast demo: --device cuda, but no CUDA GPU is visible to torch", file=sys.stderr)
        return 2
    use_gpu = cuda and args.device != "cpu"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    from . import __version__

    steps: list[dict[str, Any]] = []
    n_steps = 5

    # 1 ---------------------------------------------------------------- accuracy
    _progress(f"1/{n_steps} loading the embedded model and the held-out digits")
    try:
        from .assets import default_model_info, load_default_eval_set, load_default_model

        model = load_default_model(backend="torch")
        images, labels = load_default_eval_set()
        info = default_model_info()
    except Exception as err:  # sklearn missing, weights missing: nothing else can run
        print(f"vit-fast demo: cannot load the embedded model: {_why(err)}", file=sys.stderr)
        return 1
    triton_child = None
    skip_triton = args.skip_triton or _triton_skip_reason()
    if not skip_triton and not use_gpu:  # start the slow interpreter run now; it overlaps the ONNX step
        _progress(
            f"2/{n_steps} starting the triton interpreter on {args.subset} images in a child process "
            "(TRITON_INTERPRET=1)"
        )
        triton_child = _InterpreterChild(min(args.subset, len(images)), args.triton_timeout)
    t = time.perf_counter()
    with torch.no_grad():
        pred = model(images).argmax(-1)
    acc = (pred == labels).double().mean().item()
    recorded = float(info["heldout_accuracy"])
    delta_pp = 100 * (acc - recorded)
    ok = abs(delta_pp) <= ACCURACY_TOLERANCE_PP
    steps.append(
        _step(
            "accuracy",
            "ok" if ok else "failed",
            f"torch backend: {acc:.2%} on {len(labels)} held-out images (recorded {recorded:.2%}, "
            f"delta {round(delta_pp, 2) + 0.0:+.2f} pp)",
            accuracy=acc,
            recorded_accuracy=recorded,
            delta_pp=delta_pp,
            images=len(labels),
            seconds=time.perf_counter() - t,
        )
    )
    _progress(f"  {steps[-1]['summary']}")

    try:
        # 3 ---------------------------------------------------------------- onnx (before 2: overlaps the child)
        onnx_step = None
        if args.skip_onnx:
            onnx_step = _step("onnx", "skipped", "--skip-onnx")
        else:
            _progress(f"3/{n_steps} exporting to ONNX ({args.exporter}, opset {args.opset}), verifying on ONNX Runtime")
            onnx_step = _guarded("onnx", _onnx_step, model, images, labels, out_dir, args)
            _progress(f"  {onnx_step['summary']}")

        # 2 ---------------------------------------------------------------- triton
        if args.skip_triton:
            triton_step = _step("triton", "skipped", "--skip-triton")
        elif skip_triton:
            triton_step = _step("triton", "skipped", str(skip_triton))
        elif use_gpu:
            _progress(f"2/{n_steps} triton backend, compiled on the GPU")
            triton_step = _guarded("triton", _triton_on_gpu, model, images, labels)
        else:
            _progress(f"2/{n_steps} waiting for the triton interpreter child process")
            triton_step = _guarded("triton", _triton_from_child, triton_child, model, images)
        _progress(f"  {triton_step['summary']}")
        steps += [triton_step, onnx_step]

        # 4 ---------------------------------------------------------------- timing
        if args.skip_timing:
            steps.append(_step("timing", "skipped", "--skip-timing"))
        else:
            _progress(f"4/{n_steps} timing eager torch vs ONNX Runtime (CPU wall-clock)")
            onnx_path = Path(onnx_step["artifact"]) if onnx_step.get("status") == "ok" else None
            steps.append(_guarded("timing", _timing_step, model, images, onnx_path, args))

        # 5 ---------------------------------------------------------------- GPU only
        if use_gpu:
            _progress(f"5/{n_steps} GPU: CUDA graph and ViT-B/16 latency")
            steps.append(_guarded("cuda graph", _cuda_graph_step, model, images))
            steps.append(_guarded("vit-b/16 latency", _vit_b16_step))
        else:
            why = "--device cpu" if cuda else "no CUDA GPU visible"
            steps.append(_step("cuda graph", "skipped", why))
            steps.append(_step("vit-b/16 latency", "skipped", why))
    finally:
        if triton_child is not None:
            triton_child.kill()

    failed = [s["name"] for s in steps if s["status"] == "failed"]
    exit_code = 1 if failed else 0
    cfg = model.cfg
    report = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "vit_fast_version": __version__,
        "environment": _environment(),
        "model": {
            "name": info.get("name", "digits_vit"),
            "config": cfg.to_dict(),
            "tokens": cfg.num_tokens,
            "num_params": sum(p.numel() for p in model.parameters()),
            "recorded_heldout_accuracy": recorded,
            "heldout_size": len(labels),
        },
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "steps": steps,
        "failed": failed,
        "ok": not failed,
        "exit_code": exit_code,
        "wall_s": time.perf_counter() - t_start,
    }
    table = _format_table(steps)
    write_atomic(out_dir / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    write_atomic(out_dir / "report.md", _markdown(report))
    print(table)
    print(
        f"\n{'OK' if not failed else 'FAILED: ' + ', '.join(failed)} in {report['wall_s']:.1f} s; "
        f"report: {out_dir / 'report.json'}, {out_dir / 'report.md'}"
    )
    return exit_code


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--triton-worker":
        sys.exit(_triton_worker_main(sys.argv[2:]))
    from .cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
