"""What can run here: Triton, CUDA, the interpreter; and the one rule of ``backend="auto"`` (our kernels only on
a CUDA card whose ``tl.dot`` has tensor cores), with the reason it gives per device. Nothing here touches a GPU
at import time."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vit_fast.base import cards
from vit_fast.base.interpret import interpreter_enabled, interpreter_version_problem
from vit_fast.base.versions import InterpreterVersionError

if TYPE_CHECKING:
    import torch


@functools.cache
def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def triton_version_problem() -> str | None:
    """Why the installed triton is too old for our kernels, with the fix (``vit_fast.base.versions``); None
    when it is new enough or not installed. Read once per process: installed versions do not change under it."""
    from vit_fast.base.versions import triton_problem

    return triton_problem()


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def intra_op_threads(workers: int, reserve: int = 1, cores: int | None = None) -> int:
    """torch intra-op threads per worker when ``workers`` threads run forwards at once beside ``reserve`` busy cores (a
    server's own processes): ``(cores - reserve) // workers``, at least 1. Why not torch's default (every core), with
    measurements: see docs/development.md, section "Torch threads per worker (`backend/runtime.py`)".
    """
    cores = cpu_cores() if cores is None else cores
    if workers < 1 or reserve < 0:
        raise ValueError(f"workers must be >= 1 and reserve >= 0, got {workers} and {reserve}")
    return max(1, (cores - reserve) // workers)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def triton_available() -> bool:
    """Triton kernels can run: a new enough triton is installed and there is a GPU or the interpreter (with a
    numpy it runs under: :func:`~.base.interpret.interpreter_version_problem`)."""
    if not triton_importable() or triton_version_problem() is not None:
        return False
    if interpreter_enabled():
        return interpreter_version_problem() is None
    return cuda_available()


def require_triton() -> None:
    """Raise a RuntimeError that says why the triton backend cannot run here."""
    if not triton_importable():
        raise RuntimeError("the triton backend needs the 'triton' package: pip install triton (Linux only)")
    problem = triton_version_problem()
    if problem is not None:
        raise RuntimeError(f"the triton backend cannot run: {problem}; or use backend='torch'")
    if interpreter_enabled():
        problem = interpreter_version_problem()
        if problem is not None:
            raise InterpreterVersionError(f"the triton backend cannot run: {problem}; or use backend='torch'")
    elif not cuda_available():
        problem = interpreter_version_problem()
        if problem is not None:
            raise RuntimeError(
                "the triton backend needs a CUDA GPU, and on this CPU Triton's interpreter (TRITON_INTERPRET=1) "
                f"cannot stand in: {problem}; or use backend='torch'"
            )
        raise RuntimeError(
            "the triton backend needs a CUDA GPU; on a CPU-only machine set TRITON_INTERPRET=1 "
            "before importing vit_fast to run the kernels in Triton's (slow) interpreter, "
            "or use backend='torch'"
        )


# --------------------------------------------------------------------------- which backend "auto" picks
@dataclass(frozen=True)
class BackendChoice:
    """The backend a model runs on for one device, and why, in one line that names the card."""

    backend: str  #: "torch" or "triton"
    reason: str

    def __str__(self) -> str:
        return f"{self.backend}: {self.reason}"


@functools.cache
def head_dim_range() -> tuple[int, int]:
    """The head dims our attention kernel takes, ``(min, max)`` (imports the kernels, so triton: ask after
    :func:`triton_importable`)."""
    from vit_fast.kernels.attention_checks import MAX_HEAD_DIM, MIN_HEAD_DIM

    return MIN_HEAD_DIM, MAX_HEAD_DIM


def head_dim_supported(head_dim: int) -> bool:
    """Whether our attention kernel takes this head dim."""
    low, high = head_dim_range()
    return low <= head_dim <= high


def _auto_blocker(device: torch.device, head_dim: int | None) -> str | None:
    """The rule of ``backend="auto"``, in one place: None when our kernels are expected to help on ``device``
    (a CUDA card whose ``tl.dot`` runs on tensor cores, sm_80 and up), else why the torch backend runs instead.

    Cheap (it runs on every forward): the reason's text is made only when asked, by :func:`choose_backend`.
    """
    if device.type != "cuda":
        return "not-cuda"
    if not triton_importable():
        return "no-triton"
    if triton_version_problem() is not None:
        return "old-triton"
    if not cuda_available():
        return "no-cuda"
    if head_dim is not None and not head_dim_supported(head_dim):
        return "head-dim"
    if not cards.card_of(device).tensor_cores:
        return "no-tensor-cores"
    return None


def auto_backend(device: torch.device | str, head_dim: int | None = None) -> str:
    """``"triton"`` or ``"torch"``: what ``backend="auto"`` runs on ``device`` (``head_dim``: the model's, when
    there is a model)."""
    import torch

    return "torch" if _auto_blocker(torch.device(device), head_dim) else "triton"


def patched_runs_kernels(x: torch.Tensor, backend: str, head_dim: int | None = None) -> bool:
    """Whether a block or head of a timm / transformers model patched in place runs on our kernels for input ``x``, else
    on its own forward: with ``backend="auto"`` where :func:`auto_backend` picks triton for ``x``'s device
    (``head_dim``: the model's), with ``"triton"`` on any device; only in a dtype of ``SUPPORTED_DTYPES``
    (``vit_fast.kernels.launches``; float64 and the rest keep their own forward). bf16 on a card that only emulates it:
    a ValueError naming the card (``vit_fast.util.dtypes.check_dtype_on_device``)."""
    if backend != "triton" and auto_backend(x.device, head_dim) != "triton":
        return False
    import torch

    from vit_fast.kernels.launches import SUPPORTED_DTYPES  # triton is imported by now: the kernels run next

    if x.dtype not in SUPPORTED_DTYPES:
        return False
    if x.dtype == torch.bfloat16:
        from vit_fast.util.dtypes import check_dtype_on_device

        check_dtype_on_device(
            x.dtype,
            x.device,
            "use float16 or float32 (model.half() / model.float()), or patch with backend='auto', which keeps the "
            "model's own forward on this card",
        )
    return True


def choose_backend(device: torch.device | str, head_dim: int | None = None, asked: str = "auto") -> BackendChoice:
    """The backend a model asked for ``asked`` (``"auto"``, ``"torch"`` or ``"triton"``) runs on ``device``, and
    a one-line reason naming the card; what ``VisionTransformer.explain_backend`` and ``vit-fast info`` say."""
    import torch

    device = torch.device(device)
    if asked == "torch":
        return BackendChoice("torch", "asked for with backend='torch'")
    if asked == "triton":
        if device.type != "cuda":
            how = "run in" if interpreter_enabled() else "need"
            return BackendChoice(
                "triton",
                f"asked for with backend='triton'; on {device} the kernels {how} Triton's interpreter "
                "(TRITON_INTERPRET=1: slow, for tests)",
            )
        card = cards.card_of(device)
        if not card.tensor_cores:
            return BackendChoice(
                "triton",
                f"asked for with backend='triton', though {cards.device_name(device)} has no tensor cores for Triton's "
                "tl.dot: expect it slower than backend='torch' there",
            )
        reason = f"asked for with backend='triton'; {cards.device_name(device)} has tl.dot on tensor cores ({card.dot})"
        return BackendChoice("triton", reason)
    if asked != "auto":
        raise ValueError(f"backend must be one of ('auto', 'torch', 'triton'), got {asked!r}")
    why = _auto_blocker(device, head_dim)
    if why is None:
        card = cards.card_of(device)
        return BackendChoice(
            "triton",
            f"{cards.device_name(device)} runs Triton's tl.dot on tensor cores ({card.dot}): our fused kernels are "
            "expected to help there",
        )
    if why == "not-cuda":
        reason = f"{device} is not a CUDA device; our kernels are compiled for NVIDIA GPUs"
    elif why == "no-triton":
        reason = "the 'triton' package is not installed (pip install triton; Linux only)"
    elif why == "old-triton":
        reason = str(triton_version_problem())
    elif why == "no-cuda":
        reason = f"no CUDA GPU is visible to torch {torch.__version__}"
    elif why == "head-dim":
        low, high = head_dim_range()
        reason = f"the model's head dim {head_dim} is outside our attention kernel's {low}..{high}"
    else:
        reason = (
            f"{cards.device_name(device)} has no tensor cores for Triton's tl.dot (it compiles to FMA); our kernels "
            "would be slower than cuBLAS there"
        )
    return BackendChoice("torch", reason)


def card_report(device: Any) -> dict[str, Any]:
    """What ``vit-fast info`` says of one GPU: its row of the cards table (``vit_fast.base.cards``), the
    backend ``backend="auto"`` picks there and why, and the dtype bench and demo default to there."""
    from vit_fast.util.dtypes import DTYPE_NAMES, native_dtype

    card = cards.card_of(device)
    choice = choose_backend(device)
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
