"""The one environment collector: versions, commit, device and driver, and which backends can run.

``collect_environment(device)`` is what every report records (export metadata, verify JSON,
bench rows, the demo); ``collect_info()`` / ``format_info`` are what ``vit-fast info`` prints (and
writes with ``--json``), with each GPU's card row and the backend ``"auto"`` picks there (``card_report``).
Nothing here imports onnxruntime or tensorrt unless they are installed and asked about.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import platform
import shutil
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


def importable_version(module: str) -> tuple[str | None, str | None]:
    """``(version, None)`` when ``module`` is installed and imports; ``(None, why)`` when it is installed but
    its import fails (timm without torchvision, say); ``(None, None)`` when it is not installed. Imports the
    module: ``vit-fast info`` names a package as present only when it can be used."""
    version = module_version(module)
    if version is None:
        return None, None
    try:
        importlib.import_module(module)
    except Exception as err:  # a missing dependency, a broken build: what the user would meet
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return None, f"{version} is installed, but `import {module}` fails ({type(err).__name__}: {first})"
    return version, None


SOURCE_ROOT = Path(__file__).resolve().parent.parent


def _is_own_checkout(root: Path) -> bool:
    """True when ``root`` is vit-fast's own source checkout (its pyproject names vit-fast)."""
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False
    return 'name = "vit-fast"' in text


def git_commit() -> str:
    """vit-fast's own commit, ``+dirty`` when its tracked files are modified.

    Only when the installed package sits in vit-fast's source checkout (an editable install): the
    git top level must be the folder holding vit-fast's pyproject.toml, so a virtual environment
    inside a user's repository never records the user's HEAD. Elsewhere: ``$VIT_FAST_COMMIT``
    (set it on a copied tree, as on a benchmark machine), else ``"vit-fast <version>"``.
    """
    from .version import __version__

    fallback = os.environ.get("VIT_FAST_COMMIT") or f"vit-fast {__version__}"
    root = SOURCE_ROOT
    if not _is_own_checkout(root):
        return fallback

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
            return fallback
        commit = git("rev-parse", "HEAD").stdout.strip()
        if len(commit) != 40:
            return fallback
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return commit + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):  # no git, timeout: provenance is best effort
        return fallback


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {cpu_name()} ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)"


def driver_version(device: Any) -> str:
    """The NVIDIA driver version from nvidia-smi, else the CUDA driver API version torch sees; 'n/a' on CPU."""
    import torch

    if device.type != "cuda":
        return "n/a"
    smi = shutil.which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            query = [smi, "--query-gpu=driver_version", "--format=csv,noheader", "-i", str(device.index or 0)]
            out = subprocess.run(query, capture_output=True, text=True, timeout=15)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
    with contextlib.suppress(Exception):
        v = int(torch._C._cuda_getDriverVersion())
        return f"unknown (nvidia-smi unavailable; CUDA driver API {v // 1000}.{(v % 1000) // 10})"
    return "unknown (nvidia-smi unavailable)"


