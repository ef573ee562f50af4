"""An autouse fixture for tests that compare kernels with torch on CUDA: TF32 pinned off.

torch on CUDA runs convolutions (and, where enabled, matmuls) in TF32, whose error (~3e-4) is far
above the fp32 bounds the numerics rule applies. Importing ``no_tf32`` into a test module applies it
to every test there; on a CPU machine it changes nothing.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
