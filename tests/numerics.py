"""Test helpers around the one numerics rule, which lives in ``vit_fast.util.numerics``."""

from __future__ import annotations

import torch

from vit_fast.util.numerics import FLOOR, assert_within_eager, max_err  # noqa: F401  (the tests' vocabulary)


def poisoned(shape, dtype, device="cpu") -> torch.Tensor:
    """An output buffer full of NaN, so an unwritten element fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)
