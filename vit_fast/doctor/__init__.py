"""``vit-fast doctor``: prove the stack on this machine, and write what was found for a bug report.

Each name below loads its submodule on first use, so ``vit_fast.doctor.settings`` (what the command line
builds its parser from) imports no torch. The checks, their sections and which module holds each: docs/cli.md.
"""

from __future__ import annotations

from vit_fast.util.lazy import lazy_names

#: submodule -> the public names it defines
__all__, __getattr__, __dir__ = lazy_names(
    __name__,
    {
        "settings": ("DEFAULT_OUT", "DoctorSettings"),
        "base": ("CheckLog", "format_check"),
        "environment": (
            "INTERPRETER_CHECK",
            "OTHER_SETTINGS",
            "environment_checks",
            "launcher_checks",
            "settings_present",
        ),
        "checks": (
            "CPU_DTYPES",
            "GPU_CHECKS",
            "GPU_KERNEL_BATCHES",
            "INTERPRETER_MAX_HEADS",
            "INTERPRETER_MODEL_FLOPS",
            "cuda_graph_check",
            "doctor_cases",
            "first_use_check",
            "kernel_checks",
            "model_checks",
            "timing_check",
        ),
        "interpreter": ("interpreter_checks",),
        "report": ("run_doctor",),
    },
)
