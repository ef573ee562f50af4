"""What :func:`vit_fast.export.verify.verify` measured: one row per output, batch and image size, the report
(JSON, the table it prints, the compact record an artifact's metadata keeps) and that record shown as lines."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from vit_fast.util.numerics import RULE

from ._common import vit_fast_version


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
    #: a native-resolution artifact's row: every image of the batch, (h, w) pixels, in order (height and width are
    #: then the largest of them); None for an artifact that takes one image size per batch
    images: list[tuple[int, int]] | None = None

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
    seed: int | None = None
    outputs: list[str] = field(default_factory=list)
    preprocess: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None
    artifact_weights: dict[str, Any] | None = None
    created_utc: str = ""
    versions: dict[str, str | None] = field(default_factory=dict)
    git_commit: str = ""
    #: False while the cases are still running (the JSON written after each one says so), and in a report an
    #: interrupt cut; ``interrupted`` then says after how many cases
    complete: bool = True
    interrupted: str | None = None

    @property
    def passed(self) -> bool:
        """Every case ran and every row passed (a report cut short has not passed, whatever its rows say)."""
        return self.complete and bool(self.rows) and all(r.passed for r in self.rows)

    def worst(self) -> VerifyRow:
        return max(self.rows, key=lambda r: r.ratio)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        out["vit_fast_version"] = vit_fast_version()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def record(self) -> dict[str, Any]:
        """The compact record an artifact's metadata keeps: whether and how it was verified."""
        w = self.worst()
        mixes = [[list(size) for size in r.images] for r in self.rows if r.images is not None]
        mixes = [m for i, m in enumerate(mixes) if m not in mixes[:i]]
        return {
            "passed": self.passed,
            "rule": self.rule,
            "floor": self.floor,
            "worst": {
                "output": w.output,
                "batch": w.batch,
                "height": w.height,
                "width": w.width,
                "max_abs_err": w.max_abs_err,
                "bound": w.bound,
                "ratio": w.ratio,
            },
            "outputs": list(self.outputs),
            "batches": sorted({r.batch for r in self.rows}),
            "image_sizes": sorted({(r.height, r.width) for r in self.rows}),
            **({"size_mixes": mixes} if mixes else {}),
            "seed": self.seed,
            "date_utc": self.created_utc,
            "runtime": self.runtime,
            "dtype": self.dtype,
            "weights": self.weights,
            "versions": {"vit_fast": vit_fast_version(), **self.versions},
            "git_commit": self.git_commit,
        }

    def format_table(self) -> str:
        head = (
            f"{'output':<17} {'batch':>5} {'size':>9} {'max|err|':>10} {'eager':>10} {'bound':>10} "
            f"{'rel err':>9} {'cosine':>10} {'top1':>6} {'ok':>4}"
        )
        weights = f"; weights {self.weights['description']}" if self.weights else ""
        lines = [f"{self.artifact}  ({self.runtime}, {self.dtype}; seed {self.seed}{weights})", head, "-" * len(head)]
        for r in self.rows:
            top1 = "-" if r.top1_agreement is None else f"{r.top1_agreement:.0%}"
            lines.append(
                f"{r.output:<17} {r.batch:>5} {f'{r.height}x{r.width}':>9} {r.max_abs_err:>10.3e} "
                f"{r.eager_max_abs_err:>10.3e} {r.bound:>10.3e} {r.rel_err:>9.2e} {r.cosine:>10.7f} {top1:>6} "
                f"{'yes' if r.passed else 'NO':>4}"
                + (f"  images {_mix_text(r.images)}" if r.images is not None else "")
            )
        if self.accuracy:
            a = self.accuracy
            lines.append(
                f"labelled data ({a['n']} images): eager accuracy {a['eager_accuracy']:.2%}, artifact accuracy "
                f"{a['artifact_accuracy']:.2%}, top-1 agreement {a['top1_agreement']:.2%}"
            )
        lines.append(("PASSED" if self.passed else "FAILED") + f": {self.rule}, floor {self.floor:g}")
        return "\n".join(lines)


def format_verification(record: dict[str, Any] | None) -> str:
    """An artifact's verification record (``read_metadata(path)["verification"]``) as lines to show. A record
    that is not what vit-fast writes (a string, a list, fields of other types: a hand-edited or damaged file)
    is shown as unreadable, with how to check the artifact again, never as an exception."""
    if not record:
        return "verification: none recorded (the artifact was written without verification)"
    unreadable = (
        "verification: the recorded verification is unreadable ({}): the metadata beside the artifact was edited "
        "or damaged; run vit-fast verify MODEL ARTIFACT to check the artifact again, or export it again"
    )
    if not isinstance(record, dict):
        return unreadable.format(f"a {type(record).__name__}, not an object")
    try:
        return _format_record(record)
    except (TypeError, ValueError, AttributeError) as err:
        return unreadable.format(f"{type(err).__name__}: {err}")


def _mix_text(images: Any) -> str:
    return "{" + ", ".join(f"{h}x{w}" for h, w in images) + "}"


def _format_record(record: dict[str, Any]) -> str:
    w = record.get("worst") or {}
    sizes = ", ".join(f"{h}x{w_}" for h, w_ in record.get("image_sizes") or [])
    versions = ", ".join(f"{k} {v}" for k, v in (record.get("versions") or {}).items() if v)
    weights = (record.get("weights") or {}).get("description", "not recorded")
    return "\n".join(
        [
            f"verification: {'PASSED' if record.get('passed') else 'FAILED'} on {record.get('date_utc') or '?'} "
            f"({record.get('runtime', '?')}, {record.get('dtype', '?')})",
            f"  rule: {record.get('rule', '?')}",
            f"  worst: {w.get('output', '?')} at batch {w.get('batch', '?')} ({w.get('height', '?')}x"
            f"{w.get('width', '?')}): max|err| {w.get('max_abs_err', float('nan')):.3e} <= bound "
            f"{w.get('bound', float('nan')):.3e} (ratio {w.get('ratio', float('nan')):.3f})"
            if w
            else "  worst: not recorded",
            f"  outputs {', '.join(record.get('outputs') or []) or '?'}; batches "
            f"{', '.join(map(str, record.get('batches') or []))}; sizes {sizes}; seed {record.get('seed')}",
            *(
                [f"  size mixes: {'; '.join(_mix_text(m) for m in mixes)}"]
                if (mixes := record.get("size_mixes"))
                else []
            ),
            f"  weights: {weights}",
            f"  versions: {versions}; commit {record.get('git_commit', '?')}",
        ]
    )
