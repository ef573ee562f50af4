"""vit-fast: Vision Transformers on fast Triton kernels, with verified export and honest benchmarks.

Every public name is imported on first use (PEP 562), so ``import vit_fast`` and the command line's
``--help`` / ``--version`` do not import torch; ``vit_fast.VisionTransformer`` and
``from vit_fast import load_model`` import what they need then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_names
from .version import __version__

#: submodule -> the public names it defines, each imported from there on first use; any other name that is a
#: submodule (``vit_fast.export``) is that submodule, imported then
_public, __getattr__, __dir__ = lazy_names(
    __name__,
    {
        "checkpoints": ("load_checkpoint", "save_checkpoint"),
        "config": ("PRESETS", "ViTConfig"),
        "convert": ("from_hf", "from_timm", "optimize"),
        "loading": ("load_model",),
        "model": ("VisionTransformer",),
        "patching": ("apply_vit_fast", "remove_vit_fast"),
        "explanation": ("explain",),
        "graphs": ("CUDAGraphRunner",),
        "kernels.autotune": ("tuning",),  # ``with vit_fast.tuning(): ...`` tunes the kernel shapes first seen in it
    },
)
__all__ = [*_public, "__version__"]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports on first use
    from .checkpoints import load_checkpoint, save_checkpoint  # noqa: F401 (public through __all__)
    from .config import PRESETS, ViTConfig  # noqa: F401 (public through __all__)
    from .convert import from_hf, from_timm, optimize  # noqa: F401 (public through __all__)
    from .explanation import explain  # noqa: F401 (public through __all__)
    from .graphs import CUDAGraphRunner  # noqa: F401 (public through __all__)
    from .kernels.autotune import tuning  # noqa: F401 (public through __all__)
    from .loading import load_model  # noqa: F401 (public through __all__)
    from .model import VisionTransformer  # noqa: F401 (public through __all__)
    from .patching import apply_vit_fast, remove_vit_fast  # noqa: F401 (public through __all__)
