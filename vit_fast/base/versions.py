"""Which triton our kernels need, whether the installed torch and triton belong together, and whether Triton's
interpreter runs our kernels with the installed numpy. The installed torch's own triton pin is read from its metadata
(never a table of ours: docs/install.md); imports neither torch, triton nor numpy, so it can run before any of them."""

from __future__ import annotations

import importlib.metadata
import re

#: the oldest triton whose compiler and interpreter run our kernels (CI runs the interpreter suite on it)
MIN_TRITON = (3, 6)
#: the oldest torch that pins a triton at or above MIN_TRITON
MIN_TORCH_FOR_KERNELS = (2, 10)
#: numpy from which triton's interpreter before INTERPRETER_FIXED_TRITON fails: numpy 2.4 turned ``int()`` of an
#: array with ndim > 0 from a DeprecationWarning into a TypeError, and that interpreter's ``tensor.__index__`` is
#: ``int(handle.data)`` on a one-element 1-D array (a loop bounded by a kernel argument, ``range(0, N, BLOCK)``,
#: calls it). Compiled kernels never run that code
INTERPRETER_BREAKING_NUMPY = (2, 4)
#: the first triton whose interpreter squeezes the array first (``int(handle.data.squeeze())``): 3.7.0 (3.6.0 does
#: not)
INTERPRETER_FIXED_TRITON = (3, 7)
#: the oldest torch that pins a triton at or above INTERPRETER_FIXED_TRITON
TORCH_FOR_INTERPRETER_FIX = (2, 12)


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"3.6.0+git1234"`` -> ``(3, 6, 0)``; None for None or text with no leading number."""
    if not text:
        return None
    numbers = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else None


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution`` (e.g. ``"triton"``), or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_pinned_triton() -> str | None:
    """The triton version the installed torch requires exactly (``"3.6.0"``), or None when it pins none (CPU
    builds, or a torch that is not installed through pip)."""
    try:
        requires = importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requires:
        found = re.match(r"\s*(?:pytorch-)?triton\s*==\s*([^\s;,]+)", requirement)
        if found and "extra ==" not in requirement:
            return found.group(1)
    return None


def triton_problem() -> str | None:
    """Why the installed triton cannot run our kernels, with the fix; None when it can (or is not installed: the
    torch backend needs no triton, and the triton backend says so itself)."""
    triton_version = installed("triton")
    parsed = parse_version(triton_version)
    if parsed is None or parsed[:2] >= MIN_TRITON:
        return None
    torch_version = installed("torch") or "unknown"
    pinned = torch_pinned_triton()
    why = f" (torch {torch_version} pins triton {pinned})" if pinned else ""
    want = ".".join(map(str, MIN_TRITON))
    torch_want = ".".join(map(str, MIN_TORCH_FOR_KERNELS))
    return (
        f"vit-fast's Triton kernels need triton >= {want}, and triton {triton_version} is installed{why}. "
        f"Upgrade torch to {torch_want} or newer, which brings a triton that runs them "
        f"(pip install 'torch>={torch_want}'), or on a CPU-only torch pip install 'triton>={want}'"
    )


class InterpreterVersionError(RuntimeError):
    """Triton's interpreter cannot run our kernels with the installed triton and numpy (the message says why and
    the fix; :func:`interpreter_problem`)."""


def interpreter_problem() -> str | None:
    """Why Triton's interpreter (``TRITON_INTERPRET=1``) cannot run our kernels with the installed triton and numpy,
    with the fix; None when it can (or triton or numpy is not installed). Compiled kernels are not affected."""
    triton_version, numpy_version = installed("triton"), installed("numpy")
    parsed_triton, parsed_numpy = parse_version(triton_version), parse_version(numpy_version)
    if parsed_triton is None or parsed_numpy is None:
        return None
    if parsed_triton[:2] >= INTERPRETER_FIXED_TRITON or parsed_numpy[:2] < INTERPRETER_BREAKING_NUMPY:
        return None
    numpy_below = ".".join(map(str, INTERPRETER_BREAKING_NUMPY))
    triton_want = ".".join(map(str, INTERPRETER_FIXED_TRITON))
    torch_want = ".".join(map(str, TORCH_FOR_INTERPRETER_FIX))
    pinned = torch_pinned_triton()
    triton_fix = (
        f"upgrade torch to {torch_want} or newer, which brings triton >= {triton_want} "
        f"(pip install 'torch>={torch_want}'"
        f"; torch {installed('torch')} pins triton {pinned})"
        if pinned
        else f"pip install 'triton>={triton_want}'"
    )
    return (
        f"Triton's interpreter in triton {triton_version} cannot run vit-fast's kernels with numpy {numpy_version}: "
        f"a loop bounded by a kernel argument fails there with 'only 0-dimensional arrays can be converted to "
        f"Python scalars' (numpy >= {numpy_below} made that conversion an error; triton {triton_want} fixed its "
        f"interpreter; compiled kernels on a GPU are not affected). Fix: pip install 'numpy<{numpy_below}', or "
        f"{triton_fix}"
    )


def pair_problem() -> str | None:
    """Whether the installed torch and triton belong together: None, or what is wrong (torch pins another triton
    than the one installed: pip was told to replace one of them)."""
    pinned, triton_version = torch_pinned_triton(), installed("triton")
    if pinned is None or triton_version is None:
        return None
    if parse_version(pinned) != parse_version(triton_version):
        return (
            f"torch {installed('torch')} was built against triton {pinned}, but triton {triton_version} is installed: "
            f"reinstall the pair (pip install 'triton=={pinned}')"
        )
    return None


__all__ = [
    "INTERPRETER_BREAKING_NUMPY",
    "INTERPRETER_FIXED_TRITON",
    "MIN_TRITON",
    "MIN_TORCH_FOR_KERNELS",
    "TORCH_FOR_INTERPRETER_FIX",
    "InterpreterVersionError",
    "installed",
    "interpreter_problem",
    "pair_problem",
    "parse_version",
    "torch_pinned_triton",
    "triton_problem",
]
