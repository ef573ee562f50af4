"""The benchmark run: every backend in this one process, on the same input tensors, each output checked against
the eager ``"torch"`` backend's on that input so a fast wrong answer shows. :class:`Harness` turns
:class:`BenchSettings` into the report dict (rows, the environment, the ceilings, what did not run); ``artifacts``
times an existing artifact through it, ``api`` holds the entry points, ``pacing`` the progress and time left."""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import functools
import gc
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from vit_fast.backend.env import collect_environment
from vit_fast.util.dtypes import DTYPES
from vit_fast.util.files import temp_staging
from vit_fast.util.numerics import max_err
from vit_fast.util.progress import bar as progress_bar

from .artifacts import artifact_path, run_artifact
from .backends import (
    Backend,
    Case,
    FellBack,
    OnnxExports,
    Variant,
    build_backend,
    graph_mode,
    plan_variants,
    static_unavailable,
    triton_tuning,
)
from .ceilings import floor_ms, measure_bandwidth, measure_matrix_rate
from .pacing import CasePacing, bench_input
from .report import add_ratios, unavailable_summary
from .settings import (
    BACKENDS,
    BATCH_DEFAULTS,
    SCHEMA_VERSION,
    BenchError,
    BenchSettings,
    Unavailable,
    check_dtype_supported,
    cpu_threads_for_load,
    default_dtypes,
    resolve_device,
)
from .timing import L2Flusher, Sampling, sample, summarize, synchronize, time_callable

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


def model_label(model: Any) -> str:
    """How reports name the model: a name or path as given, a module by its class and architecture."""
    if isinstance(model, (str, Path)):
        return str(model)
    cfg = getattr(model, "cfg", None)
    arch = f"{cfg.embed_dim}d x {cfg.depth}, {cfg.img_size}px/{cfg.patch_size}" if cfg is not None else "?"
    return f"{type(model).__name__} ({arch})"


