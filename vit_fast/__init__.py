"""vit-fast: Vision Transformers on fast Triton kernels, with verified export and honest benchmarks.

Every public name is imported on first use (PEP 562), so ``import vit_fast`` and the command line's
``--help`` / ``--version`` do not import torch; ``vit_fast.VisionTransformer`` and
``from vit_fast import load_model`` import what they need then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vit_fast.util.lazy import lazy_names
from vit_fast.util.version import __version__

#: submodule -> the public names it defines, each imported from there on first use; any other name that is a
#: submodule (``vit_fast.export``) is that submodule, imported then
_public, __getattr__, __dir__ = lazy_names(
    __name__,
    {
        "interop.checkpoints": ("load_checkpoint", "save_checkpoint"),
        "model.config": ("PRESETS", "ViTConfig"),
        "interop.convert": ("from_hf", "from_timm", "optimize"),
        "interop.loading": ("load_model",),
        "interop.timm_import": ("import_timm",),
        "model.vit": ("VisionTransformer",),
        "interop.patching": ("apply_vit_fast", "remove_vit_fast"),
        "interop.explanation": ("explain",),
        "interop.image_transform": ("image_transform",),
        "backend.graphs": ("CUDAGraphRunner",),
        "kernels.autotune": ("tuning",),  # ``with vit_fast.tuning(): ...`` tunes the kernel shapes first seen in it
    },
)
__all__ = [*_public, "__version__"]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports on first use
    from vit_fast.backend.graphs import CUDAGraphRunner  # noqa: F401 (public through __all__)
    from vit_fast.interop.checkpoints import load_checkpoint, save_checkpoint  # noqa: F401 (public through __all__)
    from vit_fast.interop.convert import from_hf, from_timm, optimize  # noqa: F401 (public through __all__)
    from vit_fast.interop.explanation import explain  # noqa: F401 (public through __all__)
    from vit_fast.interop.image_transform import image_transform  # noqa: F401 (public through __all__)
    from vit_fast.interop.loading import load_model  # noqa: F401 (public through __all__)
    from vit_fast.interop.patching import apply_vit_fast, remove_vit_fast  # noqa: F401 (public through __all__)
    from vit_fast.interop.timm_import import import_timm  # noqa: F401 (public through __all__)
    from vit_fast.kernels.autotune import tuning  # noqa: F401 (public through __all__)
    from vit_fast.model.config import PRESETS, ViTConfig  # noqa: F401 (public through __all__)
    from vit_fast.model.vit import VisionTransformer  # noqa: F401 (public through __all__)
