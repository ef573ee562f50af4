"""The benchmark run: every backend in this one process, on the same input tensors, each output
checked against the eager ``"torch"`` backend's on that input so a fast wrong answer shows.

:class:`Harness` turns :class:`BenchSettings` into the report dict (rows of results, the
environment, the ceilings, what did not run); :func:`run_benchmark` runs it and writes the reports.
"""

from __future__ import annotations

import copy
import datetime as _dt
import gc
import re
import shutil
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vit_fast.dtypes import DTYPES
from vit_fast.env import collect_environment
from vit_fast.numerics import max_err
from vit_fast.progress import bar as progress_bar

from .backends import Backend, OnnxExports, Variant, build_backend, graph_mode, plan_variants, static_unavailable
from .ceilings import floor_ms, measure_bandwidth, measure_matrix_rate
from .report import add_ratios, unavailable_summary, write_reports
from .settings import (
    SCHEMA_VERSION,
    BenchError,
    BenchSettings,
    Unavailable,
    check_dtype_supported,
    cpu_threads_for_load,
    resolve_device,
)
from .timing import L2Flusher, summarize, synchronize, time_callable

#: the environment fields every row repeats, so a row read alone still names its device and versions
ROW_ENV_FIELDS = (
    "device_name",
    "driver_version",
    "cuda_runtime",
    "torch",
    "triton",
    "onnxruntime",
    "tensorrt",
    "timm",
    "git_commit",
)


def model_slug(spec: str) -> str:
    """A file-name stem for a model spec: a preset name as it is, a checkpoint path by its stem."""
    stem = Path(spec).stem if Path(spec).suffix else spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_") or "model"


