"""The checks of the serving arguments every entry and ``vit-fast serve`` take: the model name, instances and
kind, the queue delay and the batch sizes (:func:`plan_batching` checks and plans them all)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vit_fast.util.batches import MAX_BATCH, parse_batch_list

from .config import DEFAULT_BATCH, DEFAULT_QUEUE_DELAY_US, KINDS, Batching

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
#: the longest model name: a folder name (NAME_MAX bytes) with room for the python entry's ``_python``
NAME_MAX_CHARS = 240


def check_model_name(name: str) -> str:
    """A model name Triton loads: a letter, digit or ``_`` first (Triton skips hidden folders), then letters, digits,
    ``.``, ``_``, ``-`` (it is a folder and a URL path segment), at most :data:`NAME_MAX_CHARS` characters."""
    fix = "start it with a letter, digit or '_', then use letters, digits, '.', '_' and '-' only"
    if not isinstance(name, str) or not name:
        raise ValueError(f"model name {name!r} is not usable by Triton: {fix}")
    if name.startswith("."):
        raise ValueError(
            f"model name {name!r} is not usable by Triton: it starts with '.' (a hidden folder, never loaded); {fix}"
        )
    if "/" in name or "\\" in name:
        raise ValueError(
            f"model name {name!r} is not usable by Triton: it holds a path separator (it is one folder); {fix}"
        )
    if not _NAME_RE.match(name):
        raise ValueError(f"model name {name!r} is not usable by Triton: {fix}")
    if len(name) > NAME_MAX_CHARS:
        raise ValueError(f"model name of {len(name)} characters is not usable by Triton: use {NAME_MAX_CHARS} at most")
    return name


def model_name_for(spec: str | os.PathLike) -> str:
    """The default Triton model name for a model spec or artifact path: its file stem, other characters as ``_``."""
    stem = Path(str(spec)).stem if Path(str(spec)).suffix else Path(str(spec)).name
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip(".") or "vit"


def machine_kind(engine: bool = False) -> tuple[str, str]:
    """The instance kind to write when none is asked for, and why: ``"gpu"`` for a TensorRT engine (it runs on a
    GPU only) and where torch sees a CUDA GPU, else ``"cpu"`` (a KIND_GPU model fails to load on a server
    without one)."""
    if engine:
        return "gpu", "a TensorRT engine runs on a GPU only"
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return "gpu", f"torch sees {count} CUDA GPU{'s' if count != 1 else ''} here"
    return "cpu", "no CUDA GPU is visible to torch here; pass --kind gpu for a repository a GPU server will load"


def check_instances(instances: Any, kind: Any) -> tuple[int, str]:
    """Validate the instance group: ``instances`` >= 1 and ``kind`` "gpu" or "cpu"."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances must be an int >= 1 (model instances per device), got {instances!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return instances, kind


def check_queue_delay(queue_delay_us: Any) -> int:
    if isinstance(queue_delay_us, bool) or not isinstance(queue_delay_us, int) or queue_delay_us < 0:
        raise ValueError(f"queue delay must be an int >= 0 (microseconds), got {queue_delay_us!r}")
    return queue_delay_us


def parse_batch_sizes(text: str | Sequence[int]) -> list[int]:
    """``"1,8,64"`` -> ``[1, 8, 64]`` (a sequence of ints is checked and returned as a list)."""
    return parse_batch_list(text)


def batch_plan(
    batch: Sequence[int] | None, limit: tuple[int, int] | None = None, opt: int | None = None, what: str = "artifact"
) -> tuple[int, list[int]]:
    """``(max_batch_size, preferred_batch_sizes)`` from ``batch``, the sizes to serve: the largest is the maximum
    batch, sizes above 1 become Triton's preferred batch sizes (a preferred size of 1 would dispatch every request
    alone). Default: 8 and 64 (or ``opt``), clipped to ``limit=(min, max)``, the artifact's batch range. Triton forms
    any batch from 1 to the maximum, so a range that starts above 1 is refused."""
    lo, hi = limit if limit is not None else (1, None)
    if lo > 1:
        raise ValueError(
            f"the {what} serves batches from {lo} up, but Triton's dynamic batcher sends any batch from 1 to "
            f"max_batch_size: export or build it with a batch range that starts at 1"
        )
    if batch is None:
        top = hi if hi is not None else DEFAULT_BATCH[-1]
        wanted = {b for b in (*DEFAULT_BATCH[1:-1], opt) if b is not None and 1 < b < top}
        return top, sorted(wanted | ({top} if top > 1 else set()))
    sizes = list(batch)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH for b in sizes):
        raise ValueError(
            f"batch sizes must be ints >= 1 (at most {MAX_BATCH}) such as 1,8,64 (the largest is the maximum), got "
            f"{batch!r}"
        )
    top = max(sizes)
    if hi is not None and top > hi:
        raise ValueError(
            f"batch {top} exceeds the {what}'s batch range (up to {hi}): pass batch sizes <= {hi}, or re-export it "
            f"with a larger maximum batch"
        )
    return top, sorted({b for b in sizes if b > 1})


def plan_batching(
    batch: Sequence[int] | None = None,
    instances: int = 1,
    kind: str = "gpu",
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    limit: tuple[int, int] | None = None,
    opt: int | None = None,
    what: str = "model",
) -> Batching:
    """Check the serving arguments every entry and ``vit-fast serve`` take, and plan them (see :func:`batch_plan`)."""
    check_instances(instances, kind)
    check_queue_delay(queue_delay_us)
    top, preferred = batch_plan(batch, limit, opt, what)
    return Batching(top, tuple(preferred), queue_delay_us, instances, kind)
