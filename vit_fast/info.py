"""What this machine has: versions, GPU, and which backends can run."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from . import runtime


@functools.cache
def _distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


def module_version(module: str) -> str | None:
    """The installed version of ``module`` (None when it is not installed), read from package metadata
    where it can be (so tensorrt or onnxruntime are not imported just to be named), else from the module."""
    from importlib import metadata

    for dist in _distributions().get(module, []):  # onnxruntime may come from onnxruntime-gpu
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return str(getattr(importlib.import_module(module), "__version__", "unknown"))
    except Exception:  # installed but broken: say so rather than fail the report
        return "unknown (import failed)"


def git_commit() -> str:
    """The commit of the vit-fast source tree, ``+dirty`` when modified. Where the tree is no git
    checkout (a copied tree, as on a benchmark machine), ``$VIT_FAST_COMMIT``; else ``"unknown"``."""
    repo = Path(__file__).resolve().parent.parent
    fallback = os.environ.get("VIT_FAST_COMMIT", "unknown")
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        if len(commit) != 40:
            return fallback
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return commit + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except Exception:  # no git, not a checkout, timeout, ...: provenance is best effort
        return fallback


def collect_info() -> dict[str, Any]:
    import torch

    from . import __version__

    info: dict[str, Any] = {
        "vit_fast": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": module_version("triton"),
        "onnx": module_version("onnx"),
        "onnxruntime": module_version("onnxruntime"),
        "tensorrt": module_version("tensorrt"),
        "timm": module_version("timm"),
        "transformers": module_version("transformers"),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append(
                {
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 1),
                }
            )
    ort_providers: list[str] = []
    if info["onnxruntime"]:
        import onnxruntime

        ort_providers = list(onnxruntime.get_available_providers())
    info["onnxruntime_providers"] = ort_providers
    backends = {"torch": "yes (CPU and CUDA)"}
    if not runtime.triton_importable():
        backends["triton"] = "no: triton is not installed"
    elif runtime.cuda_available():
        backends["triton"] = "yes (compiled on the GPU)"
    elif runtime.interpreter_enabled():
        backends["triton"] = "yes, under TRITON_INTERPRET=1 (slow; for tests)"
    else:
        backends["triton"] = "no GPU here: set TRITON_INTERPRET=1 to run the kernels in the interpreter"
    backends["onnxruntime"] = (
        f"yes ({', '.join(ort_providers)})" if ort_providers else "no: pip install 'vit-fast[onnx]'"
    )
    backends["tensorrt"] = (
        "yes" if info["tensorrt"] and runtime.cuda_available() else "no: needs the tensorrt package and a CUDA GPU"
    )
    info["backends"] = backends
    return info


def format_info(info: dict[str, Any]) -> str:
    lines = [f"vit-fast {info['vit_fast']}  (python {info['python']}, {info['platform']})", "", "versions:"]
    for key in ("torch", "cuda_runtime", "triton", "onnx", "onnxruntime", "tensorrt", "timm", "transformers"):
        lines.append(f"  {key:<13} {info[key] or 'not installed'}")
    lines.append("")
    if info["gpus"]:
        for i, gpu in enumerate(info["gpus"]):
            lines.append(f"gpu {i}: {gpu['name']}  (compute capability {gpu['capability']}, {gpu['memory_gib']} GiB)")
    else:
        lines.append("gpu: none visible to torch")
    lines.append("")
    lines.append("backends:")
    for key, value in info["backends"].items():
        lines.append(f"  {key:<13} {value}")
    return "\n".join(lines)
