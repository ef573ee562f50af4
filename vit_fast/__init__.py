"""vit-fast: Vision Transformers on fast Triton kernels, with verified export and honest benchmarks."""

from __future__ import annotations

from .checkpoints import load_checkpoint, save_checkpoint
from .config import PRESETS, ViTConfig
from .convert import from_hf, from_timm, optimize
from .loading import load_model
from .model import VisionTransformer
from .patching import apply_vit_fast, remove_vit_fast
from .version import __version__

__all__ = [
    "PRESETS",
    "ViTConfig",
    "VisionTransformer",
    "from_hf",
    "from_timm",
    "optimize",
    "load_checkpoint",
    "save_checkpoint",
    "load_model",
    "apply_vit_fast",
    "remove_vit_fast",
    "CUDAGraphRunner",
    "tuning",
    "__version__",
]


def __getattr__(name: str):  # lazy: the CUDA-graph runner and the kernels pull in nothing at import time
    if name == "CUDAGraphRunner":
        from .graphs import CUDAGraphRunner

        return CUDAGraphRunner
    if name == "tuning":  # ``with vit_fast.tuning(): ...`` tunes the kernel shapes first seen in the block
        from .kernels._common import tuning

        return tuning
    raise AttributeError(f"module 'vit_fast' has no attribute {name!r}")
