"""Doctor's checks on a CPU: the kernel and whole-model checks in Triton's interpreter, run in a child process
started with TRITON_INTERPRET=1 (``python -m vit_fast.doctor``), whose checks reach the parent as they end."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vit_fast.util.children import guarded_python
from vit_fast.util.files import read_json, temp_staging, write_json_atomic, write_new
from vit_fast.util.progress import Stages

from .base import CheckLog, check_record, failed_record, note_check
from .checks import doctor_cases, dtypes_for, kernel_checks, model_checks
from .settings import DoctorSettings


def interpreter_checks(s: DoctorSettings, stages: Stages, model: Any = None) -> list[dict[str, Any]]:
    """The kernel and model checks on the CPU, in this process: TRITON_INTERPRET=1 must have been set before
    triton was imported (a child process started by :func:`run_in_interpreter`, or a test)."""
    from vit_fast.interop.loading import load_model

    if model is None:
        model = load_model(s.model, backend="torch", seed=s.seed, config=s.config, weights=s.weights)
    cpu = torch.device("cpu")
    dtypes, _ = dtypes_for(s, cpu)
    stages.note(
        f"kernels of {s.model} ({model.cfg.num_tokens} tokens, head dim {model.cfg.head_dim}) in Triton's "
        f"interpreter, and those of patched timm / HF models at their families' shapes, {', '.join(dtypes)}: "
        f"{len(doctor_cases(model.cfg, 1, torch.float32, None)) * len(dtypes)} checks"
    )
    checks = kernel_checks(model.cfg, cpu, dtypes, s.seed, stages)
    stages.note(f"the whole model, triton backend against the torch backend and float64, {dtypes[0]}, batch 1")
    return checks + model_checks(model, cpu, dtypes, s.seed, stages)


def run_in_interpreter(s: DoctorSettings, stages: Stages) -> list[dict[str, Any]]:
    """:func:`interpreter_checks` in a child process started with TRITON_INTERPRET=1; returns its checks. It prints
    its rows on the stdout it shares with this process and its progress lines on stderr; its checks so far reach
    ``stages`` as they come when it is a :class:`CheckLog`. The child dies with this process and its folder is
    removed on the way out. Why and how: docs/cli.md, section "The triton step in a child process"."""
    with temp_staging("vit-fast-doctor") as tmp:  # removed on SIGTERM; a SIGKILLed run's, by the next run
        settings, result = tmp / "settings.json", tmp / "checks.json"
        progress = tmp / "checks-so-far.json"
        write_new(settings, json.dumps(asdict(s), default=str))
        env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
        # the child dies with this process, and removes the folder if this process is gone (SIGKILL)
        cmd = guarded_python(["vit_fast.doctor", str(settings), str(result), str(progress)], cleanup=tmp)
        deadline, seen = time.monotonic() + s.timeout, 0

        def forward(checks: list[dict[str, Any]]) -> None:  # the child's new checks, into this run's record
            nonlocal seen
            for check in checks[seen:] if isinstance(stages, CheckLog) else []:
                stages.record(check)  # printed by the child itself, on the stdout it shares with this process
            seen = max(seen, len(checks))

        stdout = None if stages.enabled else subprocess.DEVNULL
        with subprocess.Popen(cmd, env=env, stdout=stdout) as proc:
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        proc.kill()
                        proc.wait()
                        forward(_read_checks(progress))
                        why = f"the interpreter run took longer than {s.timeout:g} s (raise --timeout)"
                        failed = check_record("kernels", "interpreter", False, why)
                        note_check(stages, failed)
                        return [*_read_checks(progress), failed]
                    time.sleep(0.2)
                    forward(_read_checks(progress))
            except BaseException:  # an interrupt, or a failure here: the child goes with it
                proc.kill()
                raise
        forward(_read_checks(progress))
        if not result.is_file():
            why = f"the interpreter run ended early (exit status {proc.returncode}; its error is on stderr above)"
            failed = check_record("kernels", "interpreter", False, why)
            note_check(stages, failed)
            return [*_read_checks(progress), failed]
        return read_json(result, "the interpreter run's checks")


def _read_checks(path: Path) -> list[dict[str, Any]]:
    """The checks in the child's progress file (written atomically), or none yet (or a partial one: unreadable)."""
    try:
        data = read_json(path, "the interpreter run's checks so far")
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def child_main(settings_path: str, result_path: str, progress_path: str | None = None) -> int:
    """The child process of :func:`run_in_interpreter`: the interpreter checks for the settings in
    ``settings_path``, their rows written to ``result_path`` (and each as it is made to ``progress_path``)."""
    raw = read_json(settings_path, "doctor settings")
    s = DoctorSettings(**{**raw, "out": Path(raw["out"])})
    stages = CheckLog((lambda checks: write_json_atomic(checks, progress_path)) if progress_path else None)
    try:
        checks = interpreter_checks(s, stages)
    except Exception as err:  # the model could not be loaded, or the interpreter could not start
        checks = [failed_record("kernels", "interpreter", err)]
        note_check(stages, checks[0])
    write_json_atomic(checks, result_path)
    return 0
