"""``run_doctor``: every check in order, and ``report.json`` / ``report.md`` rewritten as each ends, so an
interrupt keeps the checks that ended; the report's verdict and exit code."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vit_fast.backend.env import collect_environment
from vit_fast.base.interpret import interpreter_enabled
from vit_fast.util.files import MARKER_KEY, seal_markdown, write_atomic, write_json_atomic
from vit_fast.util.progress import Stages

from .base import CheckLog, check_record, failed_record, note_check
from .checks import compiled_checks, dtypes_for, gpu_skipped
from .environment import INTERPRETER_CHECK, environment_checks
from .interpreter import interpreter_checks, run_in_interpreter
from .settings import DoctorSettings


def _resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} asked for, but no CUDA GPU is visible to torch: use cpu or auto")
    return device


def _markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# vit-fast doctor",
        "",
        f"{report['created']} · vit-fast {report[MARKER_KEY]} · torch {env['torch']} · triton {env['triton']} · "
        f"{env['device_name']} · model `{report['model']['name']}`",
        "",
        "| section | check | status | result |",
        "|---|---|---|---|",
    ]
    for c in report["checks"]:
        summary = c["summary"].replace("|", "\\|")
        lines.append(f"| {c['section']} | {c['name']} | {c['status']} | {summary} |")
    verdict = "FAILED: " + ", ".join(report["failed"]) if report["failed"] else "OK"
    if not report.get("complete", True):  # rewritten as each check ends; or cut by an interrupt
        ran = f"{len(report['checks'])} checks so far"
        verdict = f"INCOMPLETE ({report['interrupted'] or ran}; {verdict.lower()} so far)"
    lines += ["", f"**{verdict}** (exit code {report['exit_code']}), {report['wall_s']:.1f} s.", ""]
    if report["skipped"]:
        lines += ["Skipped:", ""] + [f"- {name}: {why}" for name, why in report["skipped"].items()] + [""]
    return "\n".join(lines)


def run_doctor(s: DoctorSettings) -> dict[str, Any]:
    """Run every check, write ``report.json`` and ``report.md`` into ``s.out``; returns the report, whose
    ``exit_code`` is 1 when a check failed, else 0 (warnings and skipped checks do not fail). The two files are
    rewritten as each check ends (``complete: false``); Ctrl-C or SIGTERM writes them once more with the checks that
    ended and ``interrupted`` saying so, then lets the interrupt go on."""
    from vit_fast.util import interrupts

    start = time.perf_counter()
    device = _resolve_device(s.device)
    cuda = device.type == "cuda"
    environment = collect_environment(device if cuda else torch.device("cpu"))
    model_record: dict[str, Any] = {"name": s.model}
    out = Path(s.out)

    def save(checks: list[dict[str, Any]], complete: bool = False, interrupted: str | None = None) -> dict:
        report = _report(s, start, environment, model_record, checks, complete, interrupted)
        with interrupts.held():
            write_json_atomic(report, out / "report.json")
            write_atomic(out / "report.md", seal_markdown(_markdown(report), report[MARKER_KEY]))
        return report

    stages = CheckLog(save)
    with interrupts.handled():
        save([])  # from here on the files are this run's: "in progress", then each check as it ends
        try:
            checks = _all_checks(s, device, model_record, stages)
        except interrupts.INTERRUPTS as err:
            note = interrupts.cut_note(err, len(stages.checks), None, "check")
            save(stages.checks, interrupted=note)
            stages.note(f"{note}: {out / 'report.json'} and {out / 'report.md'} keep them")
            raise
        return save(checks, complete=True)


def _all_checks(s: DoctorSettings, device: torch.device, model_record: dict, stages: Stages) -> list[dict[str, Any]]:
    """Every check in order (each noted, and recorded when ``stages`` is a :class:`CheckLog`, as it ends)."""
    from vit_fast.interop.loading import load_model

    cuda = device.type == "cuda"
    stages.note("environment: versions, the C compiler, Python.h and libcuda, the driver and cards, settings")
    checks = environment_checks(device)
    for c in checks:
        note_check(stages, c)
    dtypes, checks_skipped = dtypes_for(s, device)
    try:
        model = load_model(s.model, backend="torch", seed=s.seed, config=s.config, weights=s.weights)
        model_record.update(config=model.cfg.to_dict(), tokens=model.cfg.num_tokens, weights=model.describe_weights())
    except Exception as err:
        checks.append(failed_record("model", "load", err))
        note_check(stages, checks[-1])
        model = None
    blockers = [c["name"] for c in checks if c["name"] in ("triton", INTERPRETER_CHECK) and c["status"] != "ok"]
    kernels_ready = not blockers
    if not kernels_ready:
        why = f"{blockers[0]} cannot run vit-fast's kernels here (see environment: {blockers[0]})"
        said = [check_record("kernels", "kernels", "skipped", why), check_record("model", "model", "skipped", why)]
    elif model is None:
        said = [check_record("kernels", "kernels", "skipped", "their shapes come from the model (see model: load)")]
    else:
        said = checks_skipped
    for c in said:
        note_check(stages, c)
    checks += said
    if kernels_ready and model is not None and cuda:
        checks += compiled_checks(model, device, dtypes, s.seed, stages)
    elif kernels_ready and model is not None:
        if interpreter_enabled():  # set before triton was imported (a test, or the user's own shell): run here
            checks += interpreter_checks(s, stages, model)
        else:
            stages.note("starting a child process with TRITON_INTERPRET=1 for the interpreter checks")
            checks += run_in_interpreter(s, stages)
    if not cuda:
        why = f"no CUDA GPU visible to torch {torch.__version__}" if not torch.cuda.is_available() else "--device cpu"
        for c in gpu_skipped(f"{why}: needs a GPU (the interpreter ran what it can instead)"):
            note_check(stages, c)
            checks.append(c)
    return checks


def _report(
    s: DoctorSettings,
    start: float,
    environment: dict[str, Any],
    model_record: dict[str, Any],
    checks: list[dict[str, Any]],
    complete: bool,
    interrupted: str | None,
) -> dict[str, Any]:
    """The report: every check, the verdict and the exit code (None until the run is complete)."""
    failed = [c["name"] for c in checks if c["status"] == "failed"]
    return {
        MARKER_KEY: environment["vit_fast"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment,
        "model": model_record,
        "args": {**asdict(s), "out": str(s.out)},
        "complete": complete,
        "interrupted": interrupted,
        "checks": list(checks),
        "failed": failed,
        "warnings": [c["name"] for c in checks if c["status"] == "warning"],
        "skipped": {c["name"]: c["summary"] for c in checks if c["status"] == "skipped"},
        "ok": complete and not failed,
        "exit_code": (1 if failed else 0) if complete else None,
        "wall_s": time.perf_counter() - start,
    }
