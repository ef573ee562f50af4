"""Test set-up. Without a GPU, Triton kernels run in the interpreter: that must be decided
before triton is first imported, so it happens here, before any test module loads. Where the real
torchvision cannot be imported (CPU machines), an import-time stand-in lets timm's model code
import (tests/_torchvision_standin.py)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from ._torchvision_standin import install as _install_torchvision_standin  # noqa: E402

TORCHVISION_STANDIN = _install_torchvision_standin()


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
