"""Test helpers around the one numerics rule, which lives in ``vit_fast.util.numerics``; and ``no_tf32``, an autouse
fixture that pins TF32 off, since torch's TF32 on CUDA (error ~3e-4) is far above the rule's fp32 bounds. Importing
``no_tf32`` into a test module applies it to every test there; on a CPU machine it changes nothing."""

from __future__ import annotations

import pytest
import torch

from vit_fast.model.selfcheck import no_tf32 as tf32_off
from vit_fast.util.numerics import FLOOR, assert_within_eager, max_err  # noqa: F401  (the tests' vocabulary)


def poisoned(shape, dtype, device="cpu") -> torch.Tensor:
    """An output buffer full of NaN, so an unwritten element fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def in_float64(*args) -> list:
    """A reference's arguments with every tensor in float64 and the rest (None, eps, an activation's name) as they
    are: what the truth is computed from."""
    return [a.double() if isinstance(a, torch.Tensor) else a for a in args]


def assert_kernel_matches(out: torch.Tensor, ref, args, name: str) -> torch.Tensor:
    """The numerics rule for a kernel's ``out`` on ``args``: the eager reference ``ref`` on the same ``args`` gives
    the bound, ``ref`` on them in float64 the truth; ``out`` keeps the dtype of ``args[0]``. Returns ``out``."""
    assert out.dtype == args[0].dtype
    assert_within_eager(out, ref(*args), ref(*in_float64(*args)), name)
    return out


@pytest.fixture(autouse=True)
def no_tf32():
    with tf32_off():
        yield