def collect_environment(device: Any = None) -> dict[str, Any]:
    """What a result must record: device and driver, versions, commit, threads. ``device``: a
    torch.device (default: the first GPU when there is one, else the CPU)."""
    import torch

    from .version import __version__

    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)

    def version(module: str) -> str:
        return module_version(module) or "not installed"

    env: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "driver_version": driver_version(device),
        "cuda_runtime": torch.version.cuda or "n/a",
        "vit_fast": __version__,
        "torch": torch.__version__,
        "triton": version("triton"),
        "onnx": version("onnx"),
        "onnxruntime": version("onnxruntime"),
        "tensorrt": version("tensorrt"),
        "polygraphy": version("polygraphy"),
        "timm": version("timm"),
        "transformers": version("transformers"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "torch_threads": torch.get_num_threads(),
        "hostname": platform.node(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return env


#: the optional packages ``vit-fast info`` names, each present only when it imports
INFO_PACKAGES = ("triton", "onnx", "onnxruntime", "tensorrt", "timm", "transformers")


def collect_info() -> dict[str, Any]:
    import torch

    from .version import __version__

    info: dict[str, Any] = {
        "vit_fast": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "gpus": [],
        "import_failures": {},  # package -> why it is installed but cannot be imported
    }
    for module in INFO_PACKAGES:
        info[module], failure = importable_version(module)
        if failure is not None:
            if module == "timm" and "torchvision" in failure:
                failure += "; vit-fast's timm:NAME and the bench's timm peer load it with a torchvision stand-in"
            info["import_failures"][module] = failure
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append(
                {
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    **card_report(torch.device("cuda", i)),
                }
            )
    else:
        from .dtypes import DTYPE_NAMES, native_dtype

        cpu = torch.device("cpu")
        choice = runtime.choose_backend(cpu)
        info["cpu"] = {
            "auto_backend": choice.backend,
            "auto_reason": choice.reason,
            "default_dtype": DTYPE_NAMES[native_dtype(cpu)],
        }
    ort_providers: list[str] = []
    if info["onnxruntime"]:
        import onnxruntime

        ort_providers = list(onnxruntime.get_available_providers())
    info["onnxruntime_providers"] = ort_providers
    backends = {"torch": "yes (CPU and CUDA)"}
    if not runtime.triton_importable():
        backends["triton"] = "no: triton is not installed"
    elif (too_old := runtime.triton_version_problem()) is not None:
        backends["triton"] = f"no: {too_old}"
    elif runtime.cuda_available():
        backends["triton"] = "yes (compiled on the GPU)"
    elif runtime.interpreter_enabled():
        broken = runtime.interpreter_version_problem()
        backends["triton"] = f"no: {broken}" if broken else "yes, under TRITON_INTERPRET=1 (slow; for tests)"
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


def card_report(device: Any) -> dict[str, Any]:
    """What ``vit-fast info`` says of one GPU: its row of the cards table (``vit_fast.kernels.cards``), the
    backend ``backend="auto"`` picks there and why, and the dtype bench and demo default to there."""
    from .dtypes import DTYPE_NAMES, native_dtype
    from .kernels import cards

    card = cards.card_of(device)
    choice = runtime.choose_backend(device)
    return {
        "device": str(device),
        "card": {
            "arch": f"sm_{cards.device_arch(device)}",
            "row": card.name,
            "examples": card.examples,
            "shared_memory_per_block_kb": card.shared_memory // 1024,
            "tensor_cores": card.tensor_cores,
            "tl_dot": card.dot,
            "tma": card.tma,
            "native_bf16": card.native_bf16,
            "summary": card.describe(),
        },
        "auto_backend": choice.backend,
        "auto_reason": choice.reason,
        "default_dtype": DTYPE_NAMES[native_dtype(device)],
    }


def format_info(info: dict[str, Any]) -> str:
    lines = [f"vit-fast {info['vit_fast']}  (python {info['python']}, {info['platform']})", "", "versions:"]
    for key in ("torch", "cuda_runtime", "triton", "onnx", "onnxruntime", "tensorrt", "timm", "transformers"):
        failure = info.get("import_failures", {}).get(key)
        lines.append(f"  {key:<13} {info[key] or ('not usable: ' + failure if failure else 'not installed')}")
    lines.append("")
    if info["gpus"]:
        for i, gpu in enumerate(info["gpus"]):
            lines.append(f"gpu {i}: {gpu['name']}  (compute capability {gpu['capability']}, {gpu['memory_gib']} GiB)")
            bf16 = "" if gpu["card"]["native_bf16"] else "; bf16 refused by bench and the triton backend (not native)"
            lines.append(f"  card         {gpu['card']['summary']}")
            lines.append(f"  auto         {gpu['auto_backend']}: {gpu['auto_reason']}")
            lines.append(f"  dtype        {gpu['default_dtype']} by default (bench, demo){bf16}")
    else:
        cpu = info["cpu"]
        lines.append("gpu: none visible to torch")
        lines.append(f"  auto         {cpu['auto_backend']} (no GPU here): {cpu['auto_reason']}")
        lines.append(f"  dtype        {cpu['default_dtype']} by default (bench, demo)")
    lines.append("")
    lines.append("backends:")
    for key, value in info["backends"].items():
        lines.append(f"  {key:<13} {value}")
    return "\n".join(lines)
