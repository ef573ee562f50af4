"""Judge an artifact against eager PyTorch by the project's numerics rule (vit_fast.util.numerics): :func:`verify`
runs it beside the model in float64 (the reference) and in the artifact's dtype (eager's error), on every output
the artifact's graph returns. The report: :mod:`.verify_report`; the checks before any input: :mod:`.verify_checks`;
the whole method: docs/deploy.md.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.backend.env import git_commit, module_version
from vit_fast.util.batches import MAX_BATCH
from vit_fast.util.dtypes import DTYPE_NAMES, parse_dtype
from vit_fast.util.files import json_text, make_folders, staging_dir, write_json_atomic, write_new
from vit_fast.util.interrupts import INTERRUPTS, cut_note, held
from vit_fast.util.limits import check_batch_fits, forward_bytes
from vit_fast.util.numerics import FACTOR, FLOOR, compare
from vit_fast.util.progress import Remaining, Stages, duration, long_cpu_note, plural

from ._common import (
    ArtifactError,
    check_report_path,
    metadata_batch,
    metadata_path,
    plain_model,
    read_metadata,
    weights_record,
)
from .formats import FORMATS
from .graph import ExportGraph, example_images
from .runners import ModelRunner, Runner, open_artifact
from .verify_checks import (
    check_config,
    check_data,
    check_input_size,
    check_verify_batches,
    default_batches,
    output_plan,
    quicker_check,
)
from .verify_report import VerificationError, VerifyReport, VerifyRow, format_verification

__all__ = [
    "BACKEND_ARTIFACTS",
    "RECORDED_VERSIONS",
    "VerificationError",
    "VerifyOptions",
    "VerifyReport",
    "VerifyRow",
    "check_verify_batches",
    "default_batches",
    "draw_seed",
    "finish_report",
    "format_verification",
    "quicker_check",
    "record_verification",
    "stage_report",
    "start_report",
    "verify",
    "verify_options",
    "verify_staged",
]

#: names that verify() runs as a backend of the model itself rather than as a file
BACKEND_ARTIFACTS = ("triton",)
#: the packages whose versions a verification record names: torch, each export format's runtime modules (its
#: entry in :mod:`.formats`), triton
RECORDED_VERSIONS = ("torch", *dict.fromkeys(m for f in FORMATS.values() for m in f.modules), "triton")


@dataclass
class VerifyOptions:
    """How :func:`vit_fast.export.to_onnx` / ``to_tensorrt`` verify the artifact they stage (see :func:`verify`).

    ``batches``: the batch sizes verified (default: the minimum, an odd batch and the maximum of the artifact's
    range); each must lie in that range. Fewer batches make a quicker check of the same artifact: the range it
    is exported or built for (``batch=``) is unchanged."""

    batches: list[int] | None = None
    seed: int | None = None
    image_sizes: list[tuple[int, int]] | None = None
    provider: str | None = None
    data: tuple[torch.Tensor, torch.Tensor] | None = None
    print_table: bool = True
    #: a native-resolution model's (timm NaFlexVit, SigLIP 2) image-size mixes to verify at: batches of (h, w)
    #: pixels, each mix one batch (default: three, vit_fast.export.native.default_mixes)
    size_mixes: list[list[tuple[int, int]]] | None = None
    #: called with the report once the artifact it passed is published (``vit-fast export ... --json -`` prints it)
    on_published: Callable[[VerifyReport], Any] | None = None


def draw_seed() -> int:
    """A fresh seed for random inputs, recorded so that a failure can be reproduced with it."""
    return int.from_bytes(os.urandom(4), "little") >> 1


def _as_model(model: nn.Module | str) -> nn.Module:
    if isinstance(model, str):
        from vit_fast.interop.loading import load_model

        model = load_model(model, backend="torch")
    return plain_model(model, "verify")


def _copy(model: nn.Module, dtype: torch.dtype, device: str, dynamic: bool) -> nn.Module:
    m = copy.deepcopy(model).to(device=device, dtype=dtype).eval()
    m.set_backend("torch")
    if dynamic and not m.cfg.dynamic_img_size:
        m.cfg = m.cfg.replace(dynamic_img_size=True)
    return m


def verify(
    model: nn.Module | str,
    artifact: str | os.PathLike,
    batches: list[int] | None = None,
    dtype: torch.dtype | str | None = None,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
    image_sizes: list[tuple[int, int]] | None = None,
    seed: int | None = None,
    provider: str | None = None,
    json_path: str | os.PathLike | None = None,
    print_table: bool = True,
    raise_on_failure: bool = True,
    overwrite: bool = False,
    artifact_name: str | None = None,
    progress: bool | None = None,
    batch_flag: str = "--batch",
) -> VerifyReport:
    """Run ``artifact`` (``.onnx``, a TensorRT ``.plan`` / ``.engine``, or ``"triton"`` for our kernels backend) and
    compare each of its outputs with ``model``'s (a plain VisionTransformer, one that has ``as_vit_fast()``, a
    transformers ViT converted with ``vit_fast.from_hf``, or a model name). Prints a table and returns a
    :class:`VerifyReport`; raises :class:`VerificationError` naming the worst row when any row fails
    (``raise_on_failure``). Each argument and what raises before any work: docs/deploy.md, section The Python API."""
    if json_path is not None:
        own = None if str(artifact) in BACKEND_ARTIFACTS else artifact
        json_path = check_report_path(json_path, overwrite, artifact=own)
    model = _as_model(model)
    if str(artifact) in BACKEND_ARTIFACTS:
        meta = None
        runner: Runner = ModelRunner(model, str(artifact), parse_dtype(dtype) if dtype is not None else model.dtype)
    else:
        meta = read_metadata(artifact)
        runner = open_artifact(artifact, provider)
    if dtype is not None and parse_dtype(dtype) != runner.dtype:
        raise ValueError(
            f"{str(artifact)!r} holds a {DTYPE_NAMES[runner.dtype]} model, not {DTYPE_NAMES[parse_dtype(dtype)]}"
        )
    dtype = runner.dtype
    cfg = model.cfg
    check_config(meta, cfg, artifact)
    plan = output_plan(meta, runner, cfg.num_classes)
    preprocess = (meta or {}).get("preprocess")
    dynamic = bool(meta and meta.get("dynamic_size"))
    batch_range = metadata_batch(meta, artifact) if meta and meta.get("batch") else runner.batch_range
    batches_from = "--batch / batches="
    if batches is None:  # what the runner itself takes (a fixed batch, an engine's profile) comes first
        batches = default_batches(runner.batch_range or batch_range or (1, 8))
        batches_from = (
            f"the batch range {list(runner.batch_range)} of {str(artifact)!r}"
            if runner.batch_range
            else f"the field 'batch' {list(batch_range)} of metadata {str(metadata_path(artifact))!r}"
            if batch_range
            else "the default batches"
        )
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH:
            raise ValueError(f"batches must be ints >= 1 (at most {MAX_BATCH}), got {batches!r}")
        runner.check_batch(b)
    h, w = cfg.img_hw
    p = cfg.patch_size
    if image_sizes is None:
        image_sizes = [(h, w)] + ([(h + p, w + 2 * p), (max(p, h - p), w + p)] if dynamic else [])
    for size in image_sizes:
        if size != (h, w) and not (dynamic or cfg.dynamic_img_size):
            raise ValueError(f"{str(artifact)!r} takes {h}x{w} images only (exported without dynamic_size)")
    check_input_size(runner, cfg.in_chans, image_sizes, preprocess, artifact)
    if data is not None:
        check_data(data, preprocess, [k for k, _ in plan], cfg.in_chans)
    # the largest case, before any input is made: its float64 reference alone holds this much
    b, (hh, ww) = max(((b, s) for b in batches for s in image_sizes), key=lambda c: forward_bytes(cfg, c[0], *c[1], 8))
    check_batch_fits(
        cfg,
        b,
        hh,
        ww,
        8,
        f"verifying {str(artifact)!r} (batches from {batches_from}), whose float64 reference",
        "verify with smaller batches (--batch 1,3; Python: batches=[1, 3])",
    )

    kinds = [k for k, _ in plan]
    eager_device = "cuda" if torch.cuda.is_available() else "cpu"
    ref_graph = ExportGraph(_copy(model, torch.float64, "cpu", dynamic), kinds, preprocess).to(torch.float64)
    eager_graph = ExportGraph(_copy(model, dtype, eager_device, dynamic), kinds, preprocess).to(eager_device, dtype)
    seed = draw_seed() if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    outputs = [name for _, name in plan]
    report = start_report(model, artifact_name or str(artifact), runner.runtime, dtype, seed, outputs, meta, preprocess)
    # every batch at the first size, the middle batch at the others
    cases = [(b, image_sizes[0]) for b in batches] + [(batches[len(batches) // 2], s) for s in image_sizes[1:]]
    stages = Stages("vit-fast verify", print_table if progress is None else progress)
    work = [(b + 2) * hh * ww for b, (hh, ww) in cases]  # a case costs about its pixels, plus a fixed start
    if eager_device == "cpu":
        from vit_fast.model.vit import count_flops

        images = sum(b * hh * ww for b, (hh, ww) in cases) / (h * w) + (len(data[1]) if data is not None else 0)
        note = long_cpu_note(
            3 * images * count_flops(cfg) / 1e9,  # the float64 reference, eager and the artifact each run it
            f"verifying {report.artifact} at batches {','.join(map(str, batches))}",
            quicker_check(batches, batch_range or runner.batch_range, batch_flag),
        )
        if note:
            stages.note(note)
    remaining = Remaining(work)

    def save() -> None:  # the rows so far, after each case: an interrupt or a kill keeps what finished
        if json_path is not None:
            with held():
                write_json_atomic(report.to_dict(), json_path)

    report.complete = False
    with torch.no_grad(), contextlib.closing(runner):
        try:
            for i, (b, (hh, ww)) in enumerate(cases):
                started = time.perf_counter()
                stages.note(
                    f"batch {b} at {hh}x{ww} ({i + 1}/{len(cases)}): float64 reference, eager and {runner.runtime} ..."
                )
                runner.check_batch(b)
                x = example_images(b, cfg.in_chans, hh, ww, dtype, preprocess, gen)
                ref = ref_graph.all_outputs(x if preprocess else x.double())
                eager = eager_graph.all_outputs(x.to(eager_device))
                outs = runner.run_all(x)
                rows = []
                for kind, name in plan:
                    if tuple(outs[name].shape) != tuple(ref[kind].shape):
                        raise ArtifactError(
                            f"artifact output {name!r} has shape {tuple(outs[name].shape)}, eager's {kind} "
                            f"{tuple(ref[kind].shape)}"
                        )
                    logits = kind == "logits" and cfg.num_classes > 0
                    row = compare(outs[name], eager[kind].cpu(), ref[kind], dtype, logits)
                    rows.append(VerifyRow(output=name, batch=b, height=hh, width=ww, **row))
                report.rows += rows
                took = duration(time.perf_counter() - started)
                remaining.finished(i)
                worst = max(rows, key=lambda r: r.ratio)
                verdict = (
                    f"{'ok' if all(r.passed for r in rows) else 'FAILED'}, max|err| {worst.max_abs_err:.2e} "
                    f"{'within' if worst.passed else 'OUTSIDE'} bound {worst.bound:.2e}"
                    + (f" (worst output: {worst.output})" if len(rows) > 1 else "")
                )
                stages.note(f"batch {b} at {hh}x{ww}: done ({took}): {verdict}{remaining.text()}")
                save()
            if data is not None:
                stages.note(f"accuracy on {plural(len(data[1]), 'labelled image')} ...")
                logits_name = dict(plan)["logits"]
                report.accuracy = _accuracy(
                    runner, logits_name, eager_graph, eager_device, data, dtype, preprocess, batch_range or (1, 8)
                )
        except INTERRUPTS as err:
            done = len({(r.batch, r.height, r.width) for r in report.rows})
            report.interrupted = cut_note(err, done, len(cases), "case")
            save()
            where = f"; the finished cases are in {json_path}" if json_path is not None and done else ""
            stages.note(f"{report.interrupted}{where}")
            raise
    report.complete = True
    finish_report(report, print_table, json_path, raise_on_failure)
    return report


def start_report(
    model: nn.Module,
    artifact_name: str,
    runtime: str,
    dtype: torch.dtype,
    seed: int,
    outputs: list[str],
    meta: dict[str, Any] | None,
    preprocess: dict[str, Any] | None = None,
) -> VerifyReport:
    """A report with no rows yet: the artifact (as ``artifact_name``) and what runs it, its dtype and floor, the
    seed, the outputs compared, the model's weights and those the artifact's metadata records, its preprocessing
    front, when, and with which versions and commit."""
    return VerifyReport(
        artifact=artifact_name,
        runtime=runtime,
        dtype=DTYPE_NAMES[dtype],
        floor=FLOOR[dtype],
        seed=seed,
        outputs=outputs,
        preprocess=preprocess,
        weights=weights_record(model),
        artifact_weights=(meta or {}).get("weights"),
        created_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        versions={m: module_version(m) for m in RECORDED_VERSIONS},
        git_commit=git_commit(),
    )


def finish_report(report: VerifyReport, print_table: bool, json_path: Path | None, raise_on_failure: bool) -> None:
    """Print the report's table (``print_table``), write its JSON (``json_path``), then raise
    :class:`VerificationError` naming the worst row and the seed that reproduces it when a row failed
    (``raise_on_failure``)."""
    if print_table:
        print(report.format_table(), file=sys.stdout, flush=True)
    if json_path is not None:
        write_json_atomic(report.to_dict(), json_path)
    if raise_on_failure and not report.passed:
        r = report.worst()
        where = (
            f"images {', '.join(f'{a}x{b}' for a, b in r.images)}"
            if r.images is not None
            else f"batch {r.batch} ({r.height}x{r.width})"
        )
        raise VerificationError(
            f"verification of {report.artifact!r} failed: worst is output {r.output!r} at {where}: "
            f"max|err| {r.max_abs_err:.3e} > bound {r.bound:.3e} "
            f"({FACTOR:g}x eager {r.eager_max_abs_err:.3e} + floor); reproduce with seed={report.seed}",
            report,
        )


def verify_options(
    verify: bool | VerifyOptions | None, report: Any = None, batch_range: tuple[int, int] | None = None
) -> VerifyOptions | None:
    """An exporter's ``verify=`` argument as options (None: no verification); ``report=`` needs verification;
    ``VerifyOptions.batches`` must lie in ``batch_range``, the artifact's ``(min, max)``, where given."""
    options = VerifyOptions() if verify is True else (verify or None)
    if options is not None and not isinstance(options, VerifyOptions):
        raise TypeError(f"verify must be True, False or a VerifyOptions, got {verify!r}")
    if report is not None and options is None:
        raise ValueError("report= is the verification report: pass verify=True with it")
    if options is not None and batch_range is not None:
        check_verify_batches(options.batches, batch_range, "VerifyOptions(batches=...)")
    return options


