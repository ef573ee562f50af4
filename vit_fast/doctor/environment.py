"""Doctor's environment section: python, torch and triton and whether they belong together, what Triton
builds its C launcher with, the driver and each GPU's row of the card table, the settings present."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from typing import Any

import torch

from vit_fast.backend.env import driver_version, launcher_needs
from vit_fast.base import versions
from vit_fast.base.cards import MIN_ARCH, card_of, device_name

from .base import check_record

#: the environment variables reported besides every TRITON_* and VIT_FAST_* one
OTHER_SETTINGS = ("CC", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "PYTORCH_CUDA_ALLOC_CONF")
#: the environment check of whether Triton's interpreter runs our kernels with this triton and numpy (CPU only)
INTERPRETER_CHECK = "triton interpreter"


def launcher_checks(cuda: bool) -> list[dict[str, Any]]:
    """What Triton needs to build its C launcher on a GPU (:func:`vit_fast.backend.env.launcher_needs`: the C compiler,
    Python.h, libcuda.so.1): failed when missing where kernels compile (``cuda``), else a warning, or skipped for
    libcuda (it comes with a GPU's driver)."""
    checks = []
    for need in launcher_needs():
        fields = need.to_dict(cuda)
        checks.append(
            check_record("environment", fields.pop("name"), fields.pop("status"), fields.pop("summary"), **fields)
        )
    return checks


def _triton_checks(cuda: bool) -> list[dict[str, Any]]:
    triton_version, torch_version = versions.installed("triton"), torch.__version__
    pinned = versions.torch_pinned_triton()
    want = ".".join(map(str, versions.MIN_TRITON))
    checks = []
    triton_ok = False
    if triton_version is None:
        checks.append(
            check_record(
                "environment",
                "triton",
                "failed" if cuda else "warning",
                f"triton is not installed: the triton backend cannot run (pip install 'triton>={want}', Linux)",
            )
        )
    else:
        problem = versions.triton_problem()
        triton_ok = problem is None
        summary = problem or f"triton {triton_version} (vit-fast's kernels need >= {want})"
        checks.append(check_record("environment", "triton", triton_ok, summary, version=triton_version))
    pair = versions.pair_problem()
    if pair is not None:
        status, summary = "warning", pair
    elif pinned is None:
        status, summary = "ok", f"torch {torch_version} pins no triton (a CPU build, or not installed by pip)"
    else:
        status, summary = "ok", f"torch {torch_version} pins triton {pinned}, and triton {triton_version} is installed"
    checks.append(check_record("environment", "torch / triton pair", status, summary, torch_pins=pinned))
    if triton_ok and not cuda:  # the kernel checks run in Triton's interpreter here
        problem = versions.interpreter_problem()
        numpy_version = versions.installed("numpy")
        summary = problem or (
            f"triton {triton_version} with numpy {numpy_version}: no known fault of the interpreter there "
            "(the kernel checks below run in it)"
        )
        checks.append(check_record("environment", INTERPRETER_CHECK, problem is None, summary, numpy=numpy_version))
    return checks


def settings_present(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Every TRITON_* and VIT_FAST_* variable set, and the few others that change what runs (:data:`OTHER_SETTINGS`)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(("TRITON_", "VIT_FAST_")) or k in OTHER_SETTINGS}


def _settings_check() -> dict[str, Any]:
    found = settings_present()
    shown = ", ".join(f"{k}={v}" for k, v in found.items()) or "none set"
    # our kernels pass enable_fp_fusion on every launch (kernels.launches.FP_FUSION), so the variable changes only
    # other Triton code in the process; said, because a user comparing numerics may have set it
    fusion = os.environ.get("TRITON_DEFAULT_FP_FUSION", "unset")
    fusion_note = f"our kernels pin fp fusion per launch (TRITON_DEFAULT_FP_FUSION, {fusion}, does not reach them)"
    return check_record("environment", "settings", True, f"{shown}; {fusion_note}", variables=found)


def _gpu_checks(cuda: bool) -> list[dict[str, Any]]:
    if not cuda:
        why = f"no CUDA GPU visible to torch {torch.__version__}" + (
            f" (a CUDA {torch.version.cuda} build: check the driver with nvidia-smi, and CUDA_VISIBLE_DEVICES)"
            if torch.version.cuda
            else " (a CPU build)"
        )
        return [
            check_record("environment", "driver", "skipped", why),
            check_record("environment", "gpu", "skipped", why),
        ]
    checks = [check_record("environment", "driver", True, driver_version(torch.device("cuda", 0)))]
    for index in range(torch.cuda.device_count()):
        card = card_of(index)
        summary = f"{device_name(index)}: {card.describe()}"
        status = "ok"
        if card.arch < MIN_ARCH:
            status, summary = "failed", summary + f"; Triton has no target below sm_{MIN_ARCH}"
        elif not card.tensor_cores:
            status = "warning"
            summary += "; tl.dot has no tensor cores here, so backend='auto' keeps the torch backend"
        checks.append(check_record("environment", f"gpu {index}", status, summary, card=asdict(card)))
    return checks


def environment_checks(device: torch.device) -> list[dict[str, Any]]:
    """The environment section: versions, their pairing, what Triton's launcher needs (C compiler, Python.h,
    libcuda), the driver and cards, the settings."""
    cuda = device.type == "cuda"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    checks = [
        check_record("environment", "python", True, f"{platform.python_version()} on {platform.platform()}"),
        check_record("environment", "torch", True, f"torch {torch.__version__} ({build})", version=torch.__version__),
    ]
    checks += _triton_checks(cuda)
    checks += launcher_checks(cuda)
    checks += _gpu_checks(torch.cuda.is_available())
    checks.append(_settings_check())
    return checks
