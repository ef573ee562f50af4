"""Test set-up. Without a GPU, Triton kernels run in the interpreter: that must be decided
before triton is first imported, so it happens here, before any test module loads."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