def verify_staged(model: Any, staged: Path, options: VerifyOptions, final: Path) -> VerifyReport:
    """Verify a staged artifact (named in the report by its ``final`` path); raises VerificationError on failure."""
    return verify(
        model,
        staged,
        batches=options.batches,
        data=options.data,
        image_sizes=options.image_sizes,
        seed=options.seed,
        provider=options.provider,
        print_table=options.print_table,
        artifact_name=str(final),
        batch_flag="--verify-batch",
    )


def stage_report(stack: contextlib.ExitStack, report: VerifyReport, path: Path) -> tuple[Path, Path]:
    """Write ``report`` as JSON into a staging folder beside ``path`` (held open by ``stack``); returns the
    ``(staged file, target)`` pair to publish. The report's folder is made here (checked up front)."""
    make_folders(path.parent, "report")
    staged = stack.enter_context(staging_dir(path)) / path.name
    write_new(staged, json_text(report.to_dict()))
    return staged, path


def record_verification(
    stack: contextlib.ExitStack,
    result: VerifyReport,
    meta: dict[str, Any],
    write_meta: Callable[[dict[str, Any]], Any],
    report: Path | None,
    moves: list[tuple[Path, Path]],
) -> None:
    """Record a staged artifact's passing ``result`` in its metadata ``meta`` (written again by ``write_meta``) and,
    with a ``report`` path, stage the report (:func:`stage_report`) among the ``moves`` to publish."""
    meta["verification"] = result.record()
    write_meta(meta)
    if report is not None:
        moves.append(stage_report(stack, result, report))


