"""The project's one numerics rule (DESIGN.md): a kernel's error against a float64 reference
may be at most 2x eager PyTorch's error in the same dtype, plus a small floor."""

from __future__ import annotations

import torch

# dtype -> absolute floor, relative to the reference's largest magnitude
FLOOR = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


def max_err(out: torch.Tensor, ref64: torch.Tensor) -> float:
    return (out.detach().double().cpu() - ref64.detach().double().cpu()).abs().max().item()


def assert_within_eager(
    out: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor, name: str = "output", factor: float = 2.0
) -> None:
    """``out`` (ours) and ``eager`` (PyTorch, same dtype) are both compared with ``ref64``."""
    assert out.shape == ref64.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref64.shape)}"
    assert not torch.isnan(out).any(), f"{name}: NaN in output (an element left unwritten?)"
    scale = max(1.0, ref64.abs().max().item())
    ours, theirs = max_err(out, ref64), max_err(eager, ref64)
    bound = factor * theirs + FLOOR[out.dtype] * scale
    assert ours <= bound, f"{name}: max|err| {ours:.3e} > {factor}x eager {theirs:.3e} + floor ({bound:.3e})"


def poisoned(shape, dtype, device="cpu") -> torch.Tensor:
    """An output buffer full of NaN, so an unwritten element fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)
