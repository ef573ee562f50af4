"""The benchmark run: every backend in this one process, on the same input tensors, each output
checked against the eager ``"torch"`` backend's on that input so a fast wrong answer shows; or one
existing artifact (``.onnx``, a TensorRT engine) timed by its own runtime.

:class:`Harness` turns :class:`BenchSettings` into the report dict (rows of results, the
environment, the ceilings, what did not run); :func:`benchmark` runs it from Python and writes
nothing; :func:`run_benchmark` runs it and writes the reports (never over an earlier run's files
unless asked).
"""

from __future__ import annotations

import copy
import datetime as _dt
import functools
import gc
import re
import shutil
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from vit_fast.dtypes import DTYPE_NAMES, DTYPES
from vit_fast.env import collect_environment
from vit_fast.numerics import max_err
from vit_fast.progress import bar as progress_bar

from .backends import Backend, Case, OnnxExports, Variant, build_backend, graph_mode, plan_variants, static_unavailable
from .ceilings import floor_ms, measure_bandwidth, measure_matrix_rate
from .report import BenchResult, add_ratios, unavailable_summary, write_reports
from .settings import (
    BACKENDS,
    BATCH_DEFAULTS,
    DTYPE_DEFAULTS,
    SCHEMA_VERSION,
    BenchError,
    BenchSettings,
    Unavailable,
    check_dtype_supported,
    cpu_threads_for_load,
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


def model_slug(spec: str) -> str:
    """A file-name stem for a model spec: a preset name as it is, a checkpoint path by its stem."""
    stem = Path(spec).stem if Path(spec).suffix else spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_") or "model"


def model_label(model: Any) -> str:
    """How reports name the model: a name or path as given, a module by its class and architecture."""
    if isinstance(model, (str, Path)):
        return str(model)
    cfg = getattr(model, "cfg", None)
    arch = f"{cfg.embed_dim}d x {cfg.depth}, {cfg.img_size}px/{cfg.patch_size}" if cfg is not None else "?"
    return f"{type(model).__name__} ({arch})"


def artifact_path(model: Any) -> Path | None:
    """The artifact to time when ``model`` names an ONNX file or a TensorRT engine, else None."""
    from vit_fast.export._common import ENGINE_SUFFIXES, ONNX_SUFFIXES

    if isinstance(model, (str, Path)) and Path(model).suffix.lower() in (*ONNX_SUFFIXES, *ENGINE_SUFFIXES):
        return Path(model)
    return None


def max_abs_err_vs_torch(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |out - ref| (float64, CPU); NaN when ``out`` holds a non-finite value, so it cannot hide."""
    if out.shape != ref.shape:
        raise RuntimeError(f"output shape {tuple(out.shape)} differs from the torch backend's {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return float("nan")
    return max_err(out, ref)


def _weight_bytes(params: int, dtype: torch.dtype) -> int:
    return params * torch.empty((), dtype=dtype).element_size()


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
        self.dtypes = list(settings.dtypes or DTYPE_DEFAULTS["cuda" if cuda else "cpu"])
        self.backends = list(settings.backends or BACKENDS)
        if self.artifact is None:
            for d in self.dtypes:
                check_dtype_supported(self.device, d)
            self.variants = plan_variants(self.backends, settings.graph)

    def _build(self, variant: Variant, ref_model: Any, dtype_name: str, workdir: Path) -> Backend:
        return build_backend(variant, ref_model, dtype_name, self.device, self._onnx, workdir)

    @property
    def threads(self) -> int | None:
        """The CPU threads every CPU backend runs with (torch's, given to ONNX Runtime too); None on a GPU."""
        return torch.get_num_threads() if self.device.type == "cpu" else None

    def _ceilings(self, env: dict[str, Any], dtypes: Sequence[str]) -> dict[str, Any]:
        ceilings: dict[str, Any] = {"device": env["device_name"], "bandwidth": None, "matrix": {}}
        if self.s.measure_ceilings:
            self.log("measuring ceilings (copy bandwidth, matmul rate)")
            ceilings["bandwidth"] = measure_bandwidth(self.device)
            for d in dtypes:
                ceilings["matrix"][d] = measure_matrix_rate(self.device, d)
            _release(self.device)
        return ceilings

    def _common(self, cfg: Any, params: int | None, env: dict[str, Any], weights: dict[str, Any] | None) -> dict:
        from vit_fast.model import count_flops

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

    def _report(
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
    ) -> dict[str, Any]:
        from vit_fast import __version__

        add_ratios(rows)
        now = _dt.datetime.now(_dt.timezone.utc)
        s = self.s
        return {
            "schema": SCHEMA_VERSION,
            "vit_fast_version": __version__,
            "created_utc": now.isoformat(timespec="seconds"),
            "run_id": now.strftime("%Y%m%dT%H%M%SZ"),
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
            return self._run_artifact(env)
        from vit_fast.export._common import plain_model, weights_record
        from vit_fast.loading import load_model

        s, device = self.s, self.device
        if isinstance(s.model, (str, Path)):
            loaded = load_model(str(s.model), backend="torch", seed=s.seed)
        else:
            loaded = plain_model(s.model, "bench")
        base = copy.deepcopy(loaded).float().eval().set_backend("torch")
        weights = weights_record(loaded)
        cfg = base.cfg
        ceilings = self._ceilings(env, self.dtypes)
        flusher = L2Flusher(device) if s.flush_l2 else None
        common = self._common(cfg, sum(p.numel() for p in base.parameters()), env, weights)
        common["flush_l2"] = bool(flusher)
        rows: list[dict[str, Any]] = []
        transfers: list[dict[str, Any]] = []
        bar = progress_bar(len(self.dtypes) * len(self.variants) * len(self.batches), "bench", s.progress)
        workdir = Path(tempfile.mkdtemp(prefix="vit-fast-bench-"))
        source = str(s.model) if isinstance(s.model, (str, Path)) else None
        try:
            with torch.no_grad():
                for dtype_name in self.dtypes:
                    self._onnx = OnnxExports(workdir, max(self.batches), s.onnx_exporter, source)
                    rows.extend(self._run_dtype(dtype_name, base, common, ceilings, flusher, workdir, bar, transfers))
                    _release(device)
        finally:
            bar.close()
            shutil.rmtree(workdir, ignore_errors=True)
        return self._report(env, cfg, ceilings, rows, flusher, self.dtypes, self.backends, transfers, weights)

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
        weight_bytes = _weight_bytes(common["params"], dtype)
        inputs = {b: _make_input(base.cfg, b, dtype, device, s.seed) for b in self.batches}
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
            for b in self.batches:
                row = {**base_row, "batch": b, "torch_max_abs_err_vs_fp32": fp32_err.get(b, 0.0)}
                row.update(self._floor(weight_bytes, common["flops_per_image"], b, ceilings, dtype_name))
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
                    row.update(self._measure(functools.partial(backend.prepare, inputs[b]), b, refs[b], flusher))
                out_rows.append(row)
                bar.update(1)
            if backend is not None:
                backend.close()
            del backend
            _release(device)
        del ref_model, inputs, refs
        return out_rows

    @staticmethod
    def _floor(weight_bytes: int | None, flops: int | None, batch: int, ceilings: dict, dtype_name: str) -> dict:
        fl = floor_ms(weight_bytes, float(flops) * batch, ceilings, dtype_name) if weight_bytes and flops else None
        return {"floor_ms": fl[0] if fl else None, "floor_bound": fl[1] if fl else None}

    def _run_artifact(self, env: dict[str, Any]) -> dict[str, Any]:
        """Time an existing artifact at every batch, by its own runtime, on inputs its metadata (else its ONNX
        graph) describes; there is no reference model, so no error column."""
        from vit_fast.config import ViTConfig
        from vit_fast.export import read_metadata
        from vit_fast.export._common import ENGINE_SUFFIXES, ArtifactError
        from vit_fast.export.runners import CPU_EP, CUDA_EP, open_artifact
        from vit_fast.model import VisionTransformer

        s, device, path = self.s, self.device, self.artifact
        cuda = device.type == "cuda"
        backend = "tensorrt" if path.suffix.lower() in ENGINE_SUFFIXES else "onnxruntime"
        if s.backends is not None and backend not in s.backends:
            raise BenchError(
                f"{str(path)!r} is timed by {backend}, its own runtime; backends {s.backends} do not include it"
            )
        meta = read_metadata(path) or {}
        try:
            runner = open_artifact(path, CUDA_EP if cuda else CPU_EP, threads=self.threads)
        except (ArtifactError, FileNotFoundError) as err:
            raise BenchError(str(err)) from err
        try:
            dtype_name = DTYPE_NAMES[runner.dtype]
            if s.dtypes is not None and dtype_name not in s.dtypes:
                raise BenchError(
                    f"{str(path)!r} computes in {dtype_name}, not {', '.join(s.dtypes)}: leave the dtype unset"
                )
            cfg = ViTConfig.from_dict(meta["config"]) if isinstance(meta.get("config"), dict) else None
            make_input = self._artifact_input(runner, meta, cfg, path)
            batches = self._artifact_batches(runner, meta)
            params = None
            if cfg is not None:
                with torch.device("meta"):
                    params = sum(p.numel() for p in VisionTransformer(cfg).parameters())
            ceilings = self._ceilings(env, [dtype_name])
            flusher = L2Flusher(device) if s.flush_l2 else None
            common = self._common(cfg, params, env, meta.get("weights"))
            weight_bytes = _weight_bytes(params, runner.dtype) if params else None
            base_row = {
                **common,
                "backend": backend,
                "label": path.name,
                "graph_mode": "none",
                "dtype": dtype_name,
                "weight_bytes": weight_bytes,
                "flush_l2": bool(flusher),
                "artifact": str(path),
                "verified": (meta.get("verification") or {}).get("passed"),
                "runtime": runner.runtime,
            }
            gen = torch.Generator().manual_seed(s.seed)
            rows = []
            bar = progress_bar(len(batches), "bench", s.progress)
            try:
                for b in batches:
                    x = make_input(b, gen).to(device)

                    def case(x: torch.Tensor = x) -> Case:
                        return Case(run=runner.prepare(x), fetch=lambda out: out.clone(), notes=runner.runtime)

                    row = {**base_row, "batch": b, "torch_max_abs_err_vs_fp32": None}
                    row.update(self._floor(weight_bytes, common["flops_per_image"], b, ceilings, dtype_name))
                    row.update(self._measure(case, b, None, flusher))
                    rows.append(row)
                    bar.update(1)
            finally:
                bar.close()
        finally:
            runner.close()
        self.batches = batches
        return self._report(env, cfg, ceilings, rows, flusher, [dtype_name], [backend], [], meta.get("weights"))

    @staticmethod
    def _artifact_input(runner: Any, meta: dict[str, Any], cfg: Any, path: Path) -> Callable[..., torch.Tensor]:
        """``make(batch, generator)`` -> one input batch for the artifact: images of its config's size (with its
        preprocessing front's uint8 layout), else of its graph's fixed input shape and type."""
        from vit_fast.export.graph import example_images

        if cfg is not None:
            c, (h, w), pre = cfg.in_chans, cfg.img_hw, meta.get("preprocess")
            return lambda b, gen: example_images(b, c, h, w, runner.dtype, pre, gen)
        session = getattr(runner, "session", None)
        shape = list(session.get_inputs()[0].shape[1:]) if session is not None else list(runner.image_shape)
        if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise BenchError(
                f"{str(path)!r} has no vit-fast metadata and its input shape {shape} is not fixed: export it with "
                "vit-fast (metadata beside it), or with a fixed image size"
            )
        if runner.input_dtype == torch.uint8:
            return lambda b, gen: torch.randint(0, 256, (b, *shape), generator=gen, dtype=torch.uint8)
        return lambda b, gen: torch.randn(b, *shape, generator=gen).to(runner.input_dtype)

    def _artifact_batches(self, runner: Any, meta: dict[str, Any]) -> list[int]:
        """The batches to time: those asked for (each must fit), else the defaults that fit the artifact."""
        lo, hi = runner.batch_range or tuple(meta.get("batch") or (1, 1 << 30))
        if self.s.batches is not None:
            outside = [b for b in self.s.batches if not lo <= b <= hi]
            if outside:
                raise BenchError(f"batch sizes {outside} lie outside the artifact's range [{lo}, {hi}]")
            for b in self.s.batches:
                runner.check_batch(b)
            return list(self.s.batches)
        fitting = [b for b in self.batches if lo <= b <= hi]
        if hi < max(self.batches) and hi not in fitting:  # the largest batch it takes stands in for larger ones
            fitting.append(hi)
        return fitting or [lo]

    def _measure(
        self, prepare: Callable[[], Case], batch: int, ref: torch.Tensor | None, flusher: L2Flusher | None
    ) -> dict:
        """Prepare the case, check its output against ``ref`` (when there is one), then sample its timing."""
        device = self.device
        try:
            case = prepare()
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


def _run(settings: BenchSettings, log: Callable[[str], None] | None) -> dict[str, Any]:
    threads = torch.get_num_threads()
    try:
        return Harness(settings, log=log).run()
    finally:
        torch.set_num_threads(threads)  # --threads is for this run only


def run_benchmark(settings: BenchSettings, log: Callable[[str], None] | None = None) -> tuple[dict[str, Any], dict]:
    """Run the benchmark and write its reports into ``settings.out_dir``; returns (report, paths).

    The folder is checked before anything runs. Files are ``bench_<model>.{json,md,csv,png}``; when an
    earlier run's files are there they stay, and this run's get its run id (``-<UTC time>``) in the name,
    unless ``settings.overwrite``."""
    from vit_fast.files import check_output_dir

    if settings.out_dir is None:
        raise BenchError("run_benchmark writes reports: give out_dir (or call vit_fast.bench.benchmark)")
    try:
        check_output_dir(settings.out_dir, "bench output folder")
    except ValueError as err:
        raise BenchError(str(err)) from None
    report = _run(settings, log)
    named = isinstance(settings.model, (str, Path))
    stem = f"bench_{model_slug(str(settings.model) if named else report['model'])}"
    paths = write_reports(report, settings.out_dir, stem, overwrite=settings.overwrite)
    return report, paths


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
) -> BenchResult:
    """Time ``model`` from Python and return the result; nothing is written (``result.write(folder)`` does).

    ``model``: a model name, a ``VisionTransformer`` (or the Hugging Face drop-in), or an ``.onnx`` /
    ``.plan`` artifact path. ``batch``, ``dtypes``, ``backends``: one value, a sequence, or a comma list
    (``"1,8"``, ``"bf16,fp16"``, ``"torch,onnxruntime"`` or ``"all"``); None takes the device's defaults.
    Each case is timed for at least ``min_samples`` calls and ``min_time_s`` seconds (defaults 100 and
    1 s on CPU, 200 and 1 s on a GPU), at most ``max_samples`` calls or about ``max_seconds``. ``threads``:
    CPU threads for every CPU backend (torch and ONNX Runtime alike), recorded in each row.

    Returns a :class:`BenchResult`: ``.rows`` (one dict per backend, dtype and batch, with ``n`` samples,
    median / p10 / p90 / p99 ms, images/s, the ratios), ``.report`` (the whole record), ``.markdown()``,
    ``.csv()``, ``.write(folder)``.
    """
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
    )
    return BenchResult(_run(settings, log))
