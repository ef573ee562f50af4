"""The safety net at first use: each kernel proves itself on the user's card before its output is trusted.

:func:`check` compares a kernel's first compiled output per (device, triton version, dtype, config, shape class) with
its eager reference against float64; on a mismatch the op runs in eager PyTorch for the rest of the process, and
:func:`report` lists every check. When it runs, what it costs, ``VIT_FAST_FIRST_USE_CHECK``: docs/kernels.md."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from vit_fast.base.cards import device_name
from vit_fast.base.interpret import interpreter_enabled
from vit_fast.base.switches import switch
from vit_fast.util import numerics

ENV = "VIT_FAST_FIRST_USE_CHECK"


def enabled() -> bool:
    """Whether first uses are checked: ``VIT_FAST_FIRST_USE_CHECK`` if set (1/0, true/false, yes/no, on/off), else
    on for compiled kernels and off under Triton's interpreter. Raises ValueError (SwitchError) naming the
    variable on any other value."""
    flag = switch(ENV)
    return (not interpreter_enabled()) if flag is None else flag


def eligible(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` may be checked: eager (autograd on or off), not traced, not inside a CUDA graph
    capture."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    if type(x) is not torch.Tensor or x.is_meta:
        return False
    return not (x.is_cuda and torch.cuda.is_current_stream_capturing())


def applies(x: torch.Tensor) -> bool:
    """Whether a forward on ``x`` runs its ops under the net: it is on (:func:`enabled`) and the call may be checked
    (:func:`eligible`), or an op failed its check (it runs eagerly then, on any call)."""
    return enabled() and bool(failed_ops() or eligible(x))


@dataclass
class Finding:
    """One checked first use: the op, where it ran, and how it compared."""

    op: str
    kernel: str
    config: str
    device: str
    dtype: str
    shape_class: str
    max_err: float
    eager_err: float
    bound: float
    passed: bool


class _Registry:
    """What has been checked in this process, what failed; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checked: dict[tuple, Finding] = {}
        self.failed: dict[str, Finding] = {}  # op -> its first failing finding: the op runs eagerly from then on

    def record(self, key: tuple, finding: Finding) -> bool:
        """Store ``finding``; True when it is the op's first failure (the one that warns)."""
        with self.lock:
            self.checked[key] = finding
            if finding.passed or finding.op in self.failed:
                return False
            self.failed[finding.op] = finding
            return True


_REGISTRY = _Registry()


def is_checked(key: tuple) -> bool:
    return key in _REGISTRY.checked


def failed_ops() -> frozenset[str]:
    """Ops that failed their first-use check in this process (they run in eager PyTorch now)."""
    return frozenset(_REGISTRY.failed)


def report() -> dict[str, Any]:
    """Every check this process made: ``{"enabled", "checked": [...], "failed": [...]}`` (for ``vit-fast doctor``)."""
    with _REGISTRY.lock:
        checked = [asdict(f) for f in _REGISTRY.checked.values()]
        failed = [asdict(f) for f in _REGISTRY.failed.values()]
    try:
        on = enabled()
    except ValueError:
        on = False
    return {"enabled": on, "checked": checked, "failed": failed}


def reset() -> None:
    """Forget every check and fallback (tests; a process that replaced its kernels)."""
    with _REGISTRY.lock:
        _REGISTRY.checked.clear()
        _REGISTRY.failed.clear()


def _to_float64(value: Any) -> Any:
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def check(
    key: tuple,
    op: str,
    kernel: Any,
    out: torch.Tensor,
    reference: Callable[..., torch.Tensor],
    args: tuple,
    kwargs: dict,
    dtype: torch.dtype,
    config: str | None = None,
) -> bool:
    """Judge a kernel's first output ``out`` for ``key`` (its last item the shape class): ``reference(*args,
    **kwargs)`` is eager PyTorch in ``dtype``, the same with float64 tensors the reference both are measured
    against. ``config``: the config the launch ran with (``ResolvedLaunches.launched_config``; None for a kernel
    that is not autotuned). Records the finding; on a failure warns once for the op and returns False (the caller
    then returns eager's output instead)."""
    with torch.no_grad():  # side computations: nothing of them reaches autograd's graph
        ref64 = reference(*map(_to_float64, args), **{k: _to_float64(v) for k, v in kwargs.items()})
        eager = reference(*args, **kwargs)
    eager_err, err = numerics.max_err(eager, ref64), numerics.max_err(out, ref64)
    limit = numerics.bound(eager_err, dtype, numerics.scale_of(ref64))
    passed = bool(err <= limit)  # a NaN error fails
    device = out.device
    finding = Finding(
        op=op,
        kernel=getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel)),
        config=config if config is not None else "one config (not autotuned)",
        device=device_name(device),
        dtype=str(dtype).replace("torch.", ""),
        shape_class=str(key[-1]),
        max_err=err,
        eager_err=eager_err,
        bound=limit,
        passed=passed,
    )
    if _REGISTRY.record(key, finding):
        warnings.warn(
            f"vit-fast: the Triton kernel {finding.kernel} ({finding.config}) on {finding.device} gave max|err| "
            f"{err:.3g} against float64 in {finding.dtype} where eager PyTorch's is {eager_err:.3g} (the rule allows "
            f"{limit:.3g}): '{op}' runs in eager PyTorch for the rest of this process. Please run `vit-fast doctor "
            f"--json doctor.json` and attach it to a bug report; {ENV}=0 turns this check off.",
            RuntimeWarning,
            stacklevel=4,
        )
    return passed


__all__ = ["ENV", "Finding", "applies", "check", "eligible", "enabled", "failed_ops", "is_checked", "report", "reset"]
