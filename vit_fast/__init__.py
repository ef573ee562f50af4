"""vit-fast: Vision Transformers on fast Triton kernels, with verified export and honest benchmarks.

Every public name is imported on first use (PEP 562), so ``import vit_fast`` and the command line's
``--help`` / ``--version`` do not import torch; ``vit_fast.VisionTransformer`` and
``from vit_fast import load_model`` import what they need then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .version import __version__

#: public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    "load_checkpoint": ".checkpoints",
    "save_checkpoint": ".checkpoints",
    "PRESETS": ".config",
    "ViTConfig": ".config",
    "from_hf": ".convert",
    "from_timm": ".convert",
    "optimize": ".convert",
    "load_model": ".loading",
    "VisionTransformer": ".model",
    "apply_vit_fast": ".patching",
    "remove_vit_fast": ".patching",
    "explain": ".explanation",
    "CUDAGraphRunner": ".graphs",
    # ``with vit_fast.tuning(): ...`` tunes the kernel shapes first seen in the block
    "tuning": ".kernels._common",
}

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
    "explain",
    "CUDAGraphRunner",
    "tuning",
    "__version__",
]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports on first use
    from .checkpoints import load_checkpoint, save_checkpoint
    from .config import PRESETS, ViTConfig
    from .convert import from_hf, from_timm, optimize
    from .explanation import explain
    from .graphs import CUDAGraphRunner
    from .kernels._common import tuning
    from .loading import load_model
    from .model import VisionTransformer
    from .patching import apply_vit_fast, remove_vit_fast


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
        globals()[name] = value  # looked up once
        return value
    if not name.startswith("__"):  # ``import vit_fast; vit_fast.export.to_onnx(...)``: a submodule on first use
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module 'vit_fast' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
