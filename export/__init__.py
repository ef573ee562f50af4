"""Export to ONNX and TensorRT, installed as ``vit_fast.export``; every artifact is verified.

``to_onnx`` writes an ONNX file (plus metadata JSON beside it), ``to_tensorrt`` builds a TensorRT
engine from the ONNX file, ``open_artifact`` gives the one runner for an artifact (runners.py) and
``verify`` runs it and judges it against eager PyTorch. onnx, onnxruntime and tensorrt are imported
only when those functions run.

Imports inside the package point one way: _common <- trt_common <- runners <- verify <- tensorrt;
onnx needs only _common.
"""

from __future__ import annotations

from ._common import ArtifactError, ExportError, read_metadata
from .onnx import FusedAttention, onnx_op_counts, to_onnx
from .runners import open_artifact
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
    "open_artifact",
    "read_metadata",
    "to_onnx",
    "to_tensorrt",
    "verify",
]