def _accuracy(
    runner: Runner,
    logits_name: str,
    eager_graph: nn.Module,
    device: str,
    data: tuple[torch.Tensor, torch.Tensor],
    dtype: torch.dtype,
    preprocess: dict[str, Any] | None,
    batch_range: tuple[int, int],
) -> dict[str, Any]:
    images, labels = data
    chunk = batch_range[1]
    eager_pred, art_pred = [], []
    for start in range(0, images.shape[0], chunk):
        x = images[start : start + chunk]
        x = x if preprocess else x.to(dtype)
        if x.shape[0] < batch_range[0]:  # pad a short last chunk up to the profile's minimum
            x = torch.cat([x, x[-1:].expand(batch_range[0] - x.shape[0], *x.shape[1:])])
        n = min(chunk, images.shape[0] - start)
        eager_pred.append(eager_graph.all_outputs(x.to(device))["logits"].cpu()[:n].argmax(-1))
        art_pred.append(runner.run_all(x)[logits_name][:n].argmax(-1))
    e, a, y = torch.cat(eager_pred), torch.cat(art_pred), labels.cpu()
    return {
        "n": int(y.numel()),
        "eager_accuracy": (e == y).double().mean().item(),
        "artifact_accuracy": (a == y).double().mean().item(),
        "top1_agreement": (e == a).double().mean().item(),
    }
