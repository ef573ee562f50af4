"""``vit-fast doctor``: prove the stack on this machine, and write what was found for a bug report.

Each name below loads its submodule on first use, so ``vit_fast.doctor.settings`` (what the command line
builds its parser from) imports no torch. The checks, their sections and which module holds each: docs/cli.md.
"""

from __future__ import annotations

from ..lazy import lazy_names

#: public name -> the submodule that defines it
_HOMES = {
    "DEFAULT_OUT": "settings",
    "DoctorSettings": "settings",
    "CheckLog": "base",
    "format_check": "base",
    "INTERPRETER_CHECK": "environment",
    "OTHER_SETTINGS": "environment",
    "environment_checks": "environment",
    "launcher_checks": "environment",
    "settings_present": "environment",
    "CPU_DTYPES": "checks",
    "GPU_CHECKS": "checks",
    "GPU_KERNEL_BATCHES": "checks",
    "INTERPRETER_MAX_HEADS": "checks",
    "INTERPRETER_MODEL_FLOPS": "checks",
    "cuda_graph_check": "checks",
    "doctor_cases": "checks",
    "first_use_check": "checks",
    "kernel_checks": "checks",
    "model_checks": "checks",
    "timing_check": "checks",
    "interpreter_checks": "interpreter",
    "run_doctor": "report",
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
