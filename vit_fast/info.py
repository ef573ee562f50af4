"""What this machine has: versions, GPU, and which backends can run."""

from __future__ import annotations

import importlib
import platform
from typing import Any

from . import runtime


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:  # not installed, or broken in a way we report as absent
        return None
    return str(getattr(mod, "__version__", "unknown"))


def collect_info() -> dict[str, Any]:
    import torch

    from . import __version__

    info: dict[str, Any] = {
        "vit_fast": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": _version("triton"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "tensorrt": _version("tensorrt"),
        "timm": _version("timm"),
        "transformers": _version("transformers"),
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
