"""Which triton our kernels need, and whether the installed torch and triton belong together.

torch pins triton exactly (torch 2.10/2.11 -> triton 3.6, 2.12 -> 3.7, 2.14 -> 3.8; the CPU build pins none), so
vit-fast never asks pip for a triton newer than the user's torch pins: that would make pip replace their torch.
The installed torch's own requirement is read from its metadata, not from a table kept here. Imports neither
torch nor triton (metadata only), so it can run before either is imported.
"""

from __future__ import annotations

import importlib.metadata
import re

#: the oldest triton whose compiler and interpreter run our kernels (CI runs the interpreter suite on it)
MIN_TRITON = (3, 6)
#: the oldest torch that pins a triton at or above MIN_TRITON
MIN_TORCH_FOR_KERNELS = (2, 10)


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
    "MIN_TRITON",
    "MIN_TORCH_FOR_KERNELS",
    "installed",
    "pair_problem",
    "parse_version",
    "torch_pinned_triton",
    "triton_problem",
]
