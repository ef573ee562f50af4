"""Triton kernels, installed as ``vit_fast.kernels``: one file per fused op.

Each file holds the kernel, its launcher (input checks, grid), a ``torch.library`` custom op
with a fake implementation, and the eager reference ``<op>_ref`` it is tested against.
Importing this package never touches a GPU driver, and never imports triton.

With a triton older than the kernels need (``versions.MIN_TRITON``; e.g. the 3.4 that torch 2.8
pins), importing this package (and so ``import vit_fast``) warns once with
:class:`TritonVersionWarning`, naming both versions and the fix. vit-fast keeps working on the
torch backend (export, verification, the CPU paths); the triton backend refuses to run with the
same message (``vit_fast.runtime.require_triton``) and ``backend="auto"`` stays on torch.
Raising ImportError here instead would break ``import vit_fast`` for a user whose torch pins an
older triton, for the parts that need no kernel at all.
"""

import warnings as _warnings

from .versions import triton_problem as _triton_problem


class TritonVersionWarning(UserWarning):
    """The installed triton is too old for vit-fast's kernels (the message says which and the fix)."""


_PROBLEM = _triton_problem()
if _PROBLEM is not None:
    _warnings.warn(f"{_PROBLEM}. Until then vit-fast runs the torch backend.", TritonVersionWarning, stacklevel=2)
