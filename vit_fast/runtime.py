"""What can run here: Triton, CUDA, the interpreter. Nothing here touches a GPU at import time."""

from __future__ import annotations

import functools
import importlib.util

from .kernels._interpret import interpreter_enabled


@functools.cache
def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def triton_version_problem() -> str | None:
    """Why the installed triton is too old for our kernels, with the fix (``vit_fast.kernels._versions``); None
    when it is new enough or not installed. Read once per process: installed versions do not change under it."""
    from .kernels._versions import triton_problem

    return triton_problem()


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def triton_available() -> bool:
    """Triton kernels can run: a new enough triton is installed and there is a GPU or the interpreter."""
    return triton_importable() and triton_version_problem() is None and (cuda_available() or interpreter_enabled())


def require_triton() -> None:
    """Raise a RuntimeError that says why the triton backend cannot run here."""
    if not triton_importable():
        raise RuntimeError("the triton backend needs the 'triton' package: pip install triton (Linux only)")
    problem = triton_version_problem()
    if problem is not None:
        raise RuntimeError(f"the triton backend cannot run: {problem}; or use backend='torch'")
    if not (cuda_available() or interpreter_enabled()):
        raise RuntimeError(
            "the triton backend needs a CUDA GPU; on a CPU-only machine set TRITON_INTERPRET=1 "
            "before importing vit_fast to run the kernels in Triton's (slow) interpreter, "
            "or use backend='torch'"
        )
