"""Export to ONNX and TensorRT, installed as ``vit_fast.export``: ``to_onnx`` (timm's NaFlexVit and transformers'
Siglip2VisionModel too), ``to_tensorrt``, ``open_artifact`` (the one runner for an artifact) and ``verify`` (judged
against eager PyTorch); with ``verify=`` an artifact is published only once it passed (docs/deploy.md). Names load
on first use, so the formats' table (``formats``) reads without torch; the modules: docs/development.md, "Inside
export/"."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from vit_fast.util.lazy import lazy_names

#: submodule -> the public names it defines, each imported from there on first use
_public, __getattr__, __dir__ = lazy_names(
    __name__,
    {
        "_common": (
            "ArtifactError",
            "ExportError",
            "check_artifact_outputs",
            "check_report_path",
            "is_vit_fast_artifact",
            "metadata_batch",
            "plain_model",
            "read_metadata",
            "weights_record",
        ),
        "graph": ("LAYOUTS", "OUTPUTS"),
        "onnx": ("FusedAttention", "onnx_op_counts", "to_onnx"),
        "runners": ("open_artifact",),
        "tensorrt": ("to_tensorrt",),
        "verify": ("VerificationError", "VerifyOptions", "VerifyReport", "VerifyRow", "format_verification", "verify"),
        "verify_native": ("verify_native",),
    },
)
__all__ = _public
#: public functions named as the submodule that defines them: the package's name is the function
_SHADOWED = ("verify", "verify_native")


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # importing the submodule sets the package's attribute to it; the function keeps the name
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports on first use
    from ._common import (  # noqa: F401 (public through __all__)
        ArtifactError,
        ExportError,
        check_artifact_outputs,
        check_report_path,
        is_vit_fast_artifact,
        metadata_batch,
        plain_model,
        read_metadata,
        weights_record,
    )
    from .graph import LAYOUTS, OUTPUTS  # noqa: F401 (public through __all__)
    from .onnx import FusedAttention, onnx_op_counts, to_onnx  # noqa: F401 (public through __all__)
    from .runners import open_artifact  # noqa: F401 (public through __all__)
    from .tensorrt import to_tensorrt  # noqa: F401 (public through __all__)
    from .verify import (  # noqa: F401 (public through __all__)
        VerificationError,
        VerifyOptions,
        VerifyReport,
        VerifyRow,
        format_verification,
        verify,
    )
    from .verify_native import verify_native  # noqa: F401 (public through __all__)
