"""What :class:`vit_fast.serve.server.Server` checks of its arguments before anything is built or bound."""

from __future__ import annotations

from typing import Any

import torch

from vit_fast.serve.settings import PROTECT_CHOICES
from vit_fast.util.dtypes import parse_dtype


def check_server_args(
    ports: dict[str, Any],
    tune: Any,
    threads: Any,
    protect: Any,
    variable_size: Any,
    max_image_size: Any,
) -> None:
    """Raise naming the argument and what it takes: three different ports in 1..65535, ``tune`` and
    ``variable_size`` booleans, ``threads`` None or an int >= 1, ``protect`` one of :data:`PROTECT_CHOICES`, and
    ``max_image_size`` only with ``variable_size``."""
    for what, port in ports.items():
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"{what} port must be an int in 1..65535, got {port!r}")
    if len(set(ports.values())) != len(ports):
        raise ValueError(f"HTTP, gRPC and metrics need three different ports, got {ports}")
    if not isinstance(tune, bool):
        raise TypeError(f"tune must be True or False, got {tune!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be an int >= 1 (torch intra-op threads per instance), got {threads!r}")
    if protect not in PROTECT_CHOICES:
        raise ValueError(f"protect must be one of {PROTECT_CHOICES}, got {protect!r}")
    if not isinstance(variable_size, bool):
        raise TypeError(f"variable_size must be True or False, got {variable_size!r}")
    if max_image_size is not None and not variable_size:
        raise ValueError("max_image_size bounds variable-size images: pass variable_size=True (--variable-size)")


def parse_served_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """The served dtype: fp32 or fp16 (Triton hands over numpy arrays, which have no bfloat16)."""
    parsed = parse_dtype(dtype)
    if parsed == torch.bfloat16:
        raise ValueError("vit-fast serve serves fp32 or fp16: Triton hands over numpy arrays, which have no bfloat16")
    return parsed
