"""The one interpreter flag. Imports nothing (not even triton), so code that only asks whether
the kernels would run in Triton's CPU interpreter can ask without importing them."""

from __future__ import annotations

import os


def interpreter_enabled() -> bool:
    """True when TRITON_INTERPRET=1: Triton kernels run on the CPU through NumPy (read per call)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
