"""Export to ONNX and TensorRT, installed as ``vit_fast.export``: ``to_onnx`` (timm's NaFlexVit and transformers'
Siglip2VisionModel too), ``to_tensorrt``, ``open_artifact`` (the one runner for an artifact) and ``verify`` (judged
against eager PyTorch); with ``verify=`` an artifact is published only once it passed (docs/deploy.md). onnx,
onnxruntime and tensorrt are imported only when those run; the modules: docs/development.md, "Inside export/"."""

from __future__ import annotations

from ._common import (
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
from .graph import LAYOUTS, OUTPUTS
from .onnx import FusedAttention, onnx_op_counts, to_onnx
from .runners import open_artifact
from .tensorrt import to_tensorrt
from .verify import VerificationError, VerifyOptions, VerifyReport, VerifyRow, format_verification, verify
from .verify_native import verify_native

__all__ = [
    "LAYOUTS",
    "OUTPUTS",
    "ArtifactError",
    "ExportError",
    "FusedAttention",
    "VerificationError",
    "VerifyOptions",
    "VerifyReport",
    "VerifyRow",
    "check_artifact_outputs",
    "check_report_path",
    "format_verification",
    "is_vit_fast_artifact",
    "metadata_batch",
    "onnx_op_counts",
    "open_artifact",
    "plain_model",
    "read_metadata",
    "to_onnx",
    "to_tensorrt",
    "verify",
    "verify_native",
    "weights_record",
]
