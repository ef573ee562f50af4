"""A demo step as a dict (name, status, summary, measured fields): a step that raises becomes a failed step
naming the error, and a step judged by ``verify`` reports its worst row and the labelled figures."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any


def step_record(name: str, status: str | bool, summary: str, **fields: Any) -> dict[str, Any]:
    """One step's record; ``status`` True / False stands for "ok" / "failed"."""
    if not isinstance(status, str):
        status = "ok" if status else "failed"
    return {"name": name, "status": status, "summary": summary, **fields}


def guarded_step(name: str, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run a step; an exception becomes a failed step naming it (never a made-up number)."""
    try:
        return fn(*args)
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0]
        return step_record(name, False, f"{type(err).__name__}: {first}".rstrip(": "), traceback=traceback.format_exc())


def verified_step(name: str, report: dict[str, Any], head: str, **fields: Any) -> dict[str, Any]:
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
    return step_record(
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
