"""The project's one numerics rule and its table, used by the tests, ``verify``, the benchmarks and the demo alike:
compared with a float64 reference, our error may be at most ``FACTOR`` (2x) eager PyTorch's error in the same dtype,
plus a floor, ``FLOOR[dtype]`` times the reference's largest magnitude (at least 1). Relative error, cosine
similarity and top-1 agreement are reported beside it."""

from __future__ import annotations

from typing import Any

import torch

#: dtype -> absolute floor, relative to the reference's largest magnitude
FLOOR: dict[torch.dtype, float] = {
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float64: 1e-12,
}
#: ours may be at most this many times eager's error (plus the floor)
FACTOR = 2.0
#: two implementations timed side by side (no float64 reference at hand) must agree within
#: this many floors: a guard against timing a fast wrong answer, not the rule itself
AGREEMENT_FLOORS = 4.0

RULE = f"max|err| <= {FACTOR:g} x eager's max|err| + floor x max(1, max|ref|)"


def max_err(out: torch.Tensor, ref64: torch.Tensor) -> float:
    """Largest absolute difference, computed in float64 on the CPU."""
    return (out.detach().double().cpu() - ref64.detach().double().cpu()).abs().max().item()


def scale_of(ref: torch.Tensor) -> float:
    return max(1.0, ref.detach().abs().max().item())


def bound(eager_err: float, dtype: torch.dtype, scale: float) -> float:
    """The largest error the rule allows ours, given eager's error in ``dtype``."""
    return FACTOR * eager_err + FLOOR[dtype] * scale


def agreement_bound(dtype: torch.dtype, scale: float) -> float:
    """How far two implementations in ``dtype`` may differ before a benchmark refuses to time them."""
    return AGREEMENT_FLOORS * FLOOR[dtype] * scale


def compare(
    out: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor, dtype: torch.dtype, logits: bool = True
) -> dict[str, Any]:
    """Errors of ``out`` (ours) and ``eager`` (torch, same dtype) against ``ref64``; ``[B, ...]`` tensors. Returns
    max |error| for both, the bound, relative errors, the worst per-sample cosine, top-1 agreement (only for
    ``logits`` with more than one class) and ``passed``. A non-finite value in ``out`` makes its error infinite.
    Computed in float64 where ``ref64`` lies (the CPU, or a GPU)."""
    if tuple(out.shape) != tuple(ref64.shape):
        raise ValueError(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref64.shape)}")
    ref = ref64.double()
    o, e = out.to(ref.device, torch.float64), eager.to(ref.device, torch.float64)
    scale = scale_of(ref)
    err, eager_err = (o - ref).abs().max().item(), (e - ref).abs().max().item()
    if not torch.isfinite(o).all():
        err = float("inf")
    limit = bound(eager_err, dtype, scale)
    norm = ref.norm().item() or 1.0
    cosine = torch.nn.functional.cosine_similarity(o.flatten(1), ref.flatten(1), dim=1).min().item()
    top1 = eager_top1 = None
    if logits and ref.shape[-1] > 1:
        top1 = (o.argmax(-1) == ref.argmax(-1)).double().mean().item()
        eager_top1 = (e.argmax(-1) == ref.argmax(-1)).double().mean().item()
    return dict(
        max_abs_err=err,
        eager_max_abs_err=eager_err,
        bound=limit,
        rel_err=(o - ref).norm().item() / norm,
        eager_rel_err=(e - ref).norm().item() / norm,
        cosine=cosine,
        top1_agreement=top1,
        eager_top1_agreement=eager_top1,
        passed=err <= limit,
    )


def assert_within_eager(
    out: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor, name: str = "output", factor: float = FACTOR
) -> None:
    """Raise an AssertionError unless ``out`` (ours) meets the rule; ``eager`` is PyTorch in the same dtype."""
    assert out.shape == ref64.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref64.shape)}"
    assert not torch.isnan(out).any(), f"{name}: NaN in output (an element left unwritten?)"
    scale = scale_of(ref64)
    ours, theirs = max_err(out, ref64), max_err(eager, ref64)
    limit = factor * theirs + FLOOR[out.dtype] * scale
    assert ours <= limit, f"{name}: max|err| {ours:.3e} > {factor}x eager {theirs:.3e} + floor ({limit:.3e})"