def max_abs_err_vs_torch(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |out - ref| (float64, CPU); NaN when ``out`` holds a non-finite value, so it cannot hide."""
    if out.shape != ref.shape:
        raise RuntimeError(f"output shape {tuple(out.shape)} differs from the torch backend's {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return float("nan")
    return max_err(out, ref)


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _short_error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    first = text.splitlines()[0] if text else type(err).__name__
    return first[:500]


#: why a CPU run shows no physical floor: a floor must be a lower bound, and this measurement is not one
CPU_NO_FLOOR = (
    "on a CPU the floor is not shown: a torch.mm rate measured on a shared CPU is not its peak (ONNX Runtime and "
    "torch.compile ran below a floor built from it), so it would bound nothing"
)


class Harness(CasePacing):
    """Runs :class:`BenchSettings` and returns the report dict (see :func:`write_reports`)."""

    def __init__(
        self,
        settings: BenchSettings,
        log: Callable[[str], None] | None = None,
        on_case: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.s = settings
        self.log = log or (lambda msg: None)
        self.on_case = on_case or (lambda report: None)
        self.started = _dt.datetime.now(_dt.timezone.utc)
        self.bar: Any = progress_bar(0, "bench", False)
        self.partial_report: Callable[[list[dict[str, Any]]], dict[str, Any]] = lambda rows: {}
        self.cases: list[tuple[str, str, int]] = []  # (dtype, label, batch) of every case, in the order they run
        # seconds per FLOP of one call, from the cases timed so far: by "dtype label", by dtype, and "" the last one
        self._rates: dict[str, float] = {}
        self._flops: float = 1.0
        self.device = resolve_device(settings.device)
        cuda = self.device.type == "cuda"
        self.threads_note = "torch default"
        if settings.threads is not None:
            if settings.threads < 1:
                raise BenchError(f"--threads must be >= 1, got {settings.threads}")
            torch.set_num_threads(settings.threads)
            self.threads_note = "--threads"
        elif not cuda:
            threads, self.threads_note = cpu_threads_for_load()
            torch.set_num_threads(threads)
        self.opts = settings.resolved(self.device)
        self.sampling = Sampling(
            warmup=self.opts["warmup"],
            min_samples=self.opts["min_samples"],
            min_time_s=self.opts["min_time_s"],
            max_samples=self.opts["iters"],
            max_seconds=self.opts["max_seconds"],
            floor=5 if cuda else 3,
        )
        self.batches = list(settings.batches or BATCH_DEFAULTS["cuda" if cuda else "cpu"])
        for b in self.batches:
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise BenchError(f"batch sizes must be ints >= 1, got {self.batches}")
        self.artifact = artifact_path(settings.model)
        self.dtypes = list(settings.dtypes or default_dtypes(self.device))
        self.backends = list(settings.backends or BACKENDS)
        if self.artifact is None:
            for d in self.dtypes:
                check_dtype_supported(self.device, d)
            self.variants = plan_variants(self.backends, settings.graph)

    @staticmethod
    def weight_bytes(params: int, dtype: torch.dtype) -> int:
        """Bytes of ``params`` weights stored in ``dtype``."""
        return params * torch.empty((), dtype=dtype).element_size()

    def _build(self, variant: Variant, ref_model: Any, dtype_name: str, workdir: Path) -> Backend:
        return build_backend(variant, ref_model, dtype_name, self.device, self._onnx, workdir, tune=self.s.tune)

    @property
    def threads(self) -> int | None:
        """The CPU threads every CPU backend runs with (torch's, given to ONNX Runtime too); None on a GPU."""
        return torch.get_num_threads() if self.device.type == "cpu" else None

    def ceilings(self, env: dict[str, Any], dtypes: Sequence[str]) -> dict[str, Any]:
        ceilings: dict[str, Any] = {"device": env["device_name"], "bandwidth": None, "matrix": {}}
        if self.s.measure_ceilings and self.device.type == "cpu":
            ceilings["not_measured"] = CPU_NO_FLOOR
            self.log(f"no floor column: {CPU_NO_FLOOR}")
        elif self.s.measure_ceilings:
            self.log("measuring ceilings (copy bandwidth, matmul rate)")
            ceilings["bandwidth"] = measure_bandwidth(self.device)
            for d in dtypes:
                ceilings["matrix"][d] = measure_matrix_rate(self.device, d)
            _release(self.device)
        return ceilings

    def row_fields(self, cfg: Any, params: int | None, env: dict[str, Any], weights: dict[str, Any] | None) -> dict:
        from vit_fast.model.vit import count_flops

        return {
            "model": model_label(self.s.model),
            "img_size": list(cfg.img_hw) if cfg is not None else None,
            "patch_size": cfg.patch_size if cfg is not None else None,
            "tokens": cfg.num_tokens if cfg is not None else None,
            "gelu": cfg.act if cfg is not None else None,
            "params": params,
            "flops_per_image": count_flops(cfg) if cfg is not None else None,
            "weights": (weights or {}).get("description", "not recorded"),
            "weights_source": (weights or {}).get("source"),
            "device": str(self.device),
            **{k: env[k] for k in ROW_ENV_FIELDS},
            "timer": "cuda-events" if self.device.type == "cuda" else "perf_counter",
            "threads": self.threads,
            "warmup": self.opts["warmup"],
        }

    def report(
        self,
        env: dict[str, Any],
        cfg: Any,
        ceilings: dict[str, Any],
        rows: list[dict[str, Any]],
        flusher: L2Flusher | None,
        dtypes: list[str],
        backends: list[str],
        transfers: list[dict[str, Any]],
        weights: dict[str, Any] | None,
        complete: bool = True,
    ) -> dict[str, Any]:
        """The report dict; ``complete=False`` for the one written after each case (``cases`` says how many of
        how many are in it; ``interrupted``, set by whoever stops the run, says why it ends there)."""
        from vit_fast import __version__

        add_ratios(rows)
        s = self.s
        return {
            "schema": SCHEMA_VERSION,
            "vit_fast_version": __version__,
            "created_utc": self.started.isoformat(timespec="seconds"),
            "run_id": self.started.strftime("%Y%m%dT%H%M%SZ"),
            "complete": complete,
            "cases": {"done": len(rows), "total": len(self.cases) or len(rows)},
            "interrupted": None,
            "model": model_label(s.model),
            "artifact": str(self.artifact) if self.artifact else None,
            "config": cfg.to_dict() if cfg is not None else None,
            "weights": weights,
            "environment": env,
            "ceilings": ceilings,
            "settings": {
                "batches": self.batches,
                "dtypes": dtypes,
                "backends": backends,
                "graph": s.graph,
                "h2d": s.h2d,
                "flush_l2": flusher.describe() if flusher else False,
                "onnx_exporter": s.onnx_exporter,
                "seed": s.seed,
                "threads": self.threads,
                "threads_note": self.threads_note if self.device.type == "cpu" else None,
                "triton_tuning": triton_tuning(s.tune) if {"triton", "triton-graph"} & set(backends) else None,
                **self.opts,
            },
            "unavailable": unavailable_summary(rows),
            "transfers": transfers,
            "rows": rows,
        }

    def run(self) -> dict[str, Any]:
        env = collect_environment(self.device)
        self.log(f"device: {env['device_name']}")
        if self.artifact is not None:
            return run_artifact(self, env)
        from vit_fast.export import plain_model, weights_record
        from vit_fast.interop.loading import load_model

        s, device = self.s, self.device
        if isinstance(s.model, (str, Path)):
            loaded = load_model(str(s.model), backend="torch", seed=s.seed)
        else:
            loaded = plain_model(s.model, "bench")
        base = copy.deepcopy(loaded).float().eval().set_backend("torch")
        weights = weights_record(loaded)
        cfg = base.cfg
        ceilings = self.ceilings(env, self.dtypes)
        flusher = L2Flusher(device) if s.flush_l2 else None
        common = self.row_fields(cfg, sum(p.numel() for p in base.parameters()), env, weights)
        common["flush_l2"] = bool(flusher)
        plan = [(d, v, b) for d in self.dtypes for v in self.variants for b in self.batches]
        self.cases = [(d, v.label, b) for d, v, b in plan]
        skipped = {  # known now to take no time: not in the estimate of the time left
            j
            for j, (d, v, b) in enumerate(plan)
            if static_unavailable(v, device, d) is not None or (v.backend == "compile-reduce-overhead" and b != 1)
        }
        if device.type == "cpu":  # GPU-sized work said before it starts: how long, and the smaller command to try
            self._cpu_note(base, common["flops_per_image"], skipped)
        self.start_cases(common["flops_per_image"], skipped)
        rows: list[dict[str, Any]] = []
        transfers: list[dict[str, Any]] = []
        self.partial_report = lambda done: self.report(
            env, cfg, ceilings, list(done), flusher, self.dtypes, self.backends, list(transfers), weights, False
        )
        # a staging folder in $TMPDIR: removed on the way out (SIGTERM included), a SIGKILLed run's by the next run
        workdir_scope = contextlib.ExitStack()
        workdir = workdir_scope.enter_context(temp_staging("vit-fast-bench"))
        source = str(s.model) if isinstance(s.model, (str, Path)) else None
        try:
            with torch.no_grad():
                for dtype_name in self.dtypes:
                    self._onnx = OnnxExports(workdir, max(self.batches), s.onnx_exporter, source)
                    self._run_dtype(dtype_name, base, common, ceilings, flusher, workdir, rows, transfers)
                    _release(device)
        finally:
            self.bar.close()
            workdir_scope.close()
        return self.report(env, cfg, ceilings, rows, flusher, self.dtypes, self.backends, transfers, weights)

    # ----------------------------------------------------------------------------------- progress, case by case
    def _run_dtype(
        self,
        dtype_name: str,
        base: Any,
        common: dict[str, Any],
        ceilings: dict[str, Any],
        flusher: L2Flusher | None,
        workdir: Path,
        rows: list[dict[str, Any]],
        transfers: list[dict[str, Any]],
    ) -> None:
        s, device, bar = self.s, self.device, self.bar
        dtype = DTYPES[dtype_name]
        ref_model = copy.deepcopy(base).to(device=device, dtype=dtype).set_backend("torch").eval()
        weight_bytes = self.weight_bytes(common["params"], dtype)
        inputs = {b: bench_input(base.cfg, b, dtype, device, s.seed) for b in self.batches}
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
            for b in self.batches:
                started = time.perf_counter()
                row = {**base_row, "batch": b, "torch_max_abs_err_vs_fp32": fp32_err.get(b, 0.0)}
                row.update(self.floor(weight_bytes, common["flops_per_image"], b, ceilings, dtype_name))
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
                    row.update(self.measure(functools.partial(backend.prepare, inputs[b]), b, refs[b], flusher))
                self.case_done(rows, row, time.perf_counter() - started)
            if backend is not None:
                backend.close()
            del backend
            _release(device)
        del ref_model, inputs, refs

    @staticmethod
    def floor(weight_bytes: int | None, flops: int | None, batch: int, ceilings: dict, dtype_name: str) -> dict:
        fl = floor_ms(weight_bytes, float(flops) * batch, ceilings, dtype_name) if weight_bytes and flops else None
        return {"floor_ms": fl[0] if fl else None, "floor_bound": fl[1] if fl else None}

    def measure(
        self, prepare: Callable[[], Case], batch: int, ref: torch.Tensor | None, flusher: L2Flusher | None
    ) -> dict:
        """Prepare the case, check its output against ``ref`` (when there is one), then sample its timing."""
        device = self.device
        try:
            case = prepare()
        except FellBack as err:  # eager PyTorch under the triton label: marked, never timed
            _release(device)
            return {"status": "fallback", "reason": str(err)}
        except Exception as err:
            _release(device)
            return {"status": "error", "error": _short_error(err), "traceback": traceback.format_exc(limit=8)}
        try:
            out = case.fetch(case.run())
            synchronize(device)
            err = max_abs_err_vs_torch(out, ref) if ref is not None else None
            del out
            times, stopped_by = sample(case.run, device, self.sampling, flusher)
        except Exception as err:
            _release(device)
            return {"status": "error", "error": _short_error(err), "traceback": traceback.format_exc(limit=8)}
        stats = summarize(times)
        return {
            "status": "ok",
            "max_abs_err_vs_torch": err,
            "iters": stats["n"],
            **stats,
            "stopped_by": stopped_by,
            "timed_s": sum(times) / 1e3,
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
