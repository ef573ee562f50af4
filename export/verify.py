"""Judge an artifact against eager PyTorch by the project's numerics rule (vit_fast.numerics).

The artifact is run by one of the runners in ``runners.py``. Reference: the model in float64 on
CPU. Eager error: the model in the artifact's dtype (torch backend; on the GPU where there is one).
An artifact passes when, on every batch and image size, its max |error| against the reference is
at most 2x eager's plus a floor (``FLOOR[dtype]`` times the reference's largest magnitude, at
least 1). Relative error, cosine similarity and top-1 agreement are reported beside it.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from vit_fast.dtypes import DTYPE_NAMES, parse_dtype
from vit_fast.files import write_json_atomic
from vit_fast.numerics import FACTOR, FLOOR, RULE, compare

from ._common import ArtifactError, read_metadata
from .runners import ModelRunner, Runner, open_artifact

#: names that verify() runs as a backend of the model itself rather than as a file
BACKEND_ARTIFACTS = ("triton",)


class VerificationError(AssertionError):
    """An artifact's error exceeded its bound; ``.report`` holds every row."""

    def __init__(self, message: str, report: VerifyReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class VerifyRow:
    """One comparison: one output at one batch size and image size. Errors are against the float64 reference."""

    output: str
    batch: int
    height: int
    width: int
    max_abs_err: float
    eager_max_abs_err: float
    bound: float
    rel_err: float
    eager_rel_err: float
    cosine: float
    top1_agreement: float | None
    eager_top1_agreement: float | None
    passed: bool

    @property
    def ratio(self) -> float:
        """Error over bound: > 1 fails."""
        return self.max_abs_err / self.bound if self.bound > 0 else float("inf")


@dataclass
class VerifyReport:
    """Everything :func:`verify` measured; ``passed`` is True when every row passed."""

    artifact: str
    runtime: str
    dtype: str
    rows: list[VerifyRow] = field(default_factory=list)
    accuracy: dict[str, Any] | None = None
    rule: str = RULE
    floor: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    def worst(self) -> VerifyRow:
        return max(self.rows, key=lambda r: r.ratio)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def format_table(self) -> str:
        head = (
            f"{'output':<9} {'batch':>5} {'size':>9} {'max|err|':>10} {'eager':>10} {'bound':>10} "
            f"{'rel err':>9} {'cosine':>10} {'top1':>6} {'ok':>4}"
        )
        lines = [f"{self.artifact}  ({self.runtime}, {self.dtype})", head, "-" * len(head)]
        for r in self.rows:
            top1 = "-" if r.top1_agreement is None else f"{r.top1_agreement:.0%}"
            lines.append(
                f"{r.output:<9} {r.batch:>5} {f'{r.height}x{r.width}':>9} {r.max_abs_err:>10.3e} "
                f"{r.eager_max_abs_err:>10.3e} {r.bound:>10.3e} {r.rel_err:>9.2e} {r.cosine:>10.7f} {top1:>6} "
                f"{'yes' if r.passed else 'NO':>4}"
            )
        if self.accuracy:
            a = self.accuracy
            lines.append(
                f"labelled data ({a['n']} images): eager accuracy {a['eager_accuracy']:.2%}, artifact accuracy "
                f"{a['artifact_accuracy']:.2%}, top-1 agreement {a['top1_agreement']:.2%}"
            )
        lines.append(("PASSED" if self.passed else "FAILED") + f": {self.rule}, floor {self.floor:g}")
        return "\n".join(lines)


def default_batches(batch_range: tuple[int, int]) -> list[int]:
    """Batch 1 (or the minimum), an odd batch inside the range, and the maximum."""
    lo, hi = batch_range
    odd = next((b for b in (3, 5, 7) if lo < b < hi), None)
    if odd is None:
        odd = next((b for b in range(lo + 1, hi) if b % 2), lo)
    return sorted({lo, odd, hi})


def _as_model(model: nn.Module | str) -> nn.Module:
    from vit_fast.model import VisionTransformer

    if isinstance(model, str):
        from vit_fast.loading import load_model

        model = load_model(model, backend="torch")
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"verify needs a vit_fast.VisionTransformer (or a model name), got {type(model).__name__}")
    return model


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
) -> VerifyReport:
    """Run ``artifact`` (``.onnx``, a TensorRT ``.plan`` / ``.engine``, or ``"triton"`` for our kernels
    backend) and compare it with ``model``.

    - ``batches``: default batch 1, an odd batch and the maximum of the batch range in the
      metadata beside the artifact (``(1, 8)`` without metadata, or the engine's profile).
    - ``dtype``: the artifact's dtype (read from the artifact; a different value raises).
    - ``image_sizes``: ``(H, W)`` pixels; every batch runs at the first, the middle batch at the
      others. Default: the native size, plus two more for artifacts exported with ``dynamic_size=True``.
    - ``data=(images [N, C, H, W] float, labels [N] int64)``: also accuracy of eager and of the
      artifact and their top-1 agreement (reported, not a pass criterion).
    - ``seed``: inputs are fresh random normal images each call unless a seed is given.

    Prints a table (``print_table``), writes the report as JSON to ``json_path`` and returns a
    :class:`VerifyReport`; raises :class:`VerificationError` naming the worst row when any row
    fails (``raise_on_failure``). Unreadable artifacts raise before any work, naming the file.
    """
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
    if meta and isinstance(meta.get("config"), dict):
        theirs = {k: v for k, v in meta["config"].items() if k != "dynamic_img_size"}
        ours = {k: v for k, v in cfg.to_dict().items() if k != "dynamic_img_size"}
        diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        if diff:
            raise ValueError(
                f"{str(artifact)!r} was exported from another architecture: config fields {diff} differ "
                f"(artifact {[theirs.get(k) for k in diff]}, model {[ours.get(k) for k in diff]})"
            )
    dynamic = bool(meta and meta.get("dynamic_size"))
    batch_range = tuple(meta["batch"]) if meta and meta.get("batch") else runner.batch_range
    if batches is None:  # what the runner itself takes (a fixed batch, an engine's profile) comes first
        batches = default_batches(runner.batch_range or batch_range or (1, 8))
    for b in batches:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"batches must be ints >= 1, got {batches!r}")
        runner.check_batch(b)
    h, w = cfg.img_hw
    p = cfg.patch_size
    if image_sizes is None:
        image_sizes = [(h, w)] + ([(h + p, w + 2 * p), (max(p, h - p), w + p)] if dynamic else [])
    for size in image_sizes:
        if size != (h, w) and not (dynamic or cfg.dynamic_img_size):
            raise ValueError(f"{str(artifact)!r} takes {h}x{w} images only (exported without dynamic_size)")
    if data is not None:
        images, labels = data
        if images.ndim != 4 or labels.ndim != 1 or images.shape[0] != labels.shape[0] or images.shape[0] == 0:
            raise ValueError(
                f"data must be (images [N, C, H, W], labels [N]) with N >= 1, got {tuple(images.shape)} and "
                f"{tuple(labels.shape)}"
            )

    eager_device = "cuda" if torch.cuda.is_available() else "cpu"
    ref_model = _copy(model, torch.float64, "cpu", dynamic)
    eager_model = _copy(model, dtype, eager_device, dynamic)
    gen = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    report = VerifyReport(artifact=str(artifact), runtime=runner.runtime, dtype=DTYPE_NAMES[dtype], floor=FLOOR[dtype])
    # every batch at the first size, the middle batch at the others
    cases = [(b, image_sizes[0]) for b in batches] + [(batches[len(batches) // 2], s) for s in image_sizes[1:]]
    with torch.no_grad():
        for b, (hh, ww) in cases:
            runner.check_batch(b)
            x = torch.randn(b, cfg.in_chans, hh, ww, generator=gen).to(dtype)
            ref = ref_model(x.double())
            eager = eager_model(x.to(eager_device)).cpu()
            out = runner.run(x)
            if tuple(out.shape) != tuple(ref.shape):
                raise ArtifactError(f"artifact output shape {tuple(out.shape)} differs from eager's {tuple(ref.shape)}")
            report.rows.append(
                VerifyRow(
                    output=runner.output_name,
                    batch=b,
                    height=hh,
                    width=ww,
                    **compare(out, eager, ref, dtype, cfg.num_classes > 0),
                )
            )
        if data is not None:
            report.accuracy = _accuracy(runner, eager_model, eager_device, data, dtype, batch_range or (1, 8))
    if print_table:
        print(report.format_table(), file=sys.stdout, flush=True)
    if json_path is not None:
        write_json_atomic(report.to_dict(), json_path)
    if raise_on_failure and not report.passed:
        r = report.worst()
        raise VerificationError(
            f"verification of {str(artifact)!r} failed: worst is output {r.output!r} at batch {r.batch} "
            f"({r.height}x{r.width}): max|err| {r.max_abs_err:.3e} > bound {r.bound:.3e} "
            f"({FACTOR:g}x eager {r.eager_max_abs_err:.3e} + floor)",
            report,
        )
    return report


def _accuracy(
    runner: Runner,
    eager_model: nn.Module,
    device: str,
    data: tuple[torch.Tensor, torch.Tensor],
    dtype: torch.dtype,
    batch_range: tuple[int, int],
) -> dict[str, Any]:
    images, labels = data
    chunk = batch_range[1]
    eager_pred, art_pred = [], []
    for start in range(0, images.shape[0], chunk):
        x = images[start : start + chunk].to(dtype)
        if x.shape[0] < batch_range[0]:  # pad a short last chunk up to the profile's minimum
            x = torch.cat([x, x[-1:].expand(batch_range[0] - x.shape[0], *x.shape[1:])])
        n = min(chunk, images.shape[0] - start)
        eager_pred.append(eager_model(x.to(device)).cpu()[:n].argmax(-1))
        art_pred.append(runner.run(x)[:n].argmax(-1))
    e, a, y = torch.cat(eager_pred), torch.cat(art_pred), labels.cpu()
    return {
        "n": int(y.numel()),
        "eager_accuracy": (e == y).double().mean().item(),
        "artifact_accuracy": (a == y).double().mean().item(),
        "top1_agreement": (e == a).double().mean().item(),
    }
