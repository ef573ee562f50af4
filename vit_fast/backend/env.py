"""The one environment collector: versions, commit, device and driver, and which backends can run.

``collect_environment(device)`` is what every report records (export metadata, verify JSON, bench rows, the demo);
``collect_info`` / ``format_info`` are ``vit-fast info`` (``runtime.card_report``: a GPU's card and auto's backend);
``launcher_needs`` finds, as Triton does, its launcher's C compiler, Python.h and libcuda.so.1 (info and doctor)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_fast.backend import runtime


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


@functools.cache
def extras() -> tuple[str, ...]:
    """vit-fast's extras, in pyproject.toml's order: read from the checkout's pyproject.toml in vit-fast's own
    checkout on Python >= 3.11 (what a checkout install installs, never stale), else from the installed
    distribution's metadata (``Provides-Extra``, written from that file). Read once, on first use."""
    if _is_own_checkout(SOURCE_ROOT) and sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads((SOURCE_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        return tuple(project.get("optional-dependencies", {}))
    from importlib import metadata

    try:
        return tuple(metadata.metadata("vit-fast").get_all("Provides-Extra") or ())
    except metadata.PackageNotFoundError:  # neither installed nor a checkout: no extra to name
        return ()


#: a module that may be missing -> the extra that installs it, for the one-line error of a missing import; an
#: export format's modules are its entry's in vit_fast.export.formats (the command line reads both)
MODULE_EXTRAS = {"sklearn": "demo", "matplotlib": "bench", "tqdm": "bench", "PIL": "images"}


def install_hint(extra: str | None = None) -> str:
    """How to install vit-fast (``extra=None``) or one of its :func:`extras` into the running Python, as every message
    that names an install says it: ``pip install -e '.[serve]' in a vit-fast checkout``. vit-fast is not on PyPI, so
    the command installs the checkout (or a wheel built from it by ``make wheel``); pip keeps the torch already
    installed there."""
    if extra is not None and extra not in extras():
        raise ValueError(f"vit-fast has no extra {extra!r}; its extras are {', '.join(extras())}")
    target = "." if extra is None else f"'.[{extra}]'"
    return f"pip install -e {target} in a vit-fast checkout"


SOURCE_ROOT = Path(__file__).resolve().parents[2]  # vit_fast/backend/env.py -> the checkout


def _is_own_checkout(root: Path) -> bool:
    """True when ``root`` is vit-fast's own source checkout (its pyproject names vit-fast)."""
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False
    return 'name = "vit-fast"' in text


def git_commit() -> str:
    """vit-fast's own commit, ``+dirty`` when its tracked files are modified.

    Read from git only in vit-fast's source checkout (an editable install: the git top level holds vit-fast's
    pyproject.toml, so a virtual environment inside a user's repository never records the user's HEAD). Elsewhere:
    ``$VIT_FAST_COMMIT`` (set it on a copied tree, as on a benchmark machine), else ``"vit-fast <version>"``."""
    from vit_fast.util.version import __version__

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
    from vit_fast.util.progress import plural

    cores = plural(os.cpu_count(), "logical core") if os.cpu_count() else "logical cores unknown"
    return f"CPU: {cpu_name()} ({cores}, {plural(torch.get_num_threads(), 'torch thread')})"


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


# --------------------------------------------------------------------------- what Triton's C launcher needs
#: the CUDA driver library Triton links its launcher against (``-l:libcuda.so.1``) and looks for by this name
LIBCUDA = "libcuda.so.1"
#: the linker cache Triton reads to find libcuda (triton/backends/nvidia/driver.py, ``libcuda_dirs``)
LDCONFIG = "/sbin/ldconfig"
_NOT_COMPILED_HERE = " (not needed on this CPU: the interpreter compiles nothing)"


def c_compiler() -> tuple[str | None, str]:
    """The C compiler Triton would build its launcher with, found as Triton finds it (triton/runtime/build.py:
    ``$CC``, else ``gcc``, else ``clang`` on PATH), and how it was found; ``(None, why)`` when there is none."""
    cc = os.environ.get("CC")
    if cc is not None:  # Triton takes $CC as it is, even empty
        found = shutil.which(cc) if cc else None
        return (found, f"CC={cc}") if found else (None, f"CC={cc} is set, but {cc!r} is not an executable")
    for name in ("gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found, f"{name} on PATH"
    return None, "CC is unset and neither gcc nor clang is on PATH"


def python_include_dir() -> str:
    """The folder Triton passes with ``-I`` for ``Python.h`` when it builds its launcher (triton/runtime/build.py):
    sysconfig's include path for this interpreter's default install scheme, Debian's ``posix_local`` read as
    ``posix_prefix``."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def python_headers() -> tuple[str | None, str]:
    """``Python.h`` in :func:`python_include_dir` and where it is; ``(None, why)`` when it is not there."""
    include = python_include_dir()
    header = os.path.join(include, "Python.h")
    if os.path.isfile(header):
        return header, "the include folder Triton compiles against"
    return None, f"no Python.h in {include} (sysconfig's include folder, the one Triton compiles against)"


def _ldconfig_listing() -> str:
    """What ``ldconfig -p`` lists (the linker cache); raises as Triton's own call would fail."""
    out = subprocess.run([LDCONFIG, "-p"], capture_output=True, timeout=10, check=True).stdout
    return out.decode(errors="ignore")


def libcuda() -> tuple[str | None, str]:
    """Where :data:`LIBCUDA` is, found in Triton's order (triton/backends/nvidia/driver.py, ``libcuda_dirs``):
    ``$TRITON_LIBCUDA_PATH`` (a folder, taken as it is), else the folders ``ldconfig -p`` names, else, when it
    names none, the folders of ``$LD_LIBRARY_PATH``; and how it was found. ``(None, why)`` when Triton would not
    find it. Reads files and the linker cache only: nothing here loads a driver."""
    if folder := os.environ.get("TRITON_LIBCUDA_PATH"):
        path = os.path.join(folder, LIBCUDA)
        if os.path.exists(path):
            return path, f"TRITON_LIBCUDA_PATH={folder}"
        return None, f"TRITON_LIBCUDA_PATH={folder} is set, but that folder holds no {LIBCUDA}"
    try:
        listing = _ldconfig_listing()
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"'{LDCONFIG} -p', which Triton reads to find {LIBCUDA}, failed: {err}"
    listed = [line.split()[-1] for line in listing.splitlines() if LIBCUDA in line]
    folders, how = [os.path.dirname(path) for path in listed], "ldconfig -p"
    ld_library_path = os.environ.get("LD_LIBRARY_PATH")
    if ld_library_path and not folders:
        folders, how = ld_library_path.split(":"), "LD_LIBRARY_PATH"
    for folder in folders:
        path = os.path.join(folder, LIBCUDA)
        if os.path.exists(path):
            return path, how
    if listed:
        stale = "a stale linker cache: run ldconfig as root"
        return None, f"ldconfig -p lists {', '.join(listed)}, but none is there ({stale})"
    searched = " nor in any folder of LD_LIBRARY_PATH" if ld_library_path else ", and LD_LIBRARY_PATH is unset"
    return None, f"no {LIBCUDA} in the linker cache (ldconfig -p){searched}"


@dataclass(frozen=True)
class LauncherNeed:
    """One thing Triton needs to build and load its C launcher on a GPU, and whether this machine has it."""

    name: str  # as doctor and info name it
    path: str | None  # what was found (None: missing)
    found_by: str  # how it was found, or why it was not
    fix: str  # what to do when it is missing
    cpu_status: str  # the status of a missing one on a machine running no compiled kernel

    def status(self, cuda: bool) -> str:
        """ok when found; when missing, failed where kernels compile (``cuda``), else :attr:`cpu_status`."""
        return "ok" if self.path is not None else "failed" if cuda else self.cpu_status

    def summary(self, cuda: bool) -> str:
        """Where it was found and how; when missing, why and the fix (and that a CPU needs none)."""
        if self.path is not None:
            return f"{self.path} ({self.found_by})"
        return f"{self.found_by}; {self.fix}" + ("" if cuda else _NOT_COMPILED_HERE)

    def to_dict(self, cuda: bool) -> dict[str, Any]:
        """``name``, ``status`` and ``summary`` as doctor reports a check, with ``path`` and ``found_by``."""
        status, summary = self.status(cuda), self.summary(cuda)
        return {"name": self.name, "status": status, "summary": summary, "path": self.path, "found_by": self.found_by}


def _compiler_need() -> LauncherNeed:
    path, how = c_compiler()
    if path is not None:  # a program, but is it a compiler? `--version` says (cheap: nothing is compiled)
        try:
            run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as err:
            path, how = None, f"{how}; '{path} --version' failed: {err}"
        else:
            if run.returncode == 0:
                how += ": " + (run.stdout.strip().splitlines() or [""])[0]
            else:
                path, how = None, f"{how}; '{path} --version' exited {run.returncode}"
    if path is None:
        how = f"no working C compiler ({how})"
    fix = (
        "Triton compiles a small C launcher the first time each kernel runs on a GPU; install one (apt-get install "
        "gcc, or your system's equivalent) or set CC to one"
    )
    return LauncherNeed("C compiler", path, how, fix, cpu_status="warning")


def _headers_need() -> LauncherNeed:
    path, how = python_headers()
    xy = f"{sys.version_info.major}.{sys.version_info.minor}"
    fix = (
        f"Triton's launcher includes Python.h; install the development headers of this Python {xy} "
        f"(apt-get install python{xy}-dev on Debian/Ubuntu, python3-dev for the system's own python3; dnf install "
        f"python3-devel on Fedora/RHEL); conda, pyenv and uv Pythons ship them, so there reinstall that Python"
    )
    return LauncherNeed("Python headers", path, how, fix, cpu_status="warning")


def _libcuda_need() -> LauncherNeed:
    path, how = libcuda()
    fix = (
        f"Triton links its launcher against this library of the NVIDIA driver: install the driver, or set "
        f"TRITON_LIBCUDA_PATH to the folder holding {LIBCUDA}"
    )
    return LauncherNeed("libcuda", path, how, fix, cpu_status="skipped")  # it comes with a GPU's driver


def launcher_needs() -> list[LauncherNeed]:
    """The C compiler, Python.h and libcuda.so.1, each found as Triton finds it (no compile, no driver loaded)."""
    return [_compiler_need(), _headers_need(), _libcuda_need()]


def collect_environment(device: Any = None) -> dict[str, Any]:
    """What a result must record: device and driver, versions, commit, threads. ``device``: a
    torch.device (default: the first GPU when there is one, else the CPU)."""
    import torch

    from vit_fast.util.version import __version__

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


#: the optional packages ``vit-fast info`` names, each present only when it imports; an export format's runtime
#: modules come between triton and timm (:class:`Runtime`)
INFO_PACKAGES = ("triton", "timm", "transformers")


@dataclass(frozen=True)
class Runtime:
    """An artifact format's runtime as ``vit-fast info`` reports it; the command reads one per export format from
    the formats' table (vit_fast.export.formats), which lies above this module."""

    backend: str  # its row under ``backends`` (the bench backend that times the format)
    modules: tuple[str, ...]  # the packages whose versions are listed
    status: Callable[[], tuple[str, dict[str, Any]]]  # its row's text, and any fields it adds to the report


def collect_info(runtimes: Sequence[Runtime] = ()) -> dict[str, Any]:
    """What ``vit-fast info`` reports (:func:`format_info` writes it out), with the ``runtimes`` of the formats."""
    import torch

    from vit_fast.util.version import __version__

    info: dict[str, Any] = {
        "vit_fast": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "gpus": [],
        "import_failures": {},  # package -> why it is installed but cannot be imported
    }
    for module in _info_packages(runtimes):
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
                    **runtime.card_report(torch.device("cuda", i)),
                }
            )
    else:
        from vit_fast.util.dtypes import DTYPE_NAMES, native_dtype

        cpu = torch.device("cpu")
        choice = runtime.choose_backend(cpu)
        info["cpu"] = {
            "auto_backend": choice.backend,
            "auto_reason": choice.reason,
            "default_dtype": DTYPE_NAMES[native_dtype(cpu)],
        }
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
    for found in runtimes:
        backends[found.backend], fields = found.status()
        info.update(fields)  # onnxruntime_providers, before backends as always
    info["backends"] = backends
    cuda = torch.cuda.is_available()
    info["triton_launcher"] = [need.to_dict(cuda) for need in launcher_needs()]
    return info


def _info_packages(runtimes: Sequence[Runtime]) -> list[str]:
    """:data:`INFO_PACKAGES` with the runtimes' modules after triton, each once."""
    found = [m for r in runtimes for m in r.modules if m not in INFO_PACKAGES]
    return [INFO_PACKAGES[0], *dict.fromkeys(found), *INFO_PACKAGES[1:]]


def format_info(info: dict[str, Any], runtimes: Sequence[Runtime] = ()) -> str:
    """``vit-fast info``'s text: the report of :func:`collect_info` for the same ``runtimes``."""
    lines = [f"vit-fast {info['vit_fast']}  (python {info['python']}, {info['platform']})", "", "versions:"]
    for key in ("torch", "cuda_runtime", *_info_packages(runtimes)):
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
    lines += ["", "triton's C launcher, built on a GPU the first time each kernel runs, needs:"]
    for need in info["triton_launcher"]:
        shown = need["summary"] if need["status"] in ("ok", "skipped") else f"{need['status']}: {need['summary']}"
        lines.append(f"  {need['name']:<15}{shown}")
    return "\n".join(lines)
