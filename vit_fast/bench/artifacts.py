"""Timing an existing artifact: an ONNX file or a TensorRT engine named as the model is timed at every
batch by its own runtime (ONNX Runtime, TensorRT) on inputs its metadata (else its ONNX graph) describes.
There is no reference model, so rows carry no error column. :class:`vit_fast.bench.harness.Harness`
calls :func:`run_artifact` when :func:`artifact_path` names one; the rows, floors and report come from
the harness, so artifact rows and model rows read the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vit_fast.util.dtypes import DTYPE_NAMES

from .backends import Case
from .settings import BenchError
from .timing import L2Flusher

if TYPE_CHECKING:
    from .harness import Harness


def artifact_path(model: Any) -> Path | None:
    """The artifact to time when ``model`` names an ONNX file or a TensorRT engine, else None."""
    from vit_fast.export.formats import format_of

    if isinstance(model, (str, Path)) and format_of(model) is not None:
        return Path(model)
    return None


def run_artifact(harness: Harness, env: dict[str, Any]) -> dict[str, Any]:
    """Time an existing artifact at every batch, by its own runtime, on inputs its metadata (else its ONNX
    graph) describes; there is no reference model, so no error column."""
    from vit_fast.export import ArtifactError, read_metadata
    from vit_fast.export.formats import format_of
    from vit_fast.export.runners import CPU_EP, CUDA_EP, open_artifact
    from vit_fast.model.config import ViTConfig
    from vit_fast.model.vit import VisionTransformer

    s, device, path = harness.s, harness.device, harness.artifact
    cuda = device.type == "cuda"
    backend = format_of(path).bench_backend
    if s.backends is not None and backend not in s.backends:
        raise BenchError(
            f"{str(path)!r} is timed by {backend}, its own runtime; backends {s.backends} do not include it"
        )
    meta = read_metadata(path) or {}
    try:
        runner = open_artifact(path, CUDA_EP if cuda else CPU_EP, threads=harness.threads)
    except (ArtifactError, FileNotFoundError) as err:
        raise BenchError(str(err)) from err
    try:
        dtype_name = DTYPE_NAMES[runner.dtype]
        if s.dtypes is not None and dtype_name not in s.dtypes:
            raise BenchError(
                f"{str(path)!r} computes in {dtype_name}, not {', '.join(s.dtypes)}: leave the dtype unset"
            )
        cfg = ViTConfig.from_dict(meta["config"]) if isinstance(meta.get("config"), dict) else None
        record = meta.get("verification")  # a hand-edited file may hold anything here
        make_input = artifact_input(runner, meta, cfg, path)
        batches = artifact_batches(harness, runner, meta)
        params = None
        if cfg is not None:
            with torch.device("meta"):
                params = sum(p.numel() for p in VisionTransformer(cfg).parameters())
        ceilings = harness.ceilings(env, [dtype_name])
        flusher = L2Flusher(device) if s.flush_l2 else None
        common = harness.row_fields(cfg, params, env, meta.get("weights"))
        weight_bytes = harness.weight_bytes(params, runner.dtype) if params else None
        base_row = {
            **common,
            "backend": backend,
            "label": path.name,
            "graph_mode": "none",
            "dtype": dtype_name,
            "weight_bytes": weight_bytes,
            "flush_l2": bool(flusher),
            "artifact": str(path),
            "verified": record.get("passed") if isinstance(record, dict) else None,
            "runtime": runner.runtime,
        }
        gen = torch.Generator().manual_seed(s.seed)
        rows: list[dict[str, Any]] = []
        harness.batches = batches
        harness.cases = [(dtype_name, path.name, b) for b in batches]
        harness.start_cases(common["flops_per_image"])
        harness.partial_report = lambda done: harness.report(
            env, cfg, ceilings, list(done), flusher, [dtype_name], [backend], [], meta.get("weights"), False
        )
        try:
            for b in batches:
                started = time.perf_counter()
                x = make_input(b, gen).to(device)

                def case(x: torch.Tensor = x) -> Case:
                    return Case(run=runner.prepare(x), fetch=lambda out: out.clone(), notes=runner.runtime)

                row = {**base_row, "batch": b, "torch_max_abs_err_vs_fp32": None}
                row.update(harness.floor(weight_bytes, common["flops_per_image"], b, ceilings, dtype_name))
                harness.bar.set_postfix_str(f"{dtype_name} {path.name} batch {b}")
                row.update(harness.measure(case, b, None, flusher))
                harness.case_done(rows, row, time.perf_counter() - started)
        finally:
            harness.bar.close()
    finally:
        runner.close()
    return harness.report(env, cfg, ceilings, rows, flusher, [dtype_name], [backend], [], meta.get("weights"))


def artifact_input(runner: Any, meta: dict[str, Any], cfg: Any, path: Path) -> Callable[..., torch.Tensor]:
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


def artifact_batches(harness: Harness, runner: Any, meta: dict[str, Any]) -> list[int]:
    """The batches to time: those asked for (each must fit), else the defaults that fit the artifact."""
    from vit_fast.export import metadata_batch

    lo, hi = runner.batch_range or (metadata_batch(meta, runner.path) if meta.get("batch") else (1, 1 << 30))
    if harness.s.batches is not None:
        outside = [b for b in harness.s.batches if not lo <= b <= hi]
        if outside:
            raise BenchError(f"batch sizes {outside} lie outside the artifact's range [{lo}, {hi}]")
        for b in harness.s.batches:
            runner.check_batch(b)
        return list(harness.s.batches)
    fitting = [b for b in harness.batches if lo <= b <= hi]
    if hi < max(harness.batches) and hi not in fitting:  # the largest batch it takes stands in for larger ones
        fitting.append(hi)
    return fitting or [lo]


__all__ = ["artifact_batches", "artifact_input", "artifact_path", "run_artifact"]
