"""Export to ONNX and TensorRT, installed as ``vit_fast.export``; every artifact is verified.

``to_onnx`` writes an ONNX file (plus metadata JSON beside it), ``verify`` runs an artifact and
judges it against eager PyTorch, ``to_tensorrt`` builds a TensorRT engine from the ONNX file.
onnx, onnxruntime and tensorrt are imported only when those functions run.
"""

from __future__ import annotations

from ._common import ArtifactError, ExportError, read_metadata
from .onnx import FusedAttention, onnx_op_counts, to_onnx
from .tensorrt import to_tensorrt
from .verify import VerificationError, VerifyReport, VerifyRow, verify

__all__ = [
    "ArtifactError",
    "ExportError",
    "FusedAttention",
    "VerificationError",
    "VerifyReport",
    "VerifyRow",
    "onnx_op_counts",
    "read_metadata",
    "to_onnx",
    "to_tensorrt",
    "verify",
]