def max_abs_err_vs_torch(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |out - ref| (float64, CPU); NaN when ``out`` holds a non-finite value, so it cannot hide."""
    if out.shape != ref.shape:
        raise RuntimeError(f"output shape {tuple(out.shape)} differs from the torch backend's {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return float("nan")
    return max_err(out, ref)


def _weight_bytes(model: Any, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(p.numel() for p in model.parameters()) * elem


def _make_input(cfg: Any, batch: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    h, w = cfg.img_hw
    gen = torch.Generator().manual_seed(seed * 100003 + batch)
    return torch.randn(batch, cfg.in_chans, h, w, generator=gen).to(dtype).to(device)


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _short_error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    first = text.splitlines()[0] if text else type(err).__name__
    return first[:500]


class Harness:
    """Runs :class:`BenchSettings` and returns the report dict (see :func:`write_reports`)."""

    def __init__(self, settings: BenchSettings, log: Callable[[str], None] | None = None) -> None:
        self.s = settings
        self.log = log or (lambda msg: None)
        self.device = resolve_device(settings.device)
        self.threads_note = "torch default"
        if settings.threads is not None:
            if settings.threads < 1:
                raise BenchError(f"--threads must be >= 1, got {settings.threads}")
            torch.set_num_threads(settings.threads)
            self.threads_note = "--threads"
        elif self.device.type == "cpu":
            threads, self.threads_note = cpu_threads_for_load()
            torch.set_num_threads(threads)
        for d in settings.dtypes:
            check_dtype_supported(self.device, d)
        self.opts = settings.resolved(self.device)
        if self.opts["iters"] < 1 or self.opts["warmup"] < 0:
            raise BenchError(f"--iters must be >= 1 and --warmup >= 0, got {self.opts['iters']}, {self.opts['warmup']}")
        self.variants = plan_variants(settings.backends, settings.graph)

    def _build(self, variant: Variant, ref_model: Any, dtype_name: str, workdir: Path) -> Backend:
        return build_backend(variant, ref_model, dtype_name, self.device, self._onnx, workdir)

    def run(self) -> dict[str, Any]:
        from vit_fast.loading import load_model
        from vit_fast.model import count_flops

        s, device = self.s, self.device
        env = collect_environment(device)
        self.log(f"device: {env['device_name']}")
        base = load_model(s.model, backend="torch", seed=s.seed).float().eval()
        cfg = base.cfg
        ceilings: dict[str, Any] = {"device": env["device_name"], "bandwidth": None, "matrix": {}}
        if s.measure_ceilings:
            self.log("measuring ceilings (copy bandwidth, matmul rate)")
            ceilings["bandwidth"] = measure_bandwidth(device)
            for d in s.dtypes:
                ceilings["matrix"][d] = measure_matrix_rate(device, d)
            _release(device)
        flusher = L2Flusher(device) if s.flush_l2 else None
        common = {
            "model": s.model,
            "img_size": list(cfg.img_hw),
            "patch_size": cfg.patch_size,
            "tokens": cfg.num_tokens,
            "gelu": cfg.act,
            "params": sum(p.numel() for p in base.parameters()),
            "flops_per_image": count_flops(cfg),
            "device": str(device),
            **{k: env[k] for k in ROW_ENV_FIELDS},
            "timer": "cuda-events" if device.type == "cuda" else "perf_counter",
            "flush_l2": bool(flusher),
            "warmup": self.opts["warmup"],
        }
        rows: list[dict[str, Any]] = []
        transfers: list[dict[str, Any]] = []
        bar = progress_bar(len(s.dtypes) * len(self.variants) * len(s.batches), "bench", s.progress)
        workdir = Path(tempfile.mkdtemp(prefix="vit-fast-bench-"))
        try:
            with torch.no_grad():
                for dtype_name in s.dtypes:
                    self._onnx = OnnxExports(workdir, max(s.batches), s.onnx_exporter, s.model)
                    rows.extend(self._run_dtype(dtype_name, base, common, ceilings, flusher, workdir, bar, transfers))
                    _release(device)
        finally:
            bar.close()
            shutil.rmtree(workdir, ignore_errors=True)
        add_ratios(rows)
        return {
            "schema": SCHEMA_VERSION,
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "model": s.model,
            "config": cfg.to_dict(),
            "environment": env,
            "ceilings": ceilings,
            "settings": {
                "batches": s.batches,
                "dtypes": s.dtypes,
                "backends": s.backends,
                "graph": s.graph,
                "h2d": s.h2d,
                "flush_l2": flusher.describe() if flusher else False,
                "onnx_exporter": s.onnx_exporter,
                "seed": s.seed,
                "threads": torch.get_num_threads() if device.type == "cpu" else None,
                "threads_note": self.threads_note if device.type == "cpu" else None,
                **self.opts,
            },
            "unavailable": unavailable_summary(rows),
            "transfers": transfers,
            "rows": rows,
        }

    def _run_dtype(
        self,
        dtype_name: str,
        base: Any,
        common: dict[str, Any],
        ceilings: dict[str, Any],
        flusher: L2Flusher | None,
        workdir: Path,
        bar: Any,
        transfers: list[dict[str, Any]],
    ) -> list[dict]:
        s, device = self.s, self.device
        dtype = DTYPES[dtype_name]
        ref_model = copy.deepcopy(base).to(device=device, dtype=dtype).set_backend("torch").eval()
        weight_bytes = _weight_bytes(ref_model, dtype)
        inputs = {b: _make_input(base.cfg, b, dtype, device, s.seed) for b in s.batches}
        refs = {b: ref_model(x).detach().clone() for b, x in inputs.items()}
        fp32_err: dict[int, float] = {}
        if dtype != torch.float32:
            ref32 = copy.deepcopy(base).to(device=device).set_backend("torch").eval()
            for b, x in inputs.items():
                fp32_err[b] = max_abs_err_vs_torch(refs[b], ref32(x.float()))
            del ref32
            _release(device)
        h2d: dict[int, dict[str, Any]] = {}
        if s.h2d:
            for b, x in inputs.items():
                h2d[b] = self._time_h2d(x)
                transfers.append({"dtype": dtype_name, "batch": b, **h2d[b]})
        out_rows = []
        for variant in self.variants:
            base_row = {
                **common,
                "backend": variant.backend,
                "label": variant.label,
                "graph_mode": graph_mode(variant, device),
                "dtype": dtype_name,
                "weight_bytes": weight_bytes,
            }
            reason = static_unavailable(variant, device, dtype_name)
            backend: Backend | None = None
            build_error = None
            if reason is None:
                try:
                    bar.set_postfix_str(f"{dtype_name} {variant.label}: building")
                    backend = self._build(variant, ref_model, dtype_name, workdir)
                except Unavailable as err:
                    reason = str(err)
                except Exception as err:  # reported in every row of this backend; the others go on
                    build_error = (_short_error(err), traceback.format_exc(limit=8))
            for b in s.batches:
                row = {**base_row, "batch": b, "torch_max_abs_err_vs_fp32": fp32_err.get(b, 0.0)}
                fl = floor_ms(weight_bytes, float(common["flops_per_image"]) * b, ceilings, dtype_name)
                row["floor_ms"], row["floor_bound"] = fl if fl else (None, None)
                if b in h2d:
                    row["h2d_median_ms"] = h2d[b].get("median_ms")
                if reason is not None:
                    row.update(status="unavailable", reason=reason)
                elif build_error is not None:
                    row.update(status="error", error=build_error[0], traceback=build_error[1])
                elif variant.backend == "compile-reduce-overhead" and b != 1:
                    row.update(status="skipped", reason="compile-reduce-overhead is timed at batch 1 only")
                else:
                    bar.set_postfix_str(f"{dtype_name} {variant.label} batch {b}")
                    row.update(self._measure(backend, inputs[b], refs[b], flusher))
                out_rows.append(row)
                bar.update(1)
            if backend is not None:
                backend.close()
            del backend
            _release(device)
        del ref_model, inputs, refs
        return out_rows

    def _measure(self, backend: Backend, x: torch.Tensor, ref: torch.Tensor, flusher: L2Flusher | None) -> dict:
        device = self.device
        try:
            case = backend.prepare(x)
            out = case.fetch(case.run())
            synchronize(device)
            err = max_abs_err_vs_torch(out, ref)
            del out
            times = time_callable(
                case.run,
                device,
                warmup=self.opts["warmup"],
                iters=self.opts["iters"],
                flush=flusher,
                max_seconds=self.opts["max_seconds"],
                min_iters=5 if device.type == "cuda" else 3,
            )
        except Exception as err:
            _release(device)
            return {"status": "error", "error": _short_error(err), "traceback": traceback.format_exc(limit=8)}
        stats = summarize(times)
        batch = int(x.shape[0])
        return {
            "status": "ok",
            "max_abs_err_vs_torch": err,
            "iters": stats["n"],
            **stats,
            "images_per_s": batch / (stats["median_ms"] * 1e-3),
            "notes": case.notes,
        }

    def _time_h2d(self, x: torch.Tensor) -> dict[str, Any]:
        nbytes = x.numel() * x.element_size()
        if self.device.type != "cuda":
            return {"bytes": nbytes, "median_ms": None, "note": "n/a on CPU: the input already lies in host memory"}
        host = x.cpu().pin_memory()
        dst = torch.empty_like(x)
        times = time_callable(
            lambda: dst.copy_(host, non_blocking=True), self.device, warmup=3, iters=min(self.opts["iters"], 50)
        )
        st = summarize(times)
        return {
            "bytes": nbytes,
            "median_ms": st["median_ms"],
            "p90_ms": st["p90_ms"],
            "p99_ms": st["p99_ms"],
            "GBps": nbytes / (st["median_ms"] * 1e-3) / 1e9,
            "note": "pinned host -> device, non_blocking copy",
        }


def run_benchmark(settings: BenchSettings, log: Callable[[str], None] | None = None) -> tuple[dict[str, Any], dict]:
    """Run the benchmark and write its reports; returns (report, paths)."""
    threads = torch.get_num_threads()
    try:
        harness = Harness(settings, log=log)
        report = harness.run()
    finally:
        torch.set_num_threads(threads)  # --threads is for this run only
    paths = write_reports(report, settings.out_dir, f"bench_{model_slug(settings.model)}")
    return report, paths
